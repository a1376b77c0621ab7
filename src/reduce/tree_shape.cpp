// Construction of the fixed reduction tree (see tree_shape.hpp for the shape's definition).
#include "cohort/reduce/tree_shape.hpp"

#include <string>

#include "cohort/core/error.hpp"

namespace cohort::reduce {

TreeShape::TreeShape(std::size_t leaves, std::size_t arity) : leaves_(leaves), arity_(arity) {
  if (leaves == 0 || leaves >= (std::size_t{1} << 31)) {
    throw InputError("reduce tree: leaves: expected 1 .. 2^31-1, found " + std::to_string(leaves));
  }
  if (arity < 2) {
    throw InputError("reduce tree: arity: expected >= 2, found " + std::to_string(arity));
  }
  parent_.assign(leaves, kNoParent);
  child_begin_.assign(leaves + 1, 0);
  std::vector<std::uint32_t> level(leaves);
  for (std::size_t i = 0; i < leaves; ++i) level[i] = static_cast<std::uint32_t>(i);
  while (level.size() > 1) {
    std::vector<std::uint32_t> next;
    for (std::size_t g = 0; g < level.size(); g += arity) {
      const std::size_t end = std::min(level.size(), g + arity);
      if (end - g == 1) {  // a lone trailing node is carried up, not wrapped
        next.push_back(level[g]);
        continue;
      }
      const auto node = static_cast<std::uint32_t>(parent_.size());
      parent_.push_back(kNoParent);
      for (std::size_t c = g; c < end; ++c) {
        parent_[level[c]] = node;
        children_.push_back(level[c]);
      }
      child_begin_.push_back(static_cast<std::uint32_t>(children_.size()));
      next.push_back(node);
    }
    level = std::move(next);
  }
}

}  // namespace cohort::reduce
