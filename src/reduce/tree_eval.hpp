// Private: evaluates the fixed tree over a range of elements on one thread, block by block, with
// block-sized scratch per internal node. The oracle's kernel, and the per-slice work of the
// chunk-owner and parameter-server strategies. Not thread-safe: one evaluator per thread.
#pragma once

#include <array>
#include <cstddef>

#include "cohort/reduce/kernels.hpp"
#include "cohort/reduce/reducer.hpp"
#include "cohort/reduce/tree_shape.hpp"
#include "cohort/tensor/buffer.hpp"

namespace cohort::reduce::detail {

class TreeEvaluator {
 public:
  static constexpr std::size_t kBlock = 1024;  // floats: a node's scratch block stays in L1/L2

  explicit TreeEvaluator(const TreeShape& shape)
      : shape_(&shape), scratch_((shape.node_count() - shape.leaves()) * kBlock) {}

  // out[i] = scale * tree sum of leaves[*][i], for i in [begin, end).
  void evaluate(const float* const* leaves, std::size_t begin, std::size_t end, float* out,
                float scale) {
    const TreeShape& shape = *shape_;
    const std::size_t first = shape.first_internal();
    const std::uint32_t root = shape.root();
    std::array<const float*, kMaxArity> src{};
    for (std::size_t b = begin; b < end; b += kBlock) {
      const std::size_t m = std::min(kBlock, end - b);
      if (shape.is_leaf(root)) {
        src[0] = leaves[0] + b;
        sum_sources(out + b, src.data(), 1, m, scale);
        continue;
      }
      for (std::size_t p = first; p < shape.node_count(); ++p) {
        const auto children = shape.children(static_cast<std::uint32_t>(p));
        for (std::size_t j = 0; j < children.size(); ++j) {
          const std::uint32_t c = children[j];
          src[j] = shape.is_leaf(c) ? leaves[c] + b : scratch_.data() + (c - first) * kBlock;
        }
        const bool is_root = p == root;
        float* dst = is_root ? out + b : scratch_.data() + (p - first) * kBlock;
        sum_sources(dst, src.data(), children.size(), m, is_root ? scale : 1.0f);
      }
    }
  }

 private:
  const TreeShape* shape_;
  AlignedBuffer<float> scratch_;
};

}  // namespace cohort::reduce::detail
