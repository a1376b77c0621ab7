// A language model's loop that is cohort's own rather than oneDNN 2.6.3's: the causal softmax's
// backward. oneDNN's softmax_backward has a jit kernel on AVX-512 only and runs its reference one
// (ref:any) on AVX2 CPUs; this loop also skips each row's masked entries and writes bf16 directly
// where the next matmul reads bf16. docs/benchmarks.md ("Language models on AVX2") has what it
// changes.
#pragma once

#include <cstdint>

#include "cohort/tensor/bf16.hpp"

namespace cohort::nn {

// For `mats` row-major (T, T) matrices of a causal softmax: p its output (row i has its i + 1
// first entries unmasked, the rest 0), dp the output's gradient. Writes the input's gradient
//   ds[i][j] = p[i][j] * (dp[i][j] - sum_{k <= i} p[i][k] * dp[i][k])   for j <= i,
//   ds[i][j] = 0                                                         for j > i,
// the sum taken in eight interleaved partial sums (k mod 8) added pairwise, then the remainder:
// a fixed order, the same bits at any vector width. The bf16 form rounds the f32 result.
void causal_softmax_backward(const float* p, const float* dp, float* ds, std::int64_t mats,
                             std::int64_t T);
void causal_softmax_backward(const float* p, const float* dp, bf16* ds, std::int64_t mats,
                             std::int64_t T);

}  // namespace cohort::nn
