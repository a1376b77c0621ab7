// The fixed reduction tree over L leaves with arity k: the one shape that fixes the order of every
// floating-point addition. The combining tree, the serial reference and the deterministic
// comparison strategies all evaluate this shape, so they agree bit for bit.
// Not a runtime structure: no atomics or buffers here (see reducer.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace cohort::reduce {

// Nodes 0..L-1 are the leaves, in leaf order. Internal nodes follow, level by level. Level 0 is
// the leaves; each level groups consecutive nodes of the level below, k at a time, left to right,
// into one parent whose children are in that order. A trailing group of one node is not wrapped: it
// is carried up to the next level unchanged. The root is the last node (a leaf only when L == 1).
// Example, L = 5, k = 2: level 1 = {0,1}->5, {2,3}->6, 4 carried; level 2 = {5,6}->7, 4 carried;
// level 3 = {7,4}->8 = root. The sum is ((l0+l1)+(l2+l3))+l4.
class TreeShape {
 public:
  static constexpr std::uint32_t kNoParent = UINT32_MAX;

  // Preconditions (InputError otherwise): leaves >= 1, arity >= 2, leaves < 2^31.
  TreeShape(std::size_t leaves, std::size_t arity);

  std::size_t leaves() const { return leaves_; }
  std::size_t arity() const { return arity_; }
  std::size_t node_count() const { return parent_.size(); }
  std::uint32_t root() const { return static_cast<std::uint32_t>(parent_.size() - 1); }
  bool is_leaf(std::uint32_t node) const { return node < leaves_; }
  std::uint32_t parent(std::uint32_t node) const { return parent_[node]; }
  // Children of an internal node, left to right (2..arity of them).
  std::span<const std::uint32_t> children(std::uint32_t node) const {
    return {children_.data() + child_begin_[node], child_begin_[node + 1] - child_begin_[node]};
  }
  // Internal nodes in an order where every child precedes its parent (the construction order).
  std::size_t first_internal() const { return leaves_; }

 private:
  std::size_t leaves_;
  std::size_t arity_;
  std::vector<std::uint32_t> parent_;       // per node
  std::vector<std::uint32_t> child_begin_;  // per node + 1, into children_ (empty for leaves)
  std::vector<std::uint32_t> children_;
};

}  // namespace cohort::reduce
