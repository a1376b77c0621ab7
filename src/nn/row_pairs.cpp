// Batch weight gradients of bf16 linear layers on cohort's own AVX512_BF16 kernel; see
// include/cohort/nn/batch_grad.hpp ("Row pairs").
//
// dW (IC, OC) = X^T dY with K = the batch's rows. vdpbf16ps multiplies pairs of bf16 values and
// adds both products to one f32 lane, so the kernel wants each operand's K pairs adjacent: dY is
// kept by the replicas in row pairs ([r / 2][o][r % 2]), and a tile's 12 columns of X are packed
// here, per tile, into the same form (one 32-bit pair per (k, i), broadcast to 16 lanes). A tile
// is 12 rows of dW by 32 columns: 24 zmm accumulators, 2 loads of dY and 12 broadcasts per 24
// dot products. Each element's sum runs over k in order, in one lane, so the result depends only
// on the inputs: not on the range asked for, the thread or the addresses.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "cohort/core/cpu.hpp"
#include "cohort/core/error.hpp"
#include "cohort/nn/batch_grad.hpp"
#include "cohort/nn/version.hpp"

// The kernel is compiled for AVX512_BF16 in every x86-64 build (cohort/core/cpu.hpp) and runs
// where row_pair_kernel() says the CPU has it and root_bf16_gemm() chooses it; elsewhere the
// callers use oneDNN's GEMM.
#if defined(COHORT_X86_DISPATCH)
#include <immintrin.h>
#define COHORT_PAIR_KERNEL 1
#endif

namespace cohort::nn {

namespace {

#ifdef COHORT_PAIR_KERNEL
COHORT_TARGET_AVX512_BF16_BEGIN
namespace avx512_bf16 {
constexpr int kTileRows = static_cast<int>(kPairTileRows);

// c[m][0, 32) (masked by m0, m1) = sum over k < k2 of a[k][m] . b[k][0, 32): a is the packed
// tile ([k][kTileRows] pairs), b the row pairs of dY from the tile's first column (ldb pairs a k).
// Meanwhile the lines pf[0, npf) (npf <= k2) are prefetched for writing, spread evenly over the k
// steps: issued in a burst, they held the core's miss buffers that the loads of dY need (the
// tiles' GEMMs slowed by as much as the optimizer gained).
template <int MR>
void tile(const std::uint32_t* __restrict a, const std::uint32_t* __restrict b, std::size_t ldb,
          std::size_t k2, float* __restrict c, std::size_t ldc, __mmask16 m0, __mmask16 m1,
          const char* const* pf, std::size_t npf) {
  __m512 acc[MR][2];
#pragma GCC unroll 16
  for (int m = 0; m < MR; ++m) acc[m][0] = acc[m][1] = _mm512_setzero_ps();
  const std::size_t every = npf ? std::max<std::size_t>(1, k2 / npf) : k2;
  std::size_t next = 0, issued = 0;
  for (std::size_t k = 0; k < k2; ++k) {
    if (k == next && issued < npf) {
      __builtin_prefetch(pf[issued], 1, 3);  // prefetchw: the consumer writes these lines
      ++issued;
      next += every;
    }
    const auto b0 = reinterpret_cast<__m512bh>(_mm512_maskz_loadu_epi32(m0, b + k * ldb));
    const auto b1 = reinterpret_cast<__m512bh>(_mm512_maskz_loadu_epi32(m1, b + k * ldb + 16));
#pragma GCC unroll 16
    for (int m = 0; m < MR; ++m) {
      const auto x = reinterpret_cast<__m512bh>(
          _mm512_set1_epi32(static_cast<int>(a[k * kTileRows + static_cast<std::size_t>(m)])));
      acc[m][0] = _mm512_dpbf16_ps(acc[m][0], x, b0);
      acc[m][1] = _mm512_dpbf16_ps(acc[m][1], x, b1);
    }
  }
#pragma GCC unroll 16
  for (int m = 0; m < MR; ++m) {
    _mm512_mask_storeu_ps(c + static_cast<std::size_t>(m) * ldc, m0, acc[m][0]);
    _mm512_mask_storeu_ps(c + static_cast<std::size_t>(m) * ldc + 16, m1, acc[m][1]);
  }
}

using TileFn = void (*)(const std::uint32_t*, const std::uint32_t*, std::size_t, std::size_t,
                        float*, std::size_t, __mmask16, __mmask16, const char* const*, std::size_t);
constexpr TileFn kTiles[kTileRows + 1] = {nullptr,  tile<1>,  tile<2>, tile<3>, tile<4>,
                                          tile<5>,  tile<6>,  tile<7>, tile<8>, tile<9>,
                                          tile<10>, tile<11>, tile<12>};

__mmask16 lanes(std::int64_t n) {
  return n >= 16  ? __mmask16{0xffff}
         : n <= 0 ? __mmask16{0}
                  : static_cast<__mmask16>((1u << n) - 1);
}

// Pairs (a[j], b[j]) for the j in `m` (b null: zeros), as 32-bit lanes; reads only those j.
__m512i interleave(const bf16* a, const bf16* b, __mmask16 m) {
  // The maskz forms: GCC 12 warns that the plain ones' "undefined" pass-through is uninitialized.
  const __m512i lo = _mm512_maskz_cvtepu16_epi32(m, _mm256_maskz_loadu_epi16(m, a));
  if (b == nullptr) return lo;
  const __m512i hi = _mm512_maskz_cvtepu16_epi32(m, _mm256_maskz_loadu_epi16(m, b));
  return _mm512_or_si512(lo, _mm512_maskz_slli_epi32(m, hi, 16));
}

// The cache lines of rows [r0, r1) of every array the consumer touches, in order.
void touched_lines(const RowConsumer& consumer, std::int64_t r0, std::int64_t r1,
                   std::vector<const char*>& lines) {
  lines.clear();
  for (const RowConsumer::Touched& t : consumer.touched) {
    if (t.base == nullptr || r0 >= r1) continue;
    const auto first =
        reinterpret_cast<std::uintptr_t>(t.base) + static_cast<std::uintptr_t>(r0) * t.row_bytes;
    const auto last =
        reinterpret_cast<std::uintptr_t>(t.base) + static_cast<std::uintptr_t>(r1) * t.row_bytes;
    for (std::uintptr_t line = first & ~std::uintptr_t{63}; line < last; line += 64)
      lines.push_back(reinterpret_cast<const char*>(line));
  }
}

// dW rows [i0, i1): each tile of rows written at dw + (t - i0) * OC, or with a consumer into its
// buffer and handed to it (false: it stopped the kernel).
bool weight_grad_pairs(const bf16* x, const bf16* dy_pairs, std::int64_t rows, std::int64_t in,
                       std::int64_t out, std::int64_t i0, std::int64_t i1, float* dw,
                       const RowConsumer* consumer) {
  const auto k2 = static_cast<std::size_t>((rows + 1) / 2);
  thread_local std::vector<std::uint32_t> packed;
  thread_local std::vector<const char*> lines;
  packed.resize(k2 * kTileRows);
  lines.clear();
  const auto* b = reinterpret_cast<const std::uint32_t*>(dy_pairs);
  const auto ldc = static_cast<std::size_t>(out);
  const std::size_t col_tiles = (ldc + 31) / 32;
  for (std::int64_t t = i0; t < i1; t += kTileRows) {
    const auto mr = static_cast<int>(std::min<std::int64_t>(kTileRows, i1 - t));
    // The tile's columns of X as pairs of rows (2k, 2k + 1); an odd last row pairs with zero.
    const __mmask16 cols = lanes(mr);
    for (std::size_t k = 0; k < k2; ++k) {
      const bf16* r0 = x + static_cast<std::int64_t>(2 * k) * in + t;
      const bool odd_end = static_cast<std::int64_t>(2 * k + 1) >= rows;
      _mm512_mask_storeu_epi32(packed.data() + k * kTileRows, cols,
                               interleave(r0, odd_end ? nullptr : r0 + in, cols));
    }
    // The next tile's rows of the consumer's arrays, spread over this tile's column tiles.
    if (consumer != nullptr)
      touched_lines(*consumer, t + kTileRows, std::min<std::int64_t>(t + 2 * kTileRows, i1), lines);
    const std::size_t per = std::min(k2, (lines.size() + col_tiles - 1) / col_tiles);
    float* c = consumer != nullptr ? consumer->buffer : dw + static_cast<std::size_t>(t - i0) * ldc;
    for (std::size_t j = 0; j < col_tiles; ++j) {
      const std::size_t o = 32 * j, p0 = std::min(lines.size(), j * per),
                        p1 = std::min(lines.size(), p0 + per);
      const auto left = static_cast<std::int64_t>(ldc - o);
      kTiles[mr](packed.data(), b + o, ldc, k2, c + o, ldc, lanes(left), lanes(left - 16),
                 lines.data() + p0, p1 - p0);
    }
    if (consumer != nullptr && !consumer->take(t, t + mr, c)) return false;
  }
  return true;
}

void to_row_pairs(const bf16* dy, std::int64_t rows, std::int64_t out, bf16* pairs) {
  for (std::int64_t r = 0; r < rows; r += 2) {
    const bf16* r0 = dy + r * out;
    const bf16* r1 = r + 1 < rows ? r0 + out : nullptr;  // an odd last row pairs with zero
    bf16* p = pairs + r * out;
    for (std::int64_t o = 0; o < out; o += 16) {
      const __mmask16 m = lanes(out - o);
      _mm512_mask_storeu_epi32(p + 2 * o, m, interleave(r0 + o, r1 ? r1 + o : nullptr, m));
    }
  }
}

// 16 lanes (masked) of relu_grad below, as bf16 bits in 32-bit lanes; the values are bf16
// already (dy or a signed zero or NaN), so dropping the low half is exact. (The maskz forms
// throughout: see interleave.)
__m512 widen16(const bf16* p, __mmask16 m) {
  return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(
      m, _mm512_maskz_cvtepu16_epi32(m, _mm256_maskz_loadu_epi16(m, p)), 16));
}
__m512i relu_grad16(const bf16* y, const bf16* dy, __mmask16 m) {
  const __m512 yv = widen16(y, m), d = widen16(dy, m);
  const __mmask16 above = _mm512_cmp_ps_mask(yv, _mm512_setzero_ps(), _CMP_GT_OQ);
  const __m512 z = _mm512_mask_blend_ps(above, _mm512_mul_ps(d, _mm512_setzero_ps()), d);
  return _mm512_maskz_srli_epi32(m, _mm512_castps_si512(z), 16);
}

void relu_backward_to_row_pairs(const bf16* y, bf16* dy, std::int64_t rows, std::int64_t out,
                                bf16* pairs, bool in_place) {
  for (std::int64_t r = 0; r < rows; r += 2) {
    const bool two = r + 1 < rows;  // an odd last row pairs with zero
    const bf16 *y0 = y + r * out, *y1 = y0 + out;
    bf16 *d0 = dy + r * out, *d1 = d0 + out;
    bf16* p = pairs + r * out;
    for (std::int64_t o = 0; o < out; o += 16) {
      const __mmask16 m = lanes(out - o);
      const __m512i z0 = relu_grad16(y0 + o, d0 + o, m);
      const __m512i z1 = two ? relu_grad16(y1 + o, d1 + o, m) : _mm512_setzero_si512();
      if (in_place) {
        _mm256_mask_storeu_epi16(d0 + o, m, _mm512_maskz_cvtepi32_epi16(m, z0));
        if (two) _mm256_mask_storeu_epi16(d1 + o, m, _mm512_maskz_cvtepi32_epi16(m, z1));
      }
      _mm512_mask_storeu_epi32(p + 2 * o, m,
                               _mm512_or_si512(z0, _mm512_maskz_slli_epi32(m, z1, 16)));
    }
  }
}
}  // namespace avx512_bf16
COHORT_TARGET_END
#endif

// dy * [y > 0] as oneDNN's ReLU backward computes it: in f32, dy * 0 where y is not above 0. The
// result is a bf16 value already (dy, a signed zero, or a quiet NaN), so to_bf16 keeps its bits.
float relu_grad(bf16 y, bf16 dy) {
  const float d = to_float(dy);
  return to_float(y) > 0.0f ? d : d * 0.0f;
}

}  // namespace

bool row_pair_kernel() {
#ifdef COHORT_PAIR_KERNEL
  return cpu_features().avx512_bf16_kernels();
#else
  return false;
#endif
}

RootGemm root_bf16_gemm() {
  static const RootGemm choice =
      choose_root_gemm(onednn_isa().find("amx") != std::string::npos, row_pair_kernel());
  return choice;
}

void to_row_pairs(const bf16* dy, std::int64_t rows, std::int64_t out, bf16* pairs) {
#ifdef COHORT_PAIR_KERNEL
  if (row_pair_kernel()) return avx512_bf16::to_row_pairs(dy, rows, out, pairs);
#endif
  for (std::int64_t r = 0; r < rows; r += 2) {
    const bf16* r0 = dy + r * out;
    const bf16* r1 = r + 1 < rows ? r0 + out : nullptr;  // an odd last row pairs with zero
    bf16* p = pairs + r * out;
    for (std::int64_t o = 0; o < out; ++o) {
      p[2 * o] = r0[o];
      p[2 * o + 1] = r1 ? r1[o] : bf16{0};
    }
  }
}

void relu_backward_to_row_pairs(const bf16* y, bf16* dy, std::int64_t rows, std::int64_t out,
                                bf16* pairs, bool in_place) {
#ifdef COHORT_PAIR_KERNEL
  if (row_pair_kernel())
    return avx512_bf16::relu_backward_to_row_pairs(y, dy, rows, out, pairs, in_place);
#endif
  for (std::int64_t r = 0; r < rows; r += 2) {
    const bool two = r + 1 < rows;  // an odd last row pairs with zero
    const bf16 *y0 = y + r * out, *y1 = y0 + out;
    bf16 *d0 = dy + r * out, *d1 = d0 + out;
    bf16* p = pairs + r * out;
    for (std::int64_t o = 0; o < out; ++o) {
      const bf16 z0 = to_bf16(relu_grad(y0[o], d0[o]));
      const bf16 z1 = two ? to_bf16(relu_grad(y1[o], d1[o])) : bf16{0};
      if (in_place) {
        d0[o] = z0;
        if (two) d1[o] = z1;
      }
      p[2 * o] = z0;
      p[2 * o + 1] = z1;
    }
  }
}

void relu_backward(const bf16* y, bf16* dy, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dy[i] = to_bf16(relu_grad(y[i], dy[i]));
}

void linear_weight_grad_pairs(const bf16* x, const bf16* dy_pairs, std::int64_t rows,
                              std::int64_t in, std::int64_t out, std::int64_t i0, std::int64_t i1,
                              float* dw) {
  COHORT_CHECK(0 <= i0 && i0 < i1 && i1 <= in && rows > 0 && out > 0,
               "bad linear_weight_grad_pairs range");
#ifdef COHORT_PAIR_KERNEL
  if (row_pair_kernel()) {
    avx512_bf16::weight_grad_pairs(x, dy_pairs, rows, in, out, i0, i1, dw, nullptr);
    return;
  }
#endif
  (void)x, (void)dy_pairs, (void)dw;
  throw InternalError("linear_weight_grad_pairs: no AVX512_BF16 on this CPU");
}

bool linear_weight_grad_pairs(const bf16* x, const bf16* dy_pairs, std::int64_t rows,
                              std::int64_t in, std::int64_t out, std::int64_t i0, std::int64_t i1,
                              const RowConsumer& consumer) {
  COHORT_CHECK(0 <= i0 && i0 < i1 && i1 <= in && rows > 0 && out > 0 && consumer.take &&
                   consumer.buffer != nullptr,
               "bad linear_weight_grad_pairs range or consumer");
#ifdef COHORT_PAIR_KERNEL
  if (row_pair_kernel())
    return avx512_bf16::weight_grad_pairs(x, dy_pairs, rows, in, out, i0, i1, nullptr, &consumer);
#endif
  (void)x, (void)dy_pairs;
  throw InternalError("linear_weight_grad_pairs: no AVX512_BF16 on this CPU");
}

void linear_bias_grad_pairs(const bf16* dy_pairs, std::int64_t rows, std::int64_t out,
                            std::int64_t o0, std::int64_t o1, float* db) {
  const std::int64_t n = o1 - o0;
  for (std::int64_t j = 0; j < n; ++j) db[j] = 0.0f;
  for (std::int64_t r = 0; r < rows; ++r) {  // in row order, as linear_bias_grad
    const bf16* p = dy_pairs + (r / 2) * 2 * out + 2 * o0 + (r % 2);
    for (std::int64_t j = 0; j < n; ++j) db[j] += to_float(p[2 * j]);
  }
}

}  // namespace cohort::nn
