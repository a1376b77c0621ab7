// Summation kernels: simple restrict-qualified loops that GCC and clang vectorise at -O3 with
// -march=native. Per element the additions are left to right; only the element loop is vectorised.
#include "cohort/reduce/kernels.hpp"

#include <algorithm>

namespace cohort::reduce {
namespace {

// 1024 floats = 4 KiB: a block of dst stays in L1 while further sources are folded into it.
constexpr std::size_t kBlock = 1024;

void copy1(float* __restrict d, const float* __restrict a, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) d[i] = a[i];
}
void add2(float* __restrict d, const float* __restrict a, const float* __restrict b,
          std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) d[i] = a[i] + b[i];
}
void add3(float* __restrict d, const float* __restrict a, const float* __restrict b,
          const float* __restrict c, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) d[i] = (a[i] + b[i]) + c[i];
}
void add4(float* __restrict d, const float* __restrict a, const float* __restrict b,
          const float* __restrict c, const float* __restrict e, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) d[i] = ((a[i] + b[i]) + c[i]) + e[i];
}
void acc1(float* __restrict d, const float* __restrict a, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) d[i] = d[i] + a[i];
}
void acc2(float* __restrict d, const float* __restrict a, const float* __restrict b,
          std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) d[i] = (d[i] + a[i]) + b[i];
}
void acc3(float* __restrict d, const float* __restrict a, const float* __restrict b,
          const float* __restrict c, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) d[i] = ((d[i] + a[i]) + b[i]) + c[i];
}
void scale1(float* __restrict d, std::size_t n, float s) {
  for (std::size_t i = 0; i < n; ++i) d[i] = d[i] * s;
}

// First up to four sources, written fresh into d.
void first_group(float* d, const float* const* src, std::size_t k, std::size_t off, std::size_t n) {
  switch (k) {
    case 1:
      copy1(d, src[0] + off, n);
      break;
    case 2:
      add2(d, src[0] + off, src[1] + off, n);
      break;
    case 3:
      add3(d, src[0] + off, src[1] + off, src[2] + off, n);
      break;
    default:
      add4(d, src[0] + off, src[1] + off, src[2] + off, src[3] + off, n);
      break;
  }
}

// Folds sources [j, k) into d, three at a time, left to right.
void fold_rest(float* d, const float* const* src, std::size_t j, std::size_t k, std::size_t off,
               std::size_t n) {
  while (j < k) {
    switch (std::min<std::size_t>(k - j, 3)) {
      case 1:
        acc1(d, src[j] + off, n);
        j += 1;
        break;
      case 2:
        acc2(d, src[j] + off, src[j + 1] + off, n);
        j += 2;
        break;
      default:
        acc3(d, src[j] + off, src[j + 1] + off, src[j + 2] + off, n);
        j += 3;
        break;
    }
  }
}

}  // namespace

void sum_sources(float* dst, const float* const* src, std::size_t k, std::size_t count,
                 float scale) {
  if (count == 0) return;
  if (k <= 4) {
    // One fused streaming pass; the scale (if any) is folded in per block while it is in L1.
    if (scale == 1.0f) {
      first_group(dst, src, k, 0, count);
      return;
    }
  }
  for (std::size_t off = 0; off < count; off += kBlock) {
    const std::size_t n = std::min(kBlock, count - off);
    float* d = dst + off;
    first_group(d, src, k, off, n);
    fold_rest(d, src, std::min<std::size_t>(k, 4), k, off, n);
    if (scale != 1.0f) scale1(d, n, scale);
  }
}

void accumulate(float* dst, const float* src, std::size_t count) { acc1(dst, src, count); }

void scale_in_place(float* dst, std::size_t count, float scale) { scale1(dst, count, scale); }

}  // namespace cohort::reduce
