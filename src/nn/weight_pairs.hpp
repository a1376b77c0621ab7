// Private to src/nn: a linear layer's bf16 weights, stored (IC, OC) (a layer list's) or (OC, IC)
// (a language model's), written into the pair-blocked layouts oneDNN 2.6 chooses for bf16 inner
// products (AB<k>b<n>a2b: blocks of n output columns by 2k input rows, each output column's two
// consecutive input rows adjacent), for the plans' weight copies (PlanBuilderBase::weight_copy,
// WeightCopies). oneDNN's own reorder writes only a whole weight and is slower; this loop is one
// pass of loads and stores over any range of the stored weight, so the trainer's root can write
// each chunk's part right after it wrote the chunk (WeightCopies::refresh; docs/decisions.md,
// "Plain vs blocked layouts").
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>

#include "cohort/tensor/bf16.hpp"

namespace cohort::nn::detail {

// Where a pair-blocked (O, I) weight's elements go, in elements of the destination: the block of
// output columns [a * a_block, ...) and input rows [b * b_block, ...) starts at a * stride_a +
// b * stride_b; inside it, input row pair p (rows 2p, 2p + 1 of the block) starts at
// p * 2 * a_block, and output column o's pair at 2 * o. The padded dimensions are multiples of
// the blocks; padding is written as zeros. The source holds (I, O) rows, or (O, I) rows where
// `rows_of_outputs`.
struct PairBlocks {
  std::int64_t O = 0, I = 0;
  std::int64_t a_block = 0, b_block = 0;
  std::int64_t stride_a = 0, stride_b = 0;
  std::int64_t padded_O = 0, padded_I = 0;
  bool rows_of_outputs = false;
};

// The blocks where `from` is a plain bf16 (O, I) weight (format `ba`, stored (I, O), or `ab`) and
// `to` a bf16 pair-blocked layout of the same dims; none otherwise (oneDNN's reorder then).
std::optional<PairBlocks> pair_blocks(const dnnl::memory::desc& from, const dnnl::memory::desc& to);

// `to` (to's get_size() bytes) = `from` in the layout `b`, padding included.
void to_pair_blocks(const PairBlocks& b, const bf16* from, bf16* to);

// Elements [begin, end) of `from` (counted in its stored order) into their places in `to`, which
// holds the whole weight in layout `b`, its padding written before (by the call above); nothing
// else of `to` is written, not even the other half of a pair cut by the range's ends, so calls on
// disjoint ranges may run at once (the trainer's root, chunk by chunk: WeightCopies::refresh).
void to_pair_blocks(const PairBlocks& b, const bf16* from, bf16* to, std::size_t begin,
                    std::size_t end);

}  // namespace cohort::nn::detail
