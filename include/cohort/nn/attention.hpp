// Causal self-attention's softmax gradient as one loop of cohort's own. oneDNN 2.6.3's
// softmax_backward has a jit kernel on AVX-512 only; on AVX2 CPUs it runs its reference one
// (ref:any), which the benchmarks page measures at a tenth of a language model's leaf. This loop
// also skips each row's masked entries and writes bf16 directly where the next matmul reads bf16.
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
