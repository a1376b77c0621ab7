// Max pooling with windows that tile the image (kernel == stride, no padding) on layouts whose
// channels are innermost — nhwc, or channels in blocks of 8/16/32 (nChw16c) — in f32 or bf16.
// A Net runs it instead of oneDNN 2.6's pooling where it applies: oneDNN's jit max pooling runs
// the `cnn` preset's first pooling at several times its memory floor, a large share of the
// preset's leaf (docs/decisions.md, "Max pooling on cohort's kernel", and its command).
// Forward writes, per output element, the window's maximum and where it came from (kh * K + kw,
// the first maximal element in row-major window order, as oneDNN and PyTorch route the
// gradient); a NaN in a window is its maximum, so a fault is never pooled away. Backward routes
// each output gradient to that element and writes zero everywhere else, including rows and
// columns no window covers. Bits: the maximum is one of the inputs, so both precisions are exact.
// With `relu` the output is max(y, 0) (a NaN stays NaN; +0 for y <= 0) in the same pass — a ReLU
// after the pooling, which a Net runs there instead of before it — and backward routes only the
// gradients whose output was above 0 (or NaN): ReLU's backward on its output, fused too.
#pragma once

#include <cstdint>

#include "cohort/tensor/bf16.hpp"

namespace cohort::nn {

// Where element (n, c, h, w) lives, in elements:
//   n * n_stride + (c / lanes) * group_stride + h * h_stride + w * w_stride + c % lanes.
// nhwc: lanes = C (one group); nChw16c: lanes = 16.
struct PoolLayout {
  std::int64_t lanes, n_stride, group_stride, h_stride, w_stride;
};

struct MaxPoolShape {
  std::int64_t N, C, IH, IW, K;  // OH = IH / K, OW = IW / K; 1 <= K <= 15 (the index is a byte)
  PoolLayout src, dst;           // the same lanes; the workspace is laid out as dst
  bool relu = false;             // ReLU on the output, fused (K <= 11: bit 7 of the index marks
                                 // a window whose output ReLU zeroed, so no gradient reaches it)
  std::int64_t OH() const { return IH / K; }
  std::int64_t OW() const { return IW / K; }
};

// The kernels' instruction set: kAuto picks AVX-512 where the CPU has it (cohort/core/cpu.hpp),
// else the build's baseline. Every choice computes the same bits; the others exist for tests.
enum class PoolIsa { kAuto, kPortable, kAvx512 };
bool max_pool_isa_available(PoolIsa isa);

// Whether the kernels take this shape: C a multiple of the lanes, K in range (K * K <= 128 with
// relu), windows inside.
bool max_pool_supported(const MaxPoolShape& s);

// dst (N, C, OH, OW) = max over each window of src (N, C, IH, IW) (then ReLU, with s.relu);
// `where` (laid out as dst, one byte an element) the window index of each maximum (| 0x80 where
// ReLU zeroed the output), or null (inference).
void max_pool_forward(const MaxPoolShape& s, const float* src, float* dst, std::uint8_t* where,
                      PoolIsa isa = PoolIsa::kAuto);
void max_pool_forward(const MaxPoolShape& s, const bf16* src, bf16* dst, std::uint8_t* where,
                      PoolIsa isa = PoolIsa::kAuto);

// diff_src (N, C, IH, IW) from diff_dst (N, C, OH, OW) and the forward's `where`.
void max_pool_backward(const MaxPoolShape& s, const std::uint8_t* where, const float* diff_dst,
                       float* diff_src, PoolIsa isa = PoolIsa::kAuto);
void max_pool_backward(const MaxPoolShape& s, const std::uint8_t* where, const bf16* diff_dst,
                       bf16* diff_src, PoolIsa isa = PoolIsa::kAuto);

}  // namespace cohort::nn
