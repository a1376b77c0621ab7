// A language model's loops that are cohort's own rather than oneDNN 2.6.3's primitives:
// - the causal softmax's backward: oneDNN's softmax_backward has a jit kernel on AVX-512 only and
//   runs its reference one (ref:any) on AVX2 CPUs; this loop also skips each row's masked entries
//   and writes bf16 directly where the next matmul reads bf16;
// - the causal softmax's forward: it reads only the entries the causal mask keeps and writes 0
//   above the diagonal, where oneDNN's softmax needs the masked scores set to -inf first and then
//   runs over whole rows;
// - both take attention's 1/sqrt(head size) scale, which the matmuls around them would otherwise
//   apply as output scales: oneDNN 2.6.3's bf16 gemm-based matmul runs several times slower with
//   them (docs/decisions.md, "Attention's scale in the softmax");
// - GELU and its slope in one sweep, f32 and bf16: the slope, kept for backward, makes backward
//   one product; oneDNN's eltwise backward evaluates erf and exp again from the pre-activation;
// - a linear layer's bias gradient, a column sum that oneDNN's inner product gives only with
//   its own backward-weights, which the weight gradients' other kernels replace;
// - LayerNorm in bf16 plans: oneDNN 2.6.3's takes one data type for source and destination (f32
//   here, the residual stream's), so a reorder followed it forward and preceded it backward, and
//   its backward ran its generic kernel (simple_layer_normalization); this one writes bf16, reads
//   bf16 gradients and adds its input gradient into the stream's. f32 plans keep oneDNN's (docs/
//   decisions.md, "LayerNorm in bf16 as cohort's loop"); the f32 forms are the same loops.
// docs/decisions.md ("A language model's own loops") has what they change.
#pragma once

#include <cstdint>

#include "cohort/tensor/bf16.hpp"

namespace cohort::nn {

// For `mats` row-major (T, T) matrices of a causal softmax of scaled scores, softmax(scale s):
// p its output (row i has its i + 1 first entries unmasked, the rest 0), dp the gradient of the
// weights the next matmul read, those weights p times `mask` (dropout's) unless it is null, so
// that with d = dp mask (or dp) the gradient of the unscaled scores s is
//   ds[i][j] = scale * (p[i][j] * (d[i][j] - sum_{k <= i} p[i][k] * d[i][k]))   for j <= i,
//   ds[i][j] = 0                                                                 for j > i,
// the sum taken in eight interleaved partial sums (k mod 8) added pairwise, then the remainder:
// a fixed order, the same bits at any vector width. The bf16 form rounds the f32 result. Only
// the entries j <= i of dp and the mask are read.
void causal_softmax_backward(const float* p, const float* dp, const float* mask, float* ds,
                             std::int64_t mats, std::int64_t T, float scale);
void causal_softmax_backward(const float* p, const float* dp, const float* mask, bf16* ds,
                             std::int64_t mats, std::int64_t T, float scale);

// For `mats` row-major (T, T) matrices of scores s: p = softmax of each row i of scale s (scale >
// 0) over its i + 1 first entries (the rest of s is not read), 0 after them. The exponent's
// argument is scale s - scale max(s), where the compiler may fuse the product and the difference
// into one rounding (so the largest entry's may be a rounding residual above 0); the sum of the
// exponentials is taken in eight interleaved partial sums as above.
void causal_softmax_forward(const float* s, float* p, std::int64_t mats, std::int64_t T,
                            float scale);
// The same, also writing the weights the next matmul reads: used = p, times `mask` (dropout's)
// unless null, in f32 or rounded to bf16; 0 where masked by causality. Only the entries j <= i of
// the mask are read.
void causal_softmax_forward(const float* s, float* p, const float* mask, float* used,
                            std::int64_t mats, std::int64_t T, float scale);
void causal_softmax_forward(const float* s, float* p, const float* mask, bf16* used,
                            std::int64_t mats, std::int64_t T, float scale);

// GELU's two forms: the exact one, f Phi(f) (nanoGPT's nn.GELU()), and GPT-2's tanh
// approximation ("gelu_new"), f sigmoid(2u) = f (1 + tanh u) / 2 with
// u = sqrt(2 / pi) (f + 0.044715 f^3).
enum class Gelu { kErf, kTanh };

// g = GELU(f) for n values, and, unless `slope` is null, slope = GELU'(f). The erf form: Phi by
// Abramowitz and Stegun 7.1.26 (erf to 1.5e-7, as oneDNN's gelu_erf), slope Phi(f) + f phi(f),
// the exponential shared by Phi and phi. The tanh form: with e = exp(-2|u|) and s = sigmoid(2u)
// (1 / (1 + e) for u >= 0, e / (1 + e) below), g = f s and slope
// s + 2 f s (1 - s) sqrt(2 / pi) (1 + 3 0.044715 f^2), s (1 - s) = e / (1 + e)^2.
void gelu_forward(const float* f, float* g, float* slope, std::int64_t n, Gelu form = Gelu::kErf);
// df = dg * slope, element for element.
void gelu_backward(const float* dg, const float* slope, float* df, std::int64_t n);
// The same in bf16: g and the slope the f32 form's values at f rounded; df the f32 product of dg
// and slope rounded. oneDNN 2.6.3's bf16 gelu_erf backward evaluates erf and exp again. The
// forward looks g and the slope up in a table of the f32 form's results at each of the 65,536
// bf16 values (256 KB a form, built on first use), gathered 16 at a time where the CPU has
// AVX-512, 8 at a time where the build targets AVX2 (the default build does), else one by one
// (`how`: kAuto takes the first of those this process can run; the others are for tests, where
// gelu_lookup_available). bf16 plans run where oneDNN has bf16 kernels, all of which have
// AVX-512, so the 8-wide gathers run in tests only. docs/decisions.md, "The bf16 GELU by table".
enum class GeluLookup { kAuto, kScalar, kGather8, kGather16 };
bool gelu_lookup_available(GeluLookup how);
void gelu_forward(const bf16* f, bf16* g, bf16* slope, std::int64_t n, Gelu form = Gelu::kErf,
                  GeluLookup how = GeluLookup::kAuto);
void gelu_backward(const bf16* dg, const bf16* slope, bf16* df, std::int64_t n);

// LayerNorm over `rows` rows of C floats, with a bias (nanoGPT's bias=True) unless `beta` is
// null:
//   y = (x - mean) rstd gamma [+ beta],  rstd = 1 / sqrt(var + eps)   (var: the biased variance,
//   as PyTorch's)
// written in f32 or bf16 (rounded), mean and rstd kept per row for backward. The row's sums in
// eight interleaved partial sums as the softmax's; the mean first, then the squared deviations.
void layer_norm_forward(const float* x, const float* gamma, const float* beta, float* y,
                        float* mean, float* rstd, std::int64_t rows, std::int64_t C, float eps);
void layer_norm_forward(const float* x, const float* gamma, const float* beta, bf16* y, float* mean,
                        float* rstd, std::int64_t rows, std::int64_t C, float eps);
// Its backward from dy (f32 or bf16): with xhat = (x - mean) rstd and g = dy gamma,
//   dx = rstd (g - mean_j(g) - xhat mean_j(g xhat)),   written, or added to dx (`accumulate`),
//   dgamma[j] = sum over the rows of dy xhat   (overwritten; summed in row order),
//   dbeta[j] = sum over the rows of dy         (overwritten, unless dbeta is null; row order).
void layer_norm_backward(const float* x, const float* gamma, const float* mean, const float* rstd,
                         const float* dy, float* dx, bool accumulate, float* dgamma, float* dbeta,
                         std::int64_t rows, std::int64_t C);
void layer_norm_backward(const float* x, const float* gamma, const float* mean, const float* rstd,
                         const bf16* dy, float* dx, bool accumulate, float* dgamma, float* dbeta,
                         std::int64_t rows, std::int64_t C);

// A linear layer's bias gradient: db[o] = sum over the `rows` rows of dy (rows, O), in row order
// (the same bits at any vector width), overwritten.
void bias_backward(const float* dy, float* db, std::int64_t rows, std::int64_t O);
void bias_backward(const bf16* dy, float* db, std::int64_t rows, std::int64_t O);

// The head's softmax cross-entropy over the vocabulary, fused with its gradient: for `rows` rows
// of `logits` (`stride` apart, their first `vocab` columns read) and labels y in [0, vocab),
// returns the sum over rows, in float64, of log(sum_c exp(z_c - m)) - (z_y - m), m the row's
// largest logit; with `diff` not null (it may be `logits` itself), diff = scale (softmax(z) -
// onehot(y)) rounded as ((e_c / sum) scale) and fma(e_y, 1 / sum, -1) scale, with e_c the
// exponentials, and its columns [vocab, stride) set to 0. The exponentials by the softmax's
// polynomial (within 2 ulp of exp), their sum in eight interleaved partial sums added pairwise,
// then the columns past the last whole eight in order: the same bits at any vector width. The
// generic softmax_cross_entropy (nn/loss.hpp) takes one std::exp a column (docs/decisions.md,
// "The head's cross-entropy in lanes").
double token_cross_entropy(const float* logits, const std::int32_t* labels, std::int64_t rows,
                           std::int64_t vocab, std::int64_t stride, float scale, float* diff);

}  // namespace cohort::nn
