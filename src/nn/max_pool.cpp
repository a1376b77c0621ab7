// Max pooling on channel-innermost layouts; see include/cohort/nn/max_pool.hpp. One window at a
// time, its lanes 16 at a time in vector types (bf16 widened to f32 on load; the maximum's bits
// are an input's, so the store is exact), a lane count that is no multiple of 16 lane by lane.
#include "cohort/nn/max_pool.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>

namespace cohort::nn {

namespace {

constexpr std::int64_t kVec = 16;  // lanes per vector step: one zmm of f32

// 16 lanes as GCC/Clang vector types: the compiler maps them onto the target's registers (one
// zmm on AVX-512, two ymm on AVX2). Written out because GCC's vectorizer kept the select of
// the backward scalar, lane by lane, inside the trainer's build. Values travel as their f32
// bits; a bf16 lane is widened to the upper half and narrowed back exactly.
using i32x16 = std::int32_t __attribute__((vector_size(64)));
using u32x16 = std::uint32_t __attribute__((vector_size(64)));
using f32x16 = float __attribute__((vector_size(64)));
using u16x16 = std::uint16_t __attribute__((vector_size(32)));
using u8x16 = std::uint8_t __attribute__((vector_size(16)));

inline i32x16 load16(const float* p) {
  i32x16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline i32x16 load16(const bf16* p) {
  u16x16 h;
  std::memcpy(&h, p, sizeof h);
  return __builtin_convertvector(h, i32x16) << 16;
}
inline void store16(float* p, i32x16 bits) { std::memcpy(p, &bits, sizeof bits); }
inline void store16(bf16* p, i32x16 bits) {
  const u16x16 h = __builtin_convertvector(std::bit_cast<u32x16>(bits) >> 16, u16x16);
  std::memcpy(p, &h, sizeof h);
}

// Bit 7 of a window index: ReLU zeroed the window's output. No window position (below K * K <=
// 128) equals such an index, so backward routes nothing from it: ReLU's backward for free.
constexpr std::int32_t kReluZeroed = 0x80;

// One window's 16 lanes: the first maximal element of each lane (a NaN counts as maximal, and
// the first NaN stays), its value to out (through ReLU with `relu`: +0 unless above 0 or NaN)
// and its window index to at (unless null).
// KFixed: the window's side known at compile time (2, the common pooling: the loops unrolled,
// no index arithmetic left at run time; the public functions pick it), or 0 for any K.
template <class T, std::int64_t KFixed>
void pool16(const T* in, std::int64_t h_stride, std::int64_t w_stride, std::int64_t K_any,
            bool relu, T* out, std::uint8_t* at) {
  const std::int64_t K = KFixed ? KFixed : K_any;
  i32x16 best = {};
  best += std::bit_cast<std::int32_t>(-std::numeric_limits<float>::infinity());
  i32x16 index = {};
  for (std::int64_t kh = 0; kh < K; ++kh)
    for (std::int64_t kw = 0; kw < K; ++kw) {
      const i32x16 v = load16(in + kh * h_stride + kw * w_stride);
      const f32x16 fv = std::bit_cast<f32x16>(v);
      const f32x16 fb = std::bit_cast<f32x16>(best);
      const i32x16 take = ~(fv <= fb) & (fb == fb);  // greater, or the first NaN
      best = (v & take) | (best & ~take);
      index = (static_cast<std::int32_t>(kh * K + kw) & take) | (index & ~take);
    }
  if (relu) {
    const f32x16 fb = std::bit_cast<f32x16>(best);
    const i32x16 pass = (fb > 0.0f) | (fb != fb);  // above 0, or NaN (a fault is kept)
    best &= pass;                                  // +0 elsewhere
    index |= kReluZeroed & ~pass;
  }
  store16(out, best);
  if (at) {
    const u8x16 bytes = __builtin_convertvector(index, u8x16);
    std::memcpy(at, &bytes, sizeof bytes);
  }
}

// 16 window indices widened to 32-bit lanes in two steps (bytes to 16 bits to 32): GCC 12
// turned the one-step conversion into a byte-by-byte extraction, 40-odd instructions a window.
inline i32x16 load_index16(const std::uint8_t* at) {
  u8x16 bytes;
  std::memcpy(&bytes, at, sizeof bytes);
  return __builtin_convertvector(__builtin_convertvector(bytes, u16x16), i32x16);
}

// One window's 16 lanes backward: each element gets its lane's gradient where it was the
// maximum, zero elsewhere. KFixed: as pool16.
template <class T, std::int64_t KFixed>
void unpool16(const T* diff_dst, const std::uint8_t* at, std::int64_t h_stride,
              std::int64_t w_stride, std::int64_t K_any, T* diff_src) {
  const std::int64_t K = KFixed ? KFixed : K_any;
  const i32x16 index = load_index16(at), grad = load16(diff_dst);
  for (std::int64_t kh = 0; kh < K; ++kh)
    for (std::int64_t kw = 0; kw < K; ++kw)
      store16(diff_src + kh * h_stride + kw * w_stride,
              grad & (index == static_cast<std::int32_t>(kh * K + kw)));
}

inline float load(const float* p) { return *p; }
inline float load(const bf16* p) { return to_float(*p); }
inline void store(float* p, float v) { *p = v; }
inline void store(bf16* p, float v) {  // v is a widened bf16: its upper half is exact
  p->bits = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(v) >> 16);
}

// One lane of a window (lane counts that are not a multiple of 16): as pool16.
template <class T>
void pool_lane(const T* in, std::int64_t h_stride, std::int64_t w_stride, std::int64_t K, bool relu,
               T* out, std::uint8_t* at) {
  float best = -std::numeric_limits<float>::infinity();
  std::uint8_t index = 0;
  for (std::int64_t kh = 0; kh < K; ++kh)
    for (std::int64_t kw = 0; kw < K; ++kw) {
      const float v = load(in + kh * h_stride + kw * w_stride);
      if (!(v <= best) && best == best) {
        best = v;
        index = static_cast<std::uint8_t>(kh * K + kw);
      }
    }
  if (relu && !(best > 0.0f) && best == best) {
    best = 0.0f;
    index |= kReluZeroed;
  }
  store(out, best);
  if (at) *at = index;
}

template <class T>
void unpool_lane(const T* diff_dst, const std::uint8_t* at, std::int64_t h_stride,
                 std::int64_t w_stride, std::int64_t K, T* diff_src) {
  for (std::int64_t k = 0; k < K * K; ++k)
    diff_src[k / K * h_stride + k % K * w_stride] = k == *at ? *diff_dst : T{};
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

template <class T, std::int64_t KFixed>
void forward(const MaxPoolShape& s, const T* src, T* dst, std::uint8_t* where) {
  const std::int64_t hs = s.src.h_stride, ws = s.src.w_stride, K = s.K;
  const bool relu = s.relu;
  for_each_window(s, [&](std::int64_t in, std::int64_t out, std::int64_t width) {
    std::uint8_t* at = where ? where + out : nullptr;
    if (width == kVec) {
      pool16<T, KFixed>(src + in, hs, ws, K, relu, dst + out, at);
    } else {
      for (std::int64_t l = 0; l < width; ++l)
        pool_lane(src + in + l, hs, ws, K, relu, dst + out + l, at ? at + l : nullptr);
    }
  });
}

template <class T, std::int64_t KFixed>
void backward(const MaxPoolShape& s, const std::uint8_t* where, const T* diff_dst, T* diff_src) {
  const PoolLayout& a = s.src;
  const std::int64_t hs = a.h_stride, ws = a.w_stride, K = s.K;
  for_each_window(s, [&](std::int64_t in, std::int64_t out, std::int64_t width) {
    if (width == kVec) {
      unpool16<T, KFixed>(diff_dst + out, where + out, hs, ws, K, diff_src + in);
    } else {
      for (std::int64_t l = 0; l < width; ++l)
        unpool_lane(diff_dst + out + l, where + out + l, hs, ws, K, diff_src + in + l);
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
  const bool index_fits = s.K <= 15 && (!s.relu || s.K * s.K <= kReluZeroed);
  return lanes && s.K >= 1 && index_fits && s.IH >= s.K && s.IW >= s.K && s.N >= 1;
}

void max_pool_forward(const MaxPoolShape& s, const float* src, float* dst, std::uint8_t* where) {
  s.K == 2 ? forward<float, 2>(s, src, dst, where) : forward<float, 0>(s, src, dst, where);
}
void max_pool_forward(const MaxPoolShape& s, const bf16* src, bf16* dst, std::uint8_t* where) {
  s.K == 2 ? forward<bf16, 2>(s, src, dst, where) : forward<bf16, 0>(s, src, dst, where);
}
void max_pool_backward(const MaxPoolShape& s, const std::uint8_t* where, const float* diff_dst,
                       float* diff_src) {
  s.K == 2 ? backward<float, 2>(s, where, diff_dst, diff_src)
           : backward<float, 0>(s, where, diff_dst, diff_src);
}
void max_pool_backward(const MaxPoolShape& s, const std::uint8_t* where, const bf16* diff_dst,
                       bf16* diff_src) {
  s.K == 2 ? backward<bf16, 2>(s, where, diff_dst, diff_src)
           : backward<bf16, 0>(s, where, diff_dst, diff_src);
}

}  // namespace cohort::nn
