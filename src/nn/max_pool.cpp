// Max pooling on channel-innermost layouts; see include/cohort/nn/max_pool.hpp. One window at a
// time, its lanes a vector register at a time (bf16 widened to f32 on load; the maximum's bits
// are an input's, so the store is exact), a lane count that is no multiple of it lane by lane.
#include "cohort/nn/max_pool.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>

#include "cohort/core/cpu.hpp"
#include "cohort/core/error.hpp"

namespace cohort::nn {

// The kernels twice: for the build's baseline (8 lanes a vector step, one ymm), and for AVX-512
// (16, one zmm) where the CPU has it. Both compute the same bits: each lane's maximum is one of its
// inputs.
namespace {
namespace portable {
#define COHORT_POOL_LANES 8
#include "max_pool_kernels.inc"
#undef COHORT_POOL_LANES
}  // namespace portable
#if defined(COHORT_X86_DISPATCH)
COHORT_TARGET_AVX512_BEGIN
namespace avx512 {
#define COHORT_POOL_LANES 16
#include "max_pool_kernels.inc"
#undef COHORT_POOL_LANES
}  // namespace avx512
COHORT_TARGET_END
#endif

PoolIsa resolve(PoolIsa isa) {
  if (isa == PoolIsa::kAuto)
    return max_pool_isa_available(PoolIsa::kAvx512) ? PoolIsa::kAvx512 : PoolIsa::kPortable;
  COHORT_CHECK(max_pool_isa_available(isa), "max pooling: this CPU lacks the kernel's ISA");
  return isa;
}

// Calls f with the namespace's kernels (a tag: portable or avx512) for `isa`.
template <class T, class F>
void dispatch(PoolIsa isa, std::int64_t K, F f) {
#if defined(COHORT_X86_DISPATCH)
  if (resolve(isa) == PoolIsa::kAvx512) {
    K == 2 ? f(&avx512::forward<T, 2>, &avx512::backward<T, 2>)
           : f(&avx512::forward<T, 0>, &avx512::backward<T, 0>);
    return;
  }
#else
  resolve(isa);
#endif
  K == 2 ? f(&portable::forward<T, 2>, &portable::backward<T, 2>)
         : f(&portable::forward<T, 0>, &portable::backward<T, 0>);
}

template <class T>
void forward_any(const MaxPoolShape& s, const T* src, T* dst, std::uint8_t* where, PoolIsa isa) {
  dispatch<T>(isa, s.K, [&](auto fwd, auto) { fwd(s, src, dst, where); });
}
template <class T>
void backward_any(const MaxPoolShape& s, const std::uint8_t* where, const T* diff_dst, T* diff_src,
                  PoolIsa isa) {
  dispatch<T>(isa, s.K, [&](auto, auto bwd) { bwd(s, where, diff_dst, diff_src); });
}

}  // namespace

bool max_pool_supported(const MaxPoolShape& s) {
  const bool lanes = s.src.lanes >= 1 && s.src.lanes == s.dst.lanes && s.C % s.src.lanes == 0;
  const bool index_fits = s.K <= 15 && (!s.relu || s.K * s.K <= portable::kReluZeroed);
  return lanes && s.K >= 1 && index_fits && s.IH >= s.K && s.IW >= s.K && s.N >= 1;
}

bool max_pool_isa_available(PoolIsa isa) {
#if defined(COHORT_X86_DISPATCH)
  if (isa == PoolIsa::kAvx512) return cpu_features().avx512();
#endif
  return isa != PoolIsa::kAvx512;
}

void max_pool_forward(const MaxPoolShape& s, const float* src, float* dst, std::uint8_t* where,
                      PoolIsa isa) {
  forward_any(s, src, dst, where, isa);
}
void max_pool_forward(const MaxPoolShape& s, const bf16* src, bf16* dst, std::uint8_t* where,
                      PoolIsa isa) {
  forward_any(s, src, dst, where, isa);
}
void max_pool_backward(const MaxPoolShape& s, const std::uint8_t* where, const float* diff_dst,
                       float* diff_src, PoolIsa isa) {
  backward_any(s, where, diff_dst, diff_src, isa);
}
void max_pool_backward(const MaxPoolShape& s, const std::uint8_t* where, const bf16* diff_dst,
                       bf16* diff_src, PoolIsa isa) {
  backward_any(s, where, diff_dst, diff_src, isa);
}

}  // namespace cohort::nn
