// Causal self-attention of bf16 heads as one kernel of cohort's own on AMX tiles, window by
// window and head by head: the scores, the causal softmax and the weighted values forward; the
// five products and the softmax's backward backward. Each head's operands (a few tens of KB)
// stay in the core's caches between the products, where oneDNN 2.6.3's batched matmuls on the
// same shapes ran each product as a call of its own over the whole leaf at 84-140 GFLOP/s in
// training (docs/decisions.md, "Attention as cohort's AMX kernel").
//
// The layouts are a language model's (GptPlanBuilder): qkv (N T, 3C) bf16, row-major, with q, k
// and v of head h at columns h hs, C + h hs and 2C + h hs; y and dy (N T, C) bf16 with head h's
// at columns h hs; p, used and the dropout mask (N, H, T, T), row-major, as the causal softmax
// (gpt_kernels.hpp) writes and reads them. The products accumulate in f32 (AMX's TDPBF16PS) and
// are rounded to bf16 where they are written in bf16.
#pragma once

#include <cstdint>

#include "cohort/tensor/bf16.hpp"

namespace cohort::nn {

struct AttentionShape {
  std::int64_t N;   // windows
  std::int64_t T;   // positions a window (the block)
  std::int64_t H;   // heads
  std::int64_t hs;  // head size: C = H hs
};

// Whether this process can run the kernel on heads of this shape: the CPU has AMX-BF16 (and
// AVX-512 with BF16), the OS lets the process use the tiles (Linux's ARCH_REQ_XCOMP_PERM, asked
// once), and T and hs are multiples of 32 with T <= 1024 and hs <= 256.
bool amx_attention_usable(std::int64_t T, std::int64_t hs);

// Forward: for each window and head, s = q k^T, then causal_softmax_forward(s, p, mask, used,
// scale) (p f32, used bf16: p times the mask, or p where mask is null), then y = used v.
// Only where amx_attention_usable(T, hs).
void amx_attention_forward(const bf16* qkv, const float* mask, float* p, bf16* used, bf16* y,
                           const AttentionShape& shape, float scale);

// Backward, from dy (the gradient of y), p and used as the forward wrote them and the same mask:
//   dused = dy v^T, ds = causal_softmax_backward(p, dused, mask, scale) rounded to bf16,
//   dq = ds k, dk = ds^T q, dv = used^T dy,
// written into dqkv (every column of every row written).
void amx_attention_backward(const bf16* qkv, const float* p, const bf16* used, const float* mask,
                            const bf16* dy, bf16* dqkv, const AttentionShape& shape, float scale);

}  // namespace cohort::nn
