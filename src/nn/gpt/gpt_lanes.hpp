// Private to src/nn: the vectors of floats (GCC's vector extension) and the helpers that a
// language model's own loops share: gpt_kernels.cpp (the causal softmax, GELU) and
// gpt_layer_norm.cpp (LayerNorm). Their interface is cohort/nn/gpt/gpt_kernels.hpp.
#pragma once

#include <cstdint>
#include <cstring>

#include "cohort/tensor/bf16.hpp"

namespace cohort::nn::lanes {

inline void store(float* out, float v) { *out = v; }
inline void store(bf16* out, float v) { *out = to_bf16(v); }

// Floats in GCC's vector extension (clang has it too): the compiler keeps selects and bit casts
// in registers, where the same loop in scalar floats stays scalar under the default
// -ftrapping-math (a comparison may trap, so selects on one are not if-converted). The softmax
// and LayerNorm sum in eight lanes, and the AVX-512 clone runs the same 8-lane operations: the
// same bits on every CPU. GELU, element by element, runs 16 lanes (one AVX-512 register, two AVX2
// ones): the same bits at any width. (GCC's -Wpsabi notes that a 64-byte vector passed by value has
// another ABI without AVX-512. Every helper that takes or returns a vector is always_inline, and
// bit casts are the builtin, so none is ever called across that boundary, even at -O0, where an
// out-of-line baseline copy called from an AVX-512 clone would read its arguments from the wrong
// registers.)
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

}  // namespace cohort::nn::lanes
