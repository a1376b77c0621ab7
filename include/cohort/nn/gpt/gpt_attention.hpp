// Causal self-attention of bf16 heads as one kernel of cohort's own, window by window, head by
// head and 16 queries at a time: the scores, the causal softmax and the weighted values forward;
// the scores and softmax again, then the five products and the softmax's backward backward. A
// head's operands (tens of KB) stay in the core's caches between the products and no (T, T)
// matrix goes to memory, where oneDNN 2.6.3's batched matmuls run each product as a call of its
// own over the whole leaf, between passes of the softmax over the leaf's (N, H, T, T) scores
// (docs/decisions.md, "Attention as cohort's kernel"). The products run on AMX's tiles or, on
// CPUs without AMX, on AVX-512's BF16 dot products (AttentionEngine).
//
// The layouts are a language model's (GptPlanBuilder): qkv (N T, 3C) bf16, row-major, with q, k
// and v of head h at columns h hs, C + h hs and 2C + h hs; y and dy (N T, C) bf16 with head h's
// at columns h hs; the dropout mask (N, H, T, T), row-major, of which row i's first i + 1 entries
// are read (nn/dropout.hpp's causal_dropout_mask). The products accumulate in f32 (TDPBF16PS or
// VDPBF16PS: the two engines sum in different orders, so their bits differ) and are rounded to
// bf16 (to nearest even) where they are written in bf16.
#pragma once

#include <cstdint>
#include <optional>

#include "cohort/tensor/bf16.hpp"

namespace cohort::nn {

struct AttentionShape {
  std::int64_t N;   // windows
  std::int64_t T;   // positions a window (the block)
  std::int64_t H;   // heads
  std::int64_t hs;  // head size: C = H hs
};

// What computes the kernel's products.
enum class AttentionEngine {
  kAmx,         // AMX's tiles (TDPBF16PS), 16 by 16 sums an instruction
  kAvx512Bf16,  // AVX-512's BF16 dot products (VDPBF16PS), 16 sums an instruction
};
const char* attention_engine_name(AttentionEngine engine);  // "amx", "avx512_bf16"

// Whether this process can run the kernel with `engine` on heads of this shape: a GCC build
// (clang builds do not carry it: gpt_attention.cpp), the CPU has AVX-512 with BF16, and for kAmx
// AMX-BF16 which the OS lets the process use (Linux's ARCH_REQ_XCOMP_PERM, asked once), and T and
// hs are multiples of 32 with T <= 1024 and hs <= 256.
bool attention_kernel_usable(AttentionEngine engine, std::int64_t T, std::int64_t hs);
// The engine plans use: AMX where usable, else AVX-512's; none where neither is.
std::optional<AttentionEngine> attention_kernel_engine(std::int64_t T, std::int64_t hs);

// Forward: for each window and head, with s = q k^T, p = the causal softmax of scale s (each
// row's top = scale max_j s[j] and 1 / sum_j exp(scale s[j] - top) over j <= i, the sum in 16
// lanes in two chains, added pairwise), used = p times `mask` (dropout's; p where null) rounded
// to bf16, and y = used v. Nothing of size T x T is written: `stats` (N, H, T, 2) keeps each
// row's top and 1 / sum for backward. Only where attention_kernel_usable(engine, T, hs).
void attention_kernel_forward(AttentionEngine engine, const bf16* qkv, const float* mask,
                              float* stats, bf16* y, const AttentionShape& shape, float scale);

// Backward, from dy (the gradient of y), the forward's stats and the same mask: p and used again
// (the same bits: the same loops from the same top and 1 / sum), then
//   dused = dy v^T, ds = scale p (d - sum_k p d) with d = dused mask, rounded to bf16,
//   dq = ds k, dk = ds^T q, dv = used^T dy,
// written into dqkv (every column of every row written). The forward's engine.
void attention_kernel_backward(AttentionEngine engine, const bf16* qkv, const float* stats,
                               const float* mask, const bf16* dy, bf16* dqkv,
                               const AttentionShape& shape, float scale);

class GptModel;
enum class Precision;

// The engine with which a model's plans in this precision run attention as this kernel
// (GptPlanBuilder: bf16 where attention_kernel_engine has one; GptPaths can ask for the other
// ways), or none.
std::optional<AttentionEngine> gpt_attention_kernel(const GptModel& model, Precision precision);
// The seconds oneDNN's matmuls take for the attention products of a leaf of N windows (the six
// of each layer, as the plans run them where the kernel does not: bf16 on dense (N, H, T, hs)
// views, the scores f32), timed on this thread, best of five calls after a warm one: the step's
// roofline counts attention's products at oneDNN's rate even where this kernel computes them.
double gpt_attention_onednn_seconds(const GptModel& model, std::int64_t N);

}  // namespace cohort::nn
