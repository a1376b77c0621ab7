// The summation kernel every reducer strategy and the benchmark baseline share, so that the
// element-wise order of additions, and therefore every bit of the result, is defined in one place.
// Not a BLAS: one operation, dst[i] = scale * (((src[0][i] + src[1][i]) + src[2][i]) + ...).
#pragma once

#include <cstddef>

namespace cohort::reduce {

// dst[i] = (((src[0][i] + src[1][i]) + src[2][i]) + ... + src[k-1][i]) * scale, for i in
// [0, count). Callers offset the pointers to a chunk. Additions happen strictly left to right per
// element (no reassociation across sources), so the result is bitwise reproducible whatever the
// chunking, thread or vector width. scale == 1 skips the multiply (x * 1 is exact anyway); k == 1
// copies (then scales). Each source is read once and dst written once: the kernel works in
// L1-sized blocks, so k > 4 sources do not re-stream dst. dst must not alias any src.
// Preconditions: k >= 1, src[0..k) non-null when count > 0.
void sum_sources(float* dst, const float* const* src, std::size_t k, std::size_t count,
                 float scale = 1.0f);

// dst[i] = dst[i] + src[i] for i in [0, count): the in-place accumulate of the mutex strategy.
void accumulate(float* dst, const float* src, std::size_t count);

// dst[i] = dst[i] * scale for i in [0, count).
void scale_in_place(float* dst, std::size_t count, float scale);

}  // namespace cohort::reduce
