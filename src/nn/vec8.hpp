// Eight floats in GCC's vector extension (clang has it too), for nn's own loops: the compiler
// keeps selects, bit casts and register-blocked sums in registers, where the same loops in scalar
// floats stay scalar under the default -ftrapping-math (a select on a float comparison is not
// if-converted). An AVX-512 clone (COHORT_CLONES_AVX512) runs the same 8-lane operations: the
// same bits on every CPU.
#pragma once

#include <cstdint>
#include <cstring>

namespace cohort::nn::detail {

using F8 = float __attribute__((vector_size(32)));
using U8 = std::uint32_t __attribute__((vector_size(32)));

inline F8 load8(const float* p) {
  F8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store8(float* p, F8 v) { std::memcpy(p, &v, sizeof v); }
inline F8 splat(float v) { return F8{} + v; }

}  // namespace cohort::nn::detail
