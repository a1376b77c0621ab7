// A language model's own loops: the causal softmax's forward and backward, GELU and its slope
// (see the header for why they are cohort's own).
#include "cohort/nn/gpt/gpt_kernels.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "cohort/core/cpu.hpp"
#include "cohort/core/error.hpp"
#include "gpt_lanes.hpp"

#if defined(COHORT_X86_DISPATCH)
#include <immintrin.h>
#endif

namespace cohort::nn {

namespace lanes {

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

// GPT-2's tanh form: s = sigmoid(2u) = (1 + tanh u) / 2, u = sqrt(2 / pi) (x + 0.044715 x^3),
// from e = exp(-2|u|) (gpt_kernels.hpp); g = x s and slope = s + 2 x s (1 - s) du/dx.
template <class V>
[[gnu::always_inline]] inline void gelu_tanh_lanes(V x, V& g, V& slope) {
  using U = typename Lanes<V>::U;
  const V x2 = x * x;
  const V u = (x * 0.79788456080286536f) * (x2 * 0.044715f + 1.0f);
  const V magnitude = as<V>(as<U>(u) & 0x7fffffffu);
  const V e = exp_nonpositive(-2.0f * magnitude);
  const V d = 1.0f / (e + 1.0f);
  const V s = u < 0.0f ? e * d : d;
  const V du = (x2 * 0.134145f + 1.0f) * 0.79788456080286536f;  // 3 0.044715 = 0.134145
  g = x * s;
  // Where e is 0 (|u| > 44), s (1 - s) is 0 and x du may be infinite: the term is 0, not NaN.
  const V term = (x * (e * d * d)) * (2.0f * du);
  slope = (e > 0.0f ? term : 0.0f) + s;
}

template <Gelu kForm, class V>
[[gnu::always_inline]] inline void gelu_form(V x, V& g, V& slope) {
  if constexpr (kForm == Gelu::kTanh)
    gelu_tanh_lanes(x, g, slope);
  else
    gelu_lanes(x, g, slope);
}

// The f32 GELU: 16 lanes at a time, the last n mod 16 through a full vector.
template <bool kSlope, Gelu kForm>
[[gnu::always_inline]] inline void gelu_rows(const float* f, float* g, float* slope,
                                             std::int64_t n) {
  constexpr std::int64_t W = kLanes<F16>;
  F16 gv, sv;
  std::int64_t i = 0;
  for (; i + W <= n; i += W) {
    gelu_form<kForm>(load<F16>(f + i), gv, sv);
    store(g + i, gv);
    if constexpr (kSlope) store(slope + i, sv);
  }
  if (i == n) return;
  float in[W] = {}, out[W], out_slope[W];
  std::memcpy(in, f + i, static_cast<std::size_t>(n - i) * sizeof(float));
  gelu_form<kForm>(load<F16>(in), gv, sv);
  store(out, gv);
  store(out_slope, sv);
  std::memcpy(g + i, out, static_cast<std::size_t>(n - i) * sizeof(float));
  if constexpr (kSlope)
    std::memcpy(slope + i, out_slope, static_cast<std::size_t>(n - i) * sizeof(float));
}

// The bf16 GELU's table of a form: for each of the 65,536 bf16 values f, GELU(f) in the low 16
// bits and its slope in the high 16, each the f32 kernel's value at f rounded (gelu_form, store).
// 256 KB, built on first use.
template <Gelu kForm>
const std::uint32_t* gelu_bf16_table() {
  static const std::vector<std::uint32_t> table = [] {
    constexpr std::int64_t W = kLanes<F16>;
    std::vector<std::uint32_t> t(std::size_t{1} << 16);
    for (std::uint32_t first = 0; first < t.size(); first += W) {
      U16 bits;
      for (std::uint32_t k = 0; k < W; ++k) bits[k] = (first + k) << 16;
      F16 gv, sv;
      gelu_form<kForm>(as<F16>(bits), gv, sv);
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
void gelu_table(const bf16* f, bf16* g, bf16* slope, std::int64_t n, Gelu form, GeluLookup how) {
  const std::uint32_t* table =
      form == Gelu::kTanh ? gelu_bf16_table<Gelu::kTanh>() : gelu_bf16_table<Gelu::kErf>();
  std::int64_t i = 0;
#if defined(COHORT_X86_DISPATCH)
  if (how == GeluLookup::kGather16) i = avx512::gelu_gather16<kSlope>(table, f, g, slope, n);
#endif
#if defined(__AVX2__)
  if (how == GeluLookup::kGather8) i = gelu_gather8<kSlope>(table, f, g, slope, n);
#endif
  gelu_lookup<kSlope>(table, f, g, slope, i, n);
}

}  // namespace lanes

namespace lanes {

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

}  // namespace lanes

COHORT_CLONES_AVX512
double token_cross_entropy(const float* logits, const std::int32_t* labels, std::int64_t rows,
                           std::int64_t vocab, std::int64_t stride, float scale, float* diff) {
  using namespace lanes;
  const std::int64_t whole = vocab / 8 * 8, tail = vocab - whole;
  double loss = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* z = logits + r * stride;
    float* d = diff ? diff + r * stride : nullptr;
    const std::int32_t y = labels[r];
    const float zy = z[y];  // read before d, which may be z, is written
    F8 top8 = splat(z[0]);
    for (std::int64_t j = 0; j < whole; j += 8) {
      const F8 v = load8(z + j);
      top8 = top8 < v ? v : top8;
    }
    float top = z[0];
    for (int k = 0; k < 8; ++k) top = top < top8[k] ? top8[k] : top;
    for (std::int64_t j = whole; j < vocab; ++j) top = top < z[j] ? z[j] : top;
    const F8 top_v = splat(top);
    F8 part = {};
    for (std::int64_t j = 0; j < whole; j += 8) {
      const F8 e = exp_nonpositive(load8(z + j) - top_v);
      if (d) store8(d + j, e);
      part += e;
    }
    float rest = 0.0f;
    if (tail > 0) {
      float buf[8];
      std::fill(buf, buf + 8, top);
      std::memcpy(buf, z + whole, static_cast<std::size_t>(tail) * sizeof(float));
      float e[8];
      store8(e, exp_nonpositive(load8(buf) - top_v));
      for (std::int64_t j = 0; j < tail; ++j) rest += e[j];
      if (d) std::memcpy(d + whole, e, static_cast<std::size_t>(tail) * sizeof(float));
    }
    const float sum = add_lanes(part) + rest;
    loss += static_cast<double>(std::log(sum) - (zy - top));
    if (!d) continue;
    const float inv = 1.0f / sum;
    const float ey = d[y];
    const F8 inv_v = splat(inv), scale_v = splat(scale);
    for (std::int64_t j = 0; j < whole; j += 8) store8(d + j, (load8(d + j) * inv_v) * scale_v);
    for (std::int64_t j = whole; j < vocab; ++j) d[j] = (d[j] * inv) * scale;
    d[y] = __builtin_fmaf(ey, inv, -1.0f) * scale;
    std::fill(d + vocab, d + stride, 0.0f);
  }
  return loss;
}

COHORT_CLONES_AVX512
void causal_softmax_forward(const float* s, float* p, std::int64_t mats, std::int64_t T,
                            float scale) {
  lanes::softmax_rows(s, p, nullptr, nullptr, mats, T, scale);
}

COHORT_CLONES_AVX512
void causal_softmax_forward(const float* s, float* p, const float* mask, float* used,
                            std::int64_t mats, std::int64_t T, float scale) {
  lanes::softmax_rows(s, p, mask, used, mats, T, scale);
}

COHORT_CLONES_AVX512
void causal_softmax_forward(const float* s, float* p, const float* mask, bf16* used,
                            std::int64_t mats, std::int64_t T, float scale) {
  lanes::softmax_rows(s, p, mask, used, mats, T, scale);
}

COHORT_CLONES_AVX512
void gelu_forward(const float* f, float* g, float* slope, std::int64_t n, Gelu form) {
  if (form == Gelu::kTanh) {
    if (slope)
      lanes::gelu_rows<true, Gelu::kTanh>(f, g, slope, n);
    else
      lanes::gelu_rows<false, Gelu::kTanh>(f, g, slope, n);
  } else if (slope) {
    lanes::gelu_rows<true, Gelu::kErf>(f, g, slope, n);
  } else {
    lanes::gelu_rows<false, Gelu::kErf>(f, g, slope, n);
  }
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

void gelu_forward(const bf16* f, bf16* g, bf16* slope, std::int64_t n, Gelu form, GeluLookup how) {
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
    lanes::gelu_table<true>(f, g, slope, n, form, how);
  else
    lanes::gelu_table<false>(f, g, slope, n, form, how);
}

COHORT_CLONES_AVX512
void gelu_backward(const float* dg, const float* slope, float* df, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) df[i] = dg[i] * slope[i];
}

COHORT_CLONES_AVX512
void gelu_backward(const bf16* dg, const bf16* slope, bf16* df, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    lanes::store(df + i, lanes::load<lanes::F16>(dg + i) * lanes::load<lanes::F16>(slope + i));
  for (; i < n; ++i) df[i] = to_bf16(to_float(dg[i]) * to_float(slope[i]));
}

COHORT_CLONES_AVX512
void causal_softmax_backward(const float* p, const float* dp, const float* mask, float* ds,
                             std::int64_t mats, std::int64_t T, float scale) {
  lanes::backward_rows(p, dp, mask, ds, mats, T, scale);
}

COHORT_CLONES_AVX512
void causal_softmax_backward(const float* p, const float* dp, const float* mask, bf16* ds,
                             std::int64_t mats, std::int64_t T, float scale) {
  lanes::backward_rows(p, dp, mask, ds, mats, T, scale);
}

}  // namespace cohort::nn
