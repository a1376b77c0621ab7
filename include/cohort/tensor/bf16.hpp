// bfloat16 storage: the upper 16 bits of an IEEE float (8-bit exponent, 7-bit mantissa), for the
// bf16 copy of the master weights and the activations and rows of --precision bf16. Conversions
// round to nearest even (as oneDNN's and the AVX512_BF16 instructions do) and keep NaN a NaN, so
// a given float always gives the same bits. Arithmetic stays in f32: nothing here computes.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

namespace cohort {

struct bf16 {
  std::uint16_t bits;  // no initializer: a trivial type (AlignedBuffer zeroes its arrays)
};

// Branch-free (a select, not a branch), so array loops vectorize.
inline bf16 to_bf16(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;  // nearest, ties to even
  const std::uint32_t quiet_nan = (u >> 16) | 0x40u;
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  return {static_cast<std::uint16_t>(nan ? quiet_nan : rounded)};
}

inline float to_float(bf16 b) { return std::bit_cast<float>(std::uint32_t{b.bits} << 16); }

// dst[i] = to_bf16(src[i]) for i < n (a loop the compiler vectorizes).
inline void to_bf16(const float* src, bf16* dst, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = to_bf16(src[i]);
}
inline void to_float(const bf16* src, float* dst, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = to_float(src[i]);
}

}  // namespace cohort
