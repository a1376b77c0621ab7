// Max pooling on channel-innermost layouts; see include/cohort/nn/max_pool.hpp. One window at a
// time, its lanes 16 at a time in fixed-size loops the compiler vectorizes (bf16 widened to f32
// on load; the maximum's bits are an input's, so the store is exact).
#include "cohort/nn/max_pool.hpp"

#include <algorithm>
#include <bit>
#include <limits>

namespace cohort::nn {

namespace {

constexpr std::int64_t kVec = 16;  // lanes per fixed-size loop: one zmm of f32

inline float load(const float* p) { return *p; }
inline float load(const bf16* p) { return to_float(*p); }
inline void store(float* p, float v) { *p = v; }
inline void store(bf16* p, float v) {  // v is a widened bf16: its upper half is exact
  p->bits = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(v) >> 16);
}
inline float pick(bool take, float v, float zero) { return take ? v : zero; }
inline bf16 pick(bool take, bf16 v, bf16 zero) {
  return {static_cast<std::uint16_t>(take ? v.bits : zero.bits)};
}

// One window's W lanes: the first maximal element of each lane (a NaN counts as maximal, and the
// first NaN stays), its value to out and its window index to at (unless null).
template <int W, class T>
void pool_window(const T* in, std::int64_t h_stride, std::int64_t w_stride, std::int64_t K, T* out,
                 std::uint8_t* at) {
  float best[W];
  std::int32_t index[W];
  for (int l = 0; l < W; ++l) {
    best[l] = -std::numeric_limits<float>::infinity();
    index[l] = 0;
  }
  for (std::int64_t kh = 0; kh < K; ++kh)
    for (std::int64_t kw = 0; kw < K; ++kw) {
      const T* p = in + kh * h_stride + kw * w_stride;
      const auto k = static_cast<std::int32_t>(kh * K + kw);
      for (int l = 0; l < W; ++l) {
        const float v = load(p + l);
        const bool take = !(v <= best[l]) && best[l] == best[l];  // greater, or the first NaN
        best[l] = take ? v : best[l];
        index[l] = take ? k : index[l];
      }
    }
  for (int l = 0; l < W; ++l) store(out + l, best[l]);
  if (at)
    for (int l = 0; l < W; ++l) at[l] = static_cast<std::uint8_t>(index[l]);
}

// One window's W lanes backward: each element gets its lane's gradient where it was the
// maximum, zero elsewhere.
template <int W, class T>
void unpool_window(const T* diff_dst, const std::uint8_t* at, std::int64_t h_stride,
                   std::int64_t w_stride, std::int64_t K, T* diff_src) {
  const T zero{};
  for (std::int64_t kh = 0; kh < K; ++kh)
    for (std::int64_t kw = 0; kw < K; ++kw) {
      T* p = diff_src + kh * h_stride + kw * w_stride;
      const auto k = static_cast<std::uint8_t>(kh * K + kw);
      for (int l = 0; l < W; ++l) p[l] = pick(at[l] == k, diff_dst[l], zero);
    }
}

// Calls f(src offset, dst offset, lanes at offset l0 of width 16 or less) for every window and
// lane block, in the layouts' memory order.
template <class F>
void for_each_window(const MaxPoolShape& s, F f) {
  const PoolLayout &a = s.src, &b = s.dst;
  const std::int64_t groups = s.C / a.lanes, OH = s.OH(), OW = s.OW();
  for (std::int64_t n = 0; n < s.N; ++n)
    for (std::int64_t g = 0; g < groups; ++g)
      for (std::int64_t oh = 0; oh < OH; ++oh)
        for (std::int64_t ow = 0; ow < OW; ++ow) {
          const std::int64_t in =
              n * a.n_stride + g * a.group_stride + oh * s.K * a.h_stride + ow * s.K * a.w_stride;
          const std::int64_t out =
              n * b.n_stride + g * b.group_stride + oh * b.h_stride + ow * b.w_stride;
          for (std::int64_t l0 = 0; l0 < a.lanes; l0 += kVec)
            f(in + l0, out + l0, std::min(kVec, a.lanes - l0));
        }
}

template <class T>
void forward(const MaxPoolShape& s, const T* src, T* dst, std::uint8_t* where) {
  const std::int64_t hs = s.src.h_stride, ws = s.src.w_stride, K = s.K;
  for_each_window(s, [&](std::int64_t in, std::int64_t out, std::int64_t width) {
    std::uint8_t* at = where ? where + out : nullptr;
    if (width == kVec) {
      pool_window<kVec>(src + in, hs, ws, K, dst + out, at);
    } else {
      for (std::int64_t l = 0; l < width; ++l)
        pool_window<1>(src + in + l, hs, ws, K, dst + out + l, at ? at + l : nullptr);
    }
  });
}

template <class T>
void backward(const MaxPoolShape& s, const std::uint8_t* where, const T* diff_dst, T* diff_src) {
  const PoolLayout& a = s.src;
  const std::int64_t hs = a.h_stride, ws = a.w_stride, K = s.K;
  for_each_window(s, [&](std::int64_t in, std::int64_t out, std::int64_t width) {
    if (width == kVec) {
      unpool_window<kVec>(diff_dst + out, where + out, hs, ws, K, diff_src + in);
    } else {
      for (std::int64_t l = 0; l < width; ++l)
        unpool_window<1>(diff_dst + out + l, where + out + l, hs, ws, K, diff_src + in + l);
    }
  });
  // Rows and columns past the last whole window take no gradient.
  const std::int64_t groups = s.C / a.lanes, H0 = s.OH() * K, W0 = s.OW() * K;
  if (H0 == s.IH && W0 == s.IW) return;
  for (std::int64_t n = 0; n < s.N; ++n)
    for (std::int64_t g = 0; g < groups; ++g)
      for (std::int64_t h = 0; h < s.IH; ++h)
        for (std::int64_t w = h < H0 ? W0 : 0; w < s.IW; ++w) {
          T* p = diff_src + n * a.n_stride + g * a.group_stride + h * hs + w * ws;
          std::fill(p, p + a.lanes, T{});
        }
}

}  // namespace

bool max_pool_supported(const MaxPoolShape& s) {
  const bool lanes = s.src.lanes >= 1 && s.src.lanes == s.dst.lanes && s.C % s.src.lanes == 0;
  return lanes && s.K >= 1 && s.K <= 15 && s.IH >= s.K && s.IW >= s.K && s.N >= 1;
}

void max_pool_forward(const MaxPoolShape& s, const float* src, float* dst, std::uint8_t* where) {
  forward(s, src, dst, where);
}
void max_pool_forward(const MaxPoolShape& s, const bf16* src, bf16* dst, std::uint8_t* where) {
  forward(s, src, dst, where);
}
void max_pool_backward(const MaxPoolShape& s, const std::uint8_t* where, const float* diff_dst,
                       float* diff_src) {
  backward(s, where, diff_dst, diff_src);
}
void max_pool_backward(const MaxPoolShape& s, const std::uint8_t* where, const bf16* diff_dst,
                       bf16* diff_src) {
  backward(s, where, diff_dst, diff_src);
}

}  // namespace cohort::nn
