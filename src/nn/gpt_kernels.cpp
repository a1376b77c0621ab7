// A language model's own loops: the causal softmax's forward and backward, GELU and its slope
// (see the header for why they are cohort's own).
#include "cohort/nn/gpt_kernels.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "cohort/core/cpu.hpp"
#include "cohort/core/error.hpp"

#if defined(COHORT_X86_DISPATCH)
#include <immintrin.h>
#endif

namespace cohort::nn {

namespace {

inline void store(float* out, float v) { *out = v; }
inline void store(bf16* out, float v) { *out = to_bf16(v); }

// d[j] = dp[j] * mask[j] for j < n, rounded to float in memory: out of line, so that the compiler
// cannot fuse the product into the sums and differences after it (-ffp-contract), which would
// give other bits than a gradient masked before the kernel.
[[gnu::noinline]] void mask_row(const float* dp, const float* mask, std::int64_t n, float* d) {
  for (std::int64_t j = 0; j < n; ++j) d[j] = dp[j] * mask[j];
}

// The causal softmax's backward rows; with a mask, dp times the mask (dropout's).
template <class Out>
[[gnu::always_inline]] inline void backward_rows(const float* p, const float* dp, const float* mask,
                                                 Out* ds, std::int64_t mats, std::int64_t T,
                                                 float scale) {
  std::vector<float> masked(mask ? static_cast<std::size_t>(T) : 0);
  for (std::int64_t r = 0; r < mats * T; ++r) {
    const std::int64_t n = r % T + 1;  // the row's unmasked entries
    const float* pr = p + r * T;
    const float* dr = dp + r * T;
    if (mask) {
      mask_row(dr, mask + r * T, n, masked.data());
      dr = masked.data();
    }
    Out* out = ds + r * T;
    float part[8] = {};
    std::int64_t j = 0;
    for (; j + 8 <= n; j += 8)
      for (int k = 0; k < 8; ++k) part[k] += pr[j + k] * dr[j + k];
    float rest = 0.0f;
    for (; j < n; ++j) rest += pr[j] * dr[j];
    const float dot = ((part[0] + part[1]) + (part[2] + part[3])) +
                      ((part[4] + part[5]) + (part[6] + part[7])) + rest;
    for (j = 0; j < n; ++j) store(out + j, scale * (pr[j] * (dr[j] - dot)));
    for (; j < T; ++j) store(out + j, 0.0f);
  }
}

// Floats in GCC's vector extension (clang has it too): the compiler keeps selects and bit casts
// in registers, where the same loop in scalar floats stays scalar under the default
// -ftrapping-math (a comparison may trap, so selects on one are not if-converted). The softmax
// sums in eight lanes, and the AVX-512 clone runs the same 8-lane operations: the same bits on
// every CPU. GELU, element by element, runs 16 lanes (one AVX-512 register, two AVX2 ones):
// the same bits at any width.
// (GCC's -Wpsabi notes that a 64-byte vector passed by value has another ABI without AVX-512.
// Every helper that takes or returns a vector is always_inline, and bit casts are the builtin,
// so none is ever called across that boundary, even at -O0, where an out-of-line baseline copy
// called from an AVX-512 clone would read its arguments from the wrong registers.)
#pragma GCC diagnostic ignored "-Wpsabi"
using F8 = float __attribute__((vector_size(32)));
using U8 = std::uint32_t __attribute__((vector_size(32)));
using H8 = std::uint16_t __attribute__((vector_size(16)));
using F16 = float __attribute__((vector_size(64)));
using U16 = std::uint32_t __attribute__((vector_size(64)));
using H16 = std::uint16_t __attribute__((vector_size(32)));
template <class V>
struct Lanes;
template <>
struct Lanes<F8> {
  using U = U8;
  using H = H8;
};
template <>
struct Lanes<F16> {
  using U = U16;
  using H = H16;
};
template <class V>
constexpr std::int64_t kLanes = sizeof(V) / sizeof(float);
// std::bit_cast, without its out-of-line call at -O0.
template <class To, class From>
[[gnu::always_inline]] inline To as(const From& from) {
  return __builtin_bit_cast(To, from);
}

template <class V>
[[gnu::always_inline]] inline V load(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
[[gnu::always_inline]] inline F8 load8(const float* p) { return load<F8>(p); }
template <class V>
[[gnu::always_inline]] inline void store(float* p, V v) {
  std::memcpy(p, &v, sizeof v);
}
[[gnu::always_inline]] inline void store8(float* p, F8 v) { store(p, v); }
// bf16: widened exactly; rounded to nearest even, NaN kept a quiet NaN, as to_bf16 (bf16.hpp).
template <class V>
[[gnu::always_inline]] inline V load(const bf16* p) {
  using U = typename Lanes<V>::U;
  typename Lanes<V>::H h;
  std::memcpy(&h, p, sizeof h);
  return as<V>(__builtin_convertvector(h, U) << 16);
}
template <class V>
[[gnu::always_inline]] inline void store(bf16* p, V v) {
  using U = typename Lanes<V>::U;
  const U u = as<U>(v);
  const U rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const U bits = (u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : rounded;
  const auto h = __builtin_convertvector(bits, typename Lanes<V>::H);
  std::memcpy(p, &h, sizeof h);
}
template <class V = F8>
[[gnu::always_inline]] inline V splat(float v) {
  return V{} + v;
}

// exp(y) for y <= 0 (NaN stays NaN): 2^k e^r with k = round(y / ln 2) and |r| <= ln(2) / 2, e^r
// by Cephes' expf polynomial (within 2 ulp); 0 below about -87.7, where 2^k would leave the
// normal floats.
template <class V>
[[gnu::always_inline]] inline V exp_nonpositive(V y) {
  using U = typename Lanes<V>::U;
  y = y < -88.0f ? splat<V>(-88.0f) : y;                     // k >= -127
  const V shifted = y * 1.44269504088896341f + 12582912.0f;  // 1.5 * 2^23: rounds to integer
  const V k = shifted - 12582912.0f;
  const V r = (y - k * 0.693359375f) + k * 2.12194440e-4f;  // ln 2 in two parts
  V q = splat<V>(1.9875691500e-4f);
  q = q * r + 1.3981999507e-3f;
  q = q * r + 8.3334519073e-3f;
  q = q * r + 4.1665795894e-2f;
  q = q * r + 1.6666665459e-1f;
  q = q * r + 5.0000001201e-1f;
  const V er = (q * r) * r + r + 1.0f;
  // The shift's bits are 0x4b400000 + k: 2^k's are (k + 127) << 23, 0 (the float 0) at -127.
  const U bits = ((as<U>(shifted) - 0x4b400000u) + 127u) << 23;
  return er * as<V>(bits);
}

// GELU's values x Phi(x) and slopes Phi(x) + x phi(x), phi(x) = exp(-x^2 / 2) / sqrt(2 pi): the
// exponential is erfc's factor as well.
template <class V>
[[gnu::always_inline]] inline void gelu_lanes(V x, V& g, V& slope) {
  using U = typename Lanes<V>::U;
  const U magnitude = as<U>(x) & 0x7fffffffu;
  const V z = as<V>(magnitude) * 0.70710678118654752f;  // |x| / sqrt(2)
  const V e = exp_nonpositive(-z * z);                  // exp(-x^2 / 2)
  const V t = 1.0f / (z * 0.3275911f + 1.0f);
  V q = splat<V>(1.061405429f);
  q = q * t - 1.453152027f;
  q = q * t + 1.421413741f;
  q = q * t - 0.284496736f;
  q = q * t + 0.254829592f;
  const V tail = 0.5f * (q * t) * e;  // Phi(-|x|) = erfc(|x| / sqrt(2)) / 2
  const V upper = 1.0f - tail;
  const V phi = x < 0.0f ? tail : upper;
  g = x * phi;
  slope = (x * 0.39894228040143268f) * e + phi;
}

// The f32 GELU: 16 lanes at a time, the last n mod 16 through a full vector.
template <bool kSlope>
[[gnu::always_inline]] inline void gelu_rows(const float* f, float* g, float* slope,
                                             std::int64_t n) {
  constexpr std::int64_t W = kLanes<F16>;
  F16 gv, sv;
  std::int64_t i = 0;
  for (; i + W <= n; i += W) {
    gelu_lanes(load<F16>(f + i), gv, sv);
    store(g + i, gv);
    if constexpr (kSlope) store(slope + i, sv);
  }
  if (i == n) return;
  float in[W] = {}, out[W], out_slope[W];
  std::memcpy(in, f + i, static_cast<std::size_t>(n - i) * sizeof(float));
  gelu_lanes(load<F16>(in), gv, sv);
  store(out, gv);
  store(out_slope, sv);
  std::memcpy(g + i, out, static_cast<std::size_t>(n - i) * sizeof(float));
  if constexpr (kSlope)
    std::memcpy(slope + i, out_slope, static_cast<std::size_t>(n - i) * sizeof(float));
}

// The bf16 GELU's table: for each of the 65,536 bf16 values f, GELU(f) in the low 16 bits and its
// slope in the high 16, each the f32 kernel's value at f rounded (gelu_lanes, store). 256 KB, built
// on first use.
const std::uint32_t* gelu_bf16_table() {
  static const std::vector<std::uint32_t> table = [] {
    constexpr std::int64_t W = kLanes<F16>;
    std::vector<std::uint32_t> t(std::size_t{1} << 16);
    for (std::uint32_t first = 0; first < t.size(); first += W) {
      U16 bits;
      for (std::uint32_t k = 0; k < W; ++k) bits[k] = (first + k) << 16;
      F16 gv, sv;
      gelu_lanes(as<F16>(bits), gv, sv);
      bf16 g[W], s[W];
      store(g, gv);
      store(s, sv);
      for (std::uint32_t k = 0; k < W; ++k)
        t[first + k] = std::uint32_t{g[k].bits} | std::uint32_t{s[k].bits} << 16;
    }
    return t;
  }();
  return table.data();
}

// Table lookups for f[i, n): g and (kSlope) the slope.
template <bool kSlope>
void gelu_lookup(const std::uint32_t* table, const bf16* f, bf16* g, bf16* slope, std::int64_t i,
                 std::int64_t n) {
  for (; i < n; ++i) {
    const std::uint32_t e = table[f[i].bits];
    g[i].bits = static_cast<std::uint16_t>(e);
    if constexpr (kSlope) slope[i].bits = static_cast<std::uint16_t>(e >> 16);
  }
}

// The same, gathered: 16 lookups a step with AVX-512, 8 with AVX2; returns where it stopped.
#if defined(COHORT_X86_DISPATCH)
COHORT_TARGET_AVX512_BEGIN
namespace avx512 {  // entered where cpu_features() has AVX-512 (tests/build/check_baseline_isa.py)
template <bool kSlope>
std::int64_t gelu_gather16(const std::uint32_t* table, const bf16* f, bf16* g, bf16* slope,
                           std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    // The conversions in vector extensions, the gather masked: GCC 12's unmasked intrinsics
    // start from an undefined vector, which -Wmaybe-uninitialized flags. Builtins only: a helper
    // defined outside this region passing a 64-byte vector would cross the ABI boundary.
    H16 bits;
    std::memcpy(&bits, f + i, sizeof bits);
    const auto index = __builtin_bit_cast(__m512i, __builtin_convertvector(bits, U16));
    const auto e = __builtin_bit_cast(
        U16, _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), 0xffff, index, table, 4));
    const H16 values = __builtin_convertvector(e, H16);
    std::memcpy(g + i, &values, sizeof values);
    if constexpr (kSlope) {
      const H16 slopes = __builtin_convertvector(e >> 16, H16);
      std::memcpy(slope + i, &slopes, sizeof slopes);
    }
  }
  return i;
}
}  // namespace avx512
COHORT_TARGET_END
#endif
#if defined(__AVX2__)
template <bool kSlope>
std::int64_t gelu_gather8(const std::uint32_t* table, const bf16* f, bf16* g, bf16* slope,
                          std::int64_t n) {
  const __m256i low = _mm256_set1_epi32(0xffff);
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i index =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(f + i)));
    const __m256i e = _mm256_i32gather_epi32(reinterpret_cast<const int*>(table), index, 4);
    // The values' 16 bits, then the slopes', each half in order.
    const __m256i both = _mm256_permute4x64_epi64(
        _mm256_packus_epi32(_mm256_and_si256(e, low), _mm256_srli_epi32(e, 16)), 0xd8);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(g + i), _mm256_castsi256_si128(both));
    if constexpr (kSlope)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(slope + i), _mm256_extracti128_si256(both, 1));
  }
  return i;
}
#endif

template <bool kSlope>
void gelu_table(const bf16* f, bf16* g, bf16* slope, std::int64_t n, GeluLookup how) {
  const std::uint32_t* table = gelu_bf16_table();
  std::int64_t i = 0;
#if defined(COHORT_X86_DISPATCH)
  if (how == GeluLookup::kGather16) i = avx512::gelu_gather16<kSlope>(table, f, g, slope, n);
#endif
#if defined(__AVX2__)
  if (how == GeluLookup::kGather8) i = gelu_gather8<kSlope>(table, f, g, slope, n);
#endif
  gelu_lookup<kSlope>(table, f, g, slope, i, n);
}

// Eight lanes added pairwise: ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7)).
[[gnu::always_inline]] inline float add_lanes(F8 v) {
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}
// a b + c in one rounding, lane by lane: where a sum's bits must not depend on whether the
// compiler contracts a product and a sum (-ffp-contract), which it decides differently in
// differently unrolled copies of one loop.
[[gnu::always_inline]] inline F8 fma8(F8 a, F8 b, F8 c) {
  F8 r;
  for (int k = 0; k < 8; ++k) r[k] = __builtin_fmaf(a[k], b[k], c[k]);
  return r;
}
inline float load1(const float* p) { return *p; }
inline float load1(const bf16* p) { return to_float(*p); }

// LayerNorm's rows, R at a time: each row's sums in eight lanes (j mod 8) added pairwise, then
// the remainder. A row's sums are chains of dependent additions (a row of 128 floats: 16 of
// them), so the R rows' chains are interleaved; each row's operations, and so its bits, are those
// of one row alone. Each lane of dgamma adds the rows' terms in row order.
template <int R, class Out>
[[gnu::always_inline]] inline void layer_norm_group(const float* x, const float* gamma, Out* y,
                                                    float* mean, float* rstd, std::int64_t C,
                                                    float eps) {
  const float inv_c = 1.0f / static_cast<float>(C);
  const std::int64_t whole = C / 8 * 8;
  F8 acc[R];
  float mu[R], rs[R];
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i) acc[i] = F8{};
  for (std::int64_t j = 0; j < whole; j += 8)
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i) acc[i] += load8(x + i * C + j);
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i) {
    float rest = 0.0f;
    for (std::int64_t j = whole; j < C; ++j) rest += x[i * C + j];
    mu[i] = (add_lanes(acc[i]) + rest) * inv_c;
    acc[i] = F8{};
  }
  for (std::int64_t j = 0; j < whole; j += 8)
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i) {
      const F8 d = load8(x + i * C + j) - mu[i];
      acc[i] += d * d;
    }
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i) {
    const float* xr = x + i * C;
    float rest = 0.0f;
    for (std::int64_t j = whole; j < C; ++j) rest += (xr[j] - mu[i]) * (xr[j] - mu[i]);
    rs[i] = 1.0f / std::sqrt((add_lanes(acc[i]) + rest) * inv_c + eps);
    mean[i] = mu[i];
    rstd[i] = rs[i];
  }
  for (int i = 0; i < R; ++i) {
    const float* xr = x + i * C;
    Out* yr = y + i * C;
    for (std::int64_t j = 0; j < whole; j += 8)
      store(yr + j, (load8(xr + j) - mu[i]) * rs[i] * load8(gamma + j));
    for (std::int64_t j = whole; j < C; ++j) store(yr + j, (xr[j] - mu[i]) * rs[i] * gamma[j]);
  }
}

template <class Out>
[[gnu::always_inline]] inline void layer_norm_rows(const float* x, const float* gamma, Out* y,
                                                   float* mean, float* rstd, std::int64_t rows,
                                                   std::int64_t C, float eps) {
  std::int64_t r = 0;
  for (; r + 4 <= rows; r += 4)
    layer_norm_group<4>(x + r * C, gamma, y + r * C, mean + r, rstd + r, C, eps);
  for (; r < rows; ++r)
    layer_norm_group<1>(x + r * C, gamma, y + r * C, mean + r, rstd + r, C, eps);
}

template <int R, class In>
[[gnu::always_inline]] inline void layer_norm_backward_group(const float* x, const float* gamma,
                                                             const float* mean, const float* rstd,
                                                             const In* dy, float* dx,
                                                             bool accumulate, float* dgamma,
                                                             std::int64_t C) {
  const float inv_c = 1.0f / static_cast<float>(C);
  const std::int64_t whole = C / 8 * 8;
  F8 ga[R], gb[R];
  float a[R], b[R];
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i) ga[i] = gb[i] = F8{};
  for (std::int64_t j = 0; j < whole; j += 8)
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i) {
      const F8 g = load<F8>(dy + i * C + j) * load8(gamma + j);
      ga[i] += g;
      gb[i] += g * ((load8(x + i * C + j) - mean[i]) * rstd[i]);
    }
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i) {
    const float* xr = x + i * C;
    const In* dyr = dy + i * C;
    float ra = 0.0f, rb = 0.0f;
    for (std::int64_t j = whole; j < C; ++j) {
      const float g = load1(dyr + j) * gamma[j];
      ra += g;
      rb += g * ((xr[j] - mean[i]) * rstd[i]);
    }
    a[i] = (add_lanes(ga[i]) + ra) * inv_c;
    b[i] = (add_lanes(gb[i]) + rb) * inv_c;
  }
  for (std::int64_t j = 0; j < whole; j += 8) {
    F8 dg = load8(dgamma + j);
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i) {
      const float rs = rstd[i];
      const F8 d = load<F8>(dy + i * C + j), xhat = (load8(x + i * C + j) - mean[i]) * rs;
      const F8 inner = (d * load8(gamma + j) - a[i]) - xhat * b[i];
      float* dxr = dx + i * C;
      store8(dxr + j, accumulate ? fma8(splat(rs), inner, load8(dxr + j)) : rs * inner);
      dg += d * xhat;
    }
    store8(dgamma + j, dg);
  }
  for (int i = 0; i < R; ++i) {
    const float* xr = x + i * C;
    const In* dyr = dy + i * C;
    float* dxr = dx + i * C;
    const float mu = mean[i], rs = rstd[i];
    for (std::int64_t j = whole; j < C; ++j) {
      const float d = load1(dyr + j), xhat = (xr[j] - mu) * rs;
      const float inner = (d * gamma[j] - a[i]) - xhat * b[i];
      dxr[j] = accumulate ? std::fma(rs, inner, dxr[j]) : rs * inner;
      dgamma[j] += d * xhat;
    }
  }
}

template <class In>
[[gnu::always_inline]] inline void layer_norm_backward_rows(const float* x, const float* gamma,
                                                            const float* mean, const float* rstd,
                                                            const In* dy, float* dx,
                                                            bool accumulate, float* dgamma,
                                                            std::int64_t rows, std::int64_t C) {
  std::fill(dgamma, dgamma + C, 0.0f);
  std::int64_t r = 0;
  for (; r + 4 <= rows; r += 4)
    layer_norm_backward_group<4>(x + r * C, gamma, mean + r, rstd + r, dy + r * C, dx + r * C,
                                 accumulate, dgamma, C);
  for (; r < rows; ++r)
    layer_norm_backward_group<1>(x + r * C, gamma, mean + r, rstd + r, dy + r * C, dx + r * C,
                                 accumulate, dgamma, C);
}

}  // namespace

namespace {

// The softmax's rows; with `used` a float* or bf16*, p (times `mask` where not null) also
// written there.
template <class UsedPtr>
[[gnu::always_inline]] inline void softmax_rows(const float* s, float* p, const float* mask,
                                                UsedPtr used, std::int64_t mats, std::int64_t T,
                                                float scale) {
  constexpr bool kUsed = !std::is_same_v<UsedPtr, std::nullptr_t>;
  const F8 scale8 = splat(scale);
  const U8 lane = {0, 1, 2, 3, 4, 5, 6, 7};
  // Rows of whole vectors (T a multiple of 8, as every preset's block): each row's last n mod 8
  // scores are one load and a select (the other lanes a score of the row), and its entries past
  // the diagonal are written a vector at a time. Elsewhere those scores go through a copy (a
  // vector loaded from the copy's scalar stores waits for them to retire: no store forwarding)
  // and the zeros an entry at a time. The same operations on the kept entries either way
  // (docs/decisions.md, "A language model's own loops").
  const bool by_vector = T % 8 == 0;
  for (std::int64_t r = 0; r < mats * T; ++r) {
    const std::int64_t n = r % T + 1;  // the row's unmasked entries
    const std::int64_t whole = n / 8 * 8;
    const float* sr = s + r * T;
    float* out = p + r * T;
    const U8 kept = lane < static_cast<std::uint32_t>(n - whole);  // the tail's lanes in the row
    F8 tail = {};                                                  // its scores, when n > whole
    if (whole < n) {
      if (by_vector) {
        tail = kept ? load8(sr + whole) : splat(sr[whole]);
      } else {
        float buf[8];
        std::fill(buf, buf + 8, sr[whole]);
        std::memcpy(buf, sr + whole, static_cast<std::size_t>(n - whole) * sizeof(float));
        tail = load8(buf);
      }
    }
    F8 top8 = splat(sr[0]);
    for (std::int64_t j = 0; j < whole; j += 8) {
      const F8 v = load8(sr + j);
      top8 = top8 < v ? v : top8;
    }
    if (whole < n) top8 = top8 < tail ? tail : top8;
    float top = sr[0];
    for (int k = 0; k < 8; ++k) top = top < top8[k] ? top8[k] : top;
    // The largest scaled score is the largest score scaled (scale > 0; rounding is monotone).
    top *= scale;
    F8 part = {};
    for (std::int64_t j = 0; j < whole; j += 8) {
      const F8 e = exp_nonpositive(load8(sr + j) * scale8 - top);
      store8(out + j, e);
      part += e;
    }
    float rest = 0.0f;
    if (whole < n) {
      float e[8];
      const F8 ev = exp_nonpositive(tail * scale8 - top);
      store8(e, ev);
      for (std::int64_t j = 0; j < n - whole; ++j) rest += e[j];
      if (by_vector)
        store8(out + whole, kept ? ev : F8{});
      else
        std::memcpy(out + whole, e, static_cast<std::size_t>(n - whole) * sizeof(float));
    }
    const float sum = add_lanes(part) + rest;
    const float inv = 1.0f / sum;
    if (by_vector) {
      // Whole vectors: the kept entries scaled, the rest 0.
      const float* mr = mask ? mask + r * T : nullptr;
      [[maybe_unused]] auto write_used = [&](std::int64_t j, F8 v) __attribute__((always_inline)) {
        if constexpr (kUsed) store(used + r * T + j, v);
      };
      std::int64_t j = 0;
      for (; j < whole; j += 8) {
        const F8 v = load8(out + j) * inv;
        store8(out + j, v);
        write_used(j, mr ? v * load8(mr + j) : v);
      }
      if (whole < n) {
        const F8 v = load8(out + j) * inv;
        store8(out + j, v);
        write_used(j, kept ? (mr ? v * load8(mr + j) : v) : F8{});
        j += 8;
      }
      for (; j < T; j += 8) {
        store8(out + j, F8{});
        write_used(j, F8{});
      }
      continue;
    }
    if constexpr (!kUsed) {
      for (std::int64_t j = 0; j < n; ++j) out[j] *= inv;
    } else {
      auto* ur = used + r * T;
      const float* mr = mask ? mask + r * T : nullptr;
      std::int64_t j = 0;
      for (; j + 8 <= n; j += 8) {
        const F8 v = load8(out + j) * inv;
        store8(out + j, v);
        store(ur + j, mr ? v * load8(mr + j) : v);
      }
      for (; j < n; ++j) {
        const float v = out[j] *= inv;
        store(ur + j, mr ? v * mr[j] : v);
      }
      for (; j < T; ++j) store(ur + j, 0.0f);
    }
    for (std::int64_t j = n; j < T; ++j) out[j] = 0.0f;
  }
}

}  // namespace

COHORT_CLONES_AVX512
void causal_softmax_forward(const float* s, float* p, std::int64_t mats, std::int64_t T,
                            float scale) {
  softmax_rows(s, p, nullptr, nullptr, mats, T, scale);
}

COHORT_CLONES_AVX512
void causal_softmax_forward(const float* s, float* p, const float* mask, float* used,
                            std::int64_t mats, std::int64_t T, float scale) {
  softmax_rows(s, p, mask, used, mats, T, scale);
}

COHORT_CLONES_AVX512
void causal_softmax_forward(const float* s, float* p, const float* mask, bf16* used,
                            std::int64_t mats, std::int64_t T, float scale) {
  softmax_rows(s, p, mask, used, mats, T, scale);
}

COHORT_CLONES_AVX512
void gelu_forward(const float* f, float* g, float* slope, std::int64_t n) {
  if (slope)
    gelu_rows<true>(f, g, slope, n);
  else
    gelu_rows<false>(f, g, slope, n);
}

bool gelu_lookup_available(GeluLookup how) {
  switch (how) {
    case GeluLookup::kGather16:
#if defined(COHORT_X86_DISPATCH)
      return cpu_features().avx512();
#else
      return false;
#endif
    case GeluLookup::kGather8:
#if defined(__AVX2__)
      return true;
#else
      return false;
#endif
    default:
      return true;
  }
}

void gelu_forward(const bf16* f, bf16* g, bf16* slope, std::int64_t n, GeluLookup how) {
  if (how == GeluLookup::kAuto) {
    static const GeluLookup best =
        gelu_lookup_available(GeluLookup::kGather16)  ? GeluLookup::kGather16
        : gelu_lookup_available(GeluLookup::kGather8) ? GeluLookup::kGather8
                                                      : GeluLookup::kScalar;
    how = best;
  } else {
    COHORT_CHECK(gelu_lookup_available(how), "gelu_forward: lookups this CPU cannot run");
  }
  if (slope)
    gelu_table<true>(f, g, slope, n, how);
  else
    gelu_table<false>(f, g, slope, n, how);
}

COHORT_CLONES_AVX512
void gelu_backward(const float* dg, const float* slope, float* df, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) df[i] = dg[i] * slope[i];
}

COHORT_CLONES_AVX512
void gelu_backward(const bf16* dg, const bf16* slope, bf16* df, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) store(df + i, load<F16>(dg + i) * load<F16>(slope + i));
  for (; i < n; ++i) df[i] = to_bf16(to_float(dg[i]) * to_float(slope[i]));
}

COHORT_CLONES_AVX512
void causal_softmax_backward(const float* p, const float* dp, const float* mask, float* ds,
                             std::int64_t mats, std::int64_t T, float scale) {
  backward_rows(p, dp, mask, ds, mats, T, scale);
}

COHORT_CLONES_AVX512
void causal_softmax_backward(const float* p, const float* dp, const float* mask, bf16* ds,
                             std::int64_t mats, std::int64_t T, float scale) {
  backward_rows(p, dp, mask, ds, mats, T, scale);
}

COHORT_CLONES_AVX512
void layer_norm_forward(const float* x, const float* gamma, float* y, float* mean, float* rstd,
                        std::int64_t rows, std::int64_t C, float eps) {
  layer_norm_rows(x, gamma, y, mean, rstd, rows, C, eps);
}

COHORT_CLONES_AVX512
void layer_norm_forward(const float* x, const float* gamma, bf16* y, float* mean, float* rstd,
                        std::int64_t rows, std::int64_t C, float eps) {
  layer_norm_rows(x, gamma, y, mean, rstd, rows, C, eps);
}

COHORT_CLONES_AVX512
void layer_norm_backward(const float* x, const float* gamma, const float* mean, const float* rstd,
                         const float* dy, float* dx, bool accumulate, float* dgamma,
                         std::int64_t rows, std::int64_t C) {
  layer_norm_backward_rows(x, gamma, mean, rstd, dy, dx, accumulate, dgamma, rows, C);
}

COHORT_CLONES_AVX512
void layer_norm_backward(const float* x, const float* gamma, const float* mean, const float* rstd,
                         const bf16* dy, float* dx, bool accumulate, float* dgamma,
                         std::int64_t rows, std::int64_t C) {
  layer_norm_backward_rows(x, gamma, mean, rstd, dy, dx, accumulate, dgamma, rows, C);
}

}  // namespace cohort::nn
