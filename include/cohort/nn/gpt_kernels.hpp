// A language model's loops that are cohort's own rather than oneDNN 2.6.3's primitives:
// - the causal softmax's backward: oneDNN's softmax_backward has a jit kernel on AVX-512 only and
//   runs its reference one (ref:any) on AVX2 CPUs; this loop also skips each row's masked entries
//   and writes bf16 directly where the next matmul reads bf16;
// - the causal softmax's forward: it reads only the entries the causal mask keeps and writes 0
//   above the diagonal, where oneDNN's softmax needs the masked scores set to -inf first and then
//   runs over whole rows;
// - GELU and its slope in one sweep: the slope, kept for backward, makes backward one product;
//   oneDNN's eltwise backward evaluates erf and exp again from the pre-activation.
// - causal attention's six products in f32: oneDNN 2.6's batched matmul computes each (T, T)
//   product whole, the half the mask discards included, and ran at 36-44 GFLOP/s on the CPU
//   recipe's heads (64 x 64 x 32) on AVX2; these walk the causal triangle only.
// docs/decisions.md ("A language model's own loops") has what they change.
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

// For `mats` row-major (T, T) matrices of scores s: p = softmax of each row i over its i + 1
// first entries (the rest of s is not read), 0 after them. The row's largest score is
// subtracted; the sum of the exponentials is taken in eight interleaved partial sums as above.
void causal_softmax_forward(const float* s, float* p, std::int64_t mats, std::int64_t T);

// g = GELU(f) = f Phi(f) (the erf form, nanoGPT's nn.GELU()) for n values, and, unless `slope`
// is null, slope = GELU'(f) = Phi(f) + f phi(f). Phi by Abramowitz and Stegun 7.1.26 (erf to
// 1.5e-7, as oneDNN's gelu_erf), the exponential shared by Phi and phi.
void gelu_forward(const float* f, float* g, float* slope, std::int64_t n);
// df = dg * slope, element for element.
void gelu_backward(const float* dg, const float* slope, float* df, std::int64_t n);

// Causal attention of N windows of T positions and H heads of hs dimensions, in the layouts of
// a language model's plan: qkv (N, T, 3C) rows, C = H hs, with head h's query, key and value at
// columns h hs, C + h hs and 2C + h hs; y and dy (N, T, C) with head h at columns h hs; scores,
// weights and their gradients (N, H, T, T), row-major. Each entry is a sum over positions in
// ascending order (the same bits for any worker count). Where a (T, T) result is written, only
// the entries on and below the diagonal are defined (columns go in chunks of 8: some above it
// are written too); where one is read, only those are read. Needs attention_kernels_fit.
struct AttentionShape {
  std::int64_t N = 0, H = 0, T = 0, hs = 0;
  std::int64_t C() const { return H * hs; }
};
bool attention_kernels_fit(std::int64_t T, std::int64_t hs);  // T and hs multiples of 8
// S = scale Q K^T.
void attention_scores(const float* qkv, float* s, const AttentionShape& a, float scale);
// Y = P V, P the attention weights (0 above the diagonal, not read).
void attention_values(const float* p, const float* qkv, float* y, const AttentionShape& a);
// dP = dY V^T.
void attention_grad_weights(const float* dy, const float* qkv, float* dp, const AttentionShape& a);
// dV = P^T dY, into dqkv's value columns.
void attention_grad_values(const float* p, const float* dy, float* dqkv, const AttentionShape& a);
// dQ = scale dS K and dK = scale dS^T Q, into dqkv's query and key columns.
void attention_grad_queries_keys(const float* ds, const float* qkv, float* dqkv,
                                 const AttentionShape& a, float scale);

}  // namespace cohort::nn
