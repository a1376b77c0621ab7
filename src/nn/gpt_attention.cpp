// Causal self-attention on AMX tiles; see cohort/nn/gpt_attention.hpp.
//
// AMX's TDPBF16PS multiplies a 16 x 32 bf16 tile A (row-major) by a 32 x 16 tile B held as 16
// rows of 16 pairs, B's rows 2k and 2k + 1 interleaved (row k of the tile: B[2k][n], B[2k+1][n]
// for n = 0..15), into 16 x 16 f32 sums. A head's operands are packed into such B tiles once a
// call (the keys transposed for q k^T, the values' row pairs interleaved for p v, ...), each 1 KB,
// tiles of one column block stored chunk after chunk so that a product walks them 1 KB apart.
// An A operand that is a transpose (ds^T, used^T) is packed the same way and each tile then
// transposed as 16 x 16 dwords, which turns interleaved row pairs into the A tile's rows.
//
// The causal structure: a query block of 16 rows needs the keys up to its last row, so the
// scores and dused are computed on the blocks at or below the diagonal (the softmax reads no
// other entry) and the products over keys stop at the chunk holding the diagonal; the entries
// past it are zeros the softmax wrote.
#include "cohort/nn/gpt_attention.hpp"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "cohort/core/cpu.hpp"
#include "cohort/core/error.hpp"
#include "cohort/nn/gpt_kernels.hpp"

#if defined(COHORT_X86_DISPATCH)
#include <immintrin.h>
#endif

namespace cohort::nn {

namespace attention_detail {

// Linux's arch_prctl codes: the process asks for AMX's tile data state once (since 5.16).
constexpr int kArchReqXcompPerm = 0x1023;
constexpr int kXfeatureXtiledata = 18;

bool tiles_permitted() {
  static const bool permitted =
      syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  return permitted;
}

// A head's scratch, on the calling thread: reused from call to call.
struct Scratch {
  std::vector<float> f;       // the scores forward, dused backward: (T, T)
  std::vector<bf16> ds;       // ds backward: (T, T)
  std::vector<bf16> pairs;    // ds's or used's row pairs before their tiles are transposed
  std::vector<bf16> packed[4];
  void fit(std::int64_t T, std::int64_t hs) {
    const auto tt = static_cast<std::size_t>(T * T), th = static_cast<std::size_t>(T * hs);
    if (f.size() < tt) f.resize(tt);
    if (ds.size() < tt) ds.resize(tt);
    if (pairs.size() < tt) pairs.resize(tt);
    for (auto& p : packed)
      if (p.size() < tt) p.resize(std::max(tt, th));
  }
};

Scratch& scratch(std::int64_t T, std::int64_t hs) {
  thread_local Scratch s;
  s.fit(T, hs);
  return s;
}

}  // namespace attention_detail

bool amx_attention_usable(std::int64_t T, std::int64_t hs) {
#if defined(COHORT_X86_DISPATCH)
  const CpuFeatures& f = cpu_features();
  return f.amx_bf16 && f.avx512_bf16_kernels() && T > 0 && T % 32 == 0 && T <= 1024 && hs > 0 &&
         hs % 32 == 0 && hs <= 256 && attention_detail::tiles_permitted();
#else
  (void)T;
  (void)hs;
  return false;
#endif
}

#if defined(COHORT_X86_DISPATCH)
COHORT_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16")
namespace amx {  // entered where amx_attention_usable (tests/build/check_baseline_isa.py)

using attention_detail::Scratch;

// Tiles 0 and 1 hold sums, 4 an A operand, 6 and 7 B operands; every tile 16 rows of 64 bytes.
struct alignas(64) TileConfig {
  std::uint8_t palette = 1, start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t bytes_per_row[16] = {64, 64, 0, 0, 64, 0, 64, 64};
  std::uint8_t rows[16] = {16, 16, 0, 0, 16, 0, 16, 16};
};

// The whole configuration as the instruction's memory operand (GCC 12's _tile_loadconfig names
// only its first 8 bytes, so the compiler may drop the stores of the rest).
inline void configure_tiles() {
  static const TileConfig config;
  __asm__ volatile("ldtilecfg %0" : : "m"(config));
}

// Vectors in GCC's vector extension, shuffled by __builtin_shufflevector: GCC 12's unmasked
// AVX-512 unpack and permute intrinsics start from an undefined vector, which
// -Wmaybe-uninitialized flags (gpt_kernels.cpp's gather says the same).
using D16 = std::uint32_t __attribute__((vector_size(64)));
using W32 = std::uint16_t __attribute__((vector_size(64)));

template <class V>
[[gnu::always_inline]] inline V load_vector(const void* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <class V>
[[gnu::always_inline]] inline void store_vector(void* p, V v) {
  std::memcpy(p, &v, sizeof v);
}

// 16 rows of 16 dwords (`ld` bytes apart) transposed into 16 rows 64 bytes apart.
inline void transpose16(const void* in, std::int64_t ld, void* out) {
  D16 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = load_vector<D16>(static_cast<const char*>(in) + i * ld);
  // Within each 128-bit lane L: rows 2i and 2i + 1 interleaved, columns 4L, 4L + 1 (t[2i]) and
  // 4L + 2, 4L + 3 (t[2i + 1]).
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = __builtin_shufflevector(r[2 * i], r[2 * i + 1], 0, 16, 1, 17, 4, 20, 5, 21, 8, 24,
                                       9, 25, 12, 28, 13, 29);
    t[2 * i + 1] = __builtin_shufflevector(r[2 * i], r[2 * i + 1], 2, 18, 3, 19, 6, 22, 7, 23, 10,
                                           26, 11, 27, 14, 30, 15, 31);
  }
  // r[4g + k]: in each lane L, column 4L + k of rows 4g .. 4g + 3.
  for (int g = 0; g < 4; ++g) {
    const D16 a = t[4 * g], b = t[4 * g + 1], c = t[4 * g + 2], d = t[4 * g + 3];
    r[4 * g] = __builtin_shufflevector(a, c, 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28,
                                       29);
    r[4 * g + 1] = __builtin_shufflevector(a, c, 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14,
                                           15, 30, 31);
    r[4 * g + 2] = __builtin_shufflevector(b, d, 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13,
                                           28, 29);
    r[4 * g + 3] = __builtin_shufflevector(b, d, 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14,
                                           15, 30, 31);
  }
  // Lanes 0 and 2 (even), 1 and 3 (odd) of two vectors, twice: the row of column c in r[c].
  for (int g = 0; g < 2; ++g)
    for (int k = 0; k < 4; ++k) {
      const D16 a = r[8 * g + k], b = r[8 * g + 4 + k];
      t[8 * g + k] = __builtin_shufflevector(a, b, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24,
                                             25, 26, 27);
      t[8 * g + 4 + k] = __builtin_shufflevector(a, b, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23,
                                                 28, 29, 30, 31);
    }
  for (int k = 0; k < 8; ++k) {
    const D16 a = t[k], b = t[8 + k];
    r[k] = __builtin_shufflevector(a, b, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
    r[8 + k] = __builtin_shufflevector(a, b, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29,
                                       30, 31);
  }
  for (int i = 0; i < 16; ++i) store_vector(static_cast<char*>(out) + i * 64, r[i]);
}

// B tiles of x^T for x (rows, cols) with rows `ld` elements apart: tile (n, c), at
// out + (n chunks + c) 512, holds x's rows 16 n .. 16 n + 15, columns 32 c .. 32 c + 31.
void pack_transposed(const bf16* x, std::int64_t ld, std::int64_t rows, std::int64_t cols,
                     bf16* out) {
  const std::int64_t chunks = cols / 32;
  for (std::int64_t n = 0; n < rows / 16; ++n)
    for (std::int64_t c = 0; c < chunks; ++c)
      transpose16(x + 16 * n * ld + 32 * c, ld * 2, out + (n * chunks + c) * 512);
}

// B tiles of x (rows, cols): tile (n, c), at out + (n chunks + c) 512, holds rows 32 c ..
// 32 c + 31 and columns 16 n .. 16 n + 15, rows paired. With `causal` (x (T, T), zero past the
// diagonal), only the tiles with an entry at or below it.
void pack_pairs(const bf16* x, std::int64_t ld, std::int64_t rows, std::int64_t cols, bf16* out,
                bool causal = false) {
  const std::int64_t chunks = rows / 32;
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::int64_t end = causal ? std::min(cols, 32 * c + 32) : cols;
    for (std::int64_t k = 0; k < 16; ++k) {
      const bf16* r0 = x + (32 * c + 2 * k) * ld;
      const bf16* r1 = r0 + ld;
      for (std::int64_t d = 0; d < end; d += 32) {
        // Lanes 2n and 2n + 1 of a tile's row: lane n of the first row and of the second.
        const W32 a = load_vector<W32>(r0 + d), b = load_vector<W32>(r1 + d);
        bf16* tile = out + ((d / 16) * chunks + c) * 512 + k * 32;
        store_vector(tile, __builtin_shufflevector(a, b, 0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37,
                                                   6, 38, 7, 39, 8, 40, 9, 41, 10, 42, 11, 43, 12,
                                                   44, 13, 45, 14, 46, 15, 47));
        store_vector(tile + chunks * 512,
                     __builtin_shufflevector(a, b, 16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53,
                                             22, 54, 23, 55, 24, 56, 25, 57, 26, 58, 27, 59, 28,
                                             60, 29, 61, 30, 62, 31, 63));
      }
    }
  }
}

// A tiles of x^T for x (T, T), zero past the diagonal: tile (m, c), at out + (m chunks + c) 512,
// holds x^T's rows 16 m .. 16 m + 15 (x's columns) and columns 32 c .. 32 c + 31 (x's rows); only
// the tiles c >= m / 2, which hold x's entries at or below the diagonal.
void pack_causal_transposed(const bf16* x, std::int64_t T, bf16* pairs, bf16* out) {
  pack_pairs(x, T, T, T, pairs, true);
  const std::int64_t chunks = T / 32;
  for (std::int64_t m = 0; m < T / 16; ++m)
    for (std::int64_t c = m / 2; c < chunks; ++c)
      transpose16(pairs + (m * chunks + c) * 512, 64, out + (m * chunks + c) * 512);
}

// Sums of 16 rows by 32 columns, or 16 (`two` false): the sum over chunks [c0, c1) of A tile k
// (at a + k a_step bytes, its rows lda bytes apart) times B tile k of two column blocks (the first
// at b, each chunk's 1 KB after the last; the second `next` bytes after the first), stored as f32
// rows ldc bytes apart.
[[gnu::always_inline]] inline void product(const char* a, std::int64_t lda, std::int64_t a_step,
                                           const bf16* b, std::int64_t next, bool two,
                                           std::int64_t c0, std::int64_t c1, float* c,
                                           std::int64_t ldc) {
  const char* b0 = reinterpret_cast<const char*>(b);
  _tile_zero(0);
  _tile_zero(1);
  for (std::int64_t k = c0; k < c1; ++k) {
    _tile_loadd(4, a + k * a_step, lda);
    _tile_loadd(6, b0 + k * 1024, 64);
    _tile_dpbf16ps(0, 4, 6);
    if (two) {
      _tile_loadd(7, b0 + k * 1024 + next, 64);
      _tile_dpbf16ps(1, 4, 7);
    }
  }
  _tile_stored(0, c, ldc);
  if (two) _tile_stored(1, c + 16, ldc);
}

// 16 rows of 32 sums (rows 32 floats apart) rounded to bf16 (to nearest even) into out, its rows
// ld elements apart.
inline void store_rows(const float* sums, bf16* out, std::int64_t ld) {
  for (int r = 0; r < 16; ++r) {
    const __m512 lo = _mm512_loadu_ps(sums + 32 * r), hi = _mm512_loadu_ps(sums + 32 * r + 16);
    _mm512_storeu_si512(out + r * ld, __builtin_bit_cast(__m512i, _mm512_cvtne2ps_pbh(hi, lo)));
  }
}

// out (T, hs) rows ld apart = A (T, T: a query block's A tile k at a + (row block) a_block +
// k a_step bytes, rows lda bytes apart) times B (T, hs) packed by pack_pairs, over the chunks
// [first(block), last(block)).
template <class First, class Last>
void rows_by_pairs(const char* a, std::int64_t a_block, std::int64_t lda, std::int64_t a_step,
                   const bf16* b, std::int64_t T, std::int64_t hs, First first, Last last,
                   bf16* out, std::int64_t ld) {
  alignas(64) float sums[16 * 32];
  const std::int64_t chunks = T / 32;
  for (std::int64_t i = 0; i < T / 16; ++i)
    for (std::int64_t n = 0; n < hs / 16; n += 2) {
      product(a + i * a_block, lda, a_step, b + n * chunks * 512, chunks * 1024, true, first(i),
              last(i), sums, 128);
      store_rows(sums, out + 16 * i * ld + 16 * n, ld);
    }
}

// f (T, T) f32 at and below the diagonal's blocks = x (T, hs) rows ld apart times y^T, y packed
// by pack_transposed.
void causal_scores(const bf16* x, std::int64_t ld, const bf16* yt, std::int64_t T,
                   std::int64_t hs, float* f) {
  const std::int64_t chunks = hs / 32;
  const char* a = reinterpret_cast<const char*>(x);
  for (std::int64_t i = 0; i < T / 16; ++i)
    for (std::int64_t j = 0; j <= i; j += 2)
      product(a + 16 * i * ld * 2, ld * 2, 64, yt + j * chunks * 512, chunks * 1024, j + 1 <= i, 0,
              chunks, f + 16 * i * T + 16 * j, T * 4);
}

void forward(const bf16* qkv, const float* mask, float* p, bf16* used, bf16* y,
             const AttentionShape& s, float scale, Scratch& w) {
  const std::int64_t T = s.T, hs = s.hs, C = s.H * s.hs, ld = 3 * C;
  bf16* kt = w.packed[0].data();
  bf16* vp = w.packed[1].data();
  configure_tiles();
  for (std::int64_t n = 0; n < s.N; ++n)
    for (std::int64_t h = 0; h < s.H; ++h) {
      const bf16* q = qkv + n * T * ld + h * hs;
      const std::int64_t head = (n * s.H + h) * T * T;
      bf16* u = used + head;
      pack_transposed(q + C, ld, T, hs, kt);
      pack_pairs(q + 2 * C, ld, T, hs, vp);
      causal_scores(q, ld, kt, T, hs, w.f.data());
      causal_softmax_forward(w.f.data(), p + head, mask ? mask + head : nullptr, u, 1, T, scale);
      rows_by_pairs(
          reinterpret_cast<const char*>(u), 16 * T * 2, T * 2, 64, vp, T, hs,
          [](std::int64_t) { return std::int64_t{0}; },
          [](std::int64_t i) { return (16 * i + 16 + 31) / 32; }, y + n * T * C + h * hs, C);
    }
  _tile_release();
}

void backward(const bf16* qkv, const float* p, const bf16* used, const float* mask,
              const bf16* dy, bf16* dqkv, const AttentionShape& s, float scale, Scratch& w) {
  const std::int64_t T = s.T, hs = s.hs, C = s.H * s.hs, ld = 3 * C, chunks = T / 32;
  bf16* vt = w.packed[0].data();  // B of dy v^T; then ds^T's A tiles
  bf16* kp = w.packed[1].data();  // B of ds k
  bf16* qp = w.packed[2].data();  // B of ds^T q
  bf16* yp = w.packed[3].data();  // B of used^T dy
  bf16* at = w.packed[0].data();
  configure_tiles();
  for (std::int64_t n = 0; n < s.N; ++n)
    for (std::int64_t h = 0; h < s.H; ++h) {
      const bf16* q = qkv + n * T * ld + h * hs;
      const bf16* g = dy + n * T * C + h * hs;
      bf16* dq = dqkv + n * T * ld + h * hs;
      const std::int64_t head = (n * s.H + h) * T * T;
      pack_transposed(q + 2 * C, ld, T, hs, vt);
      pack_pairs(q + C, ld, T, hs, kp);
      pack_pairs(q, ld, T, hs, qp);
      pack_pairs(g, C, T, hs, yp);
      causal_scores(g, C, vt, T, hs, w.f.data());
      causal_softmax_backward(p + head, w.f.data(), mask ? mask + head : nullptr, w.ds.data(), 1,
                              T, scale);
      // dq = ds k: a query block's keys up to the chunk of its diagonal.
      rows_by_pairs(
          reinterpret_cast<const char*>(w.ds.data()), 16 * T * 2, T * 2, 64, kp, T, hs,
          [](std::int64_t) { return std::int64_t{0}; },
          [](std::int64_t i) { return (16 * i + 16 + 31) / 32; }, dq, ld);
      // dk = ds^T q and dv = used^T dy: a key block's queries from the chunk of its diagonal.
      const auto from = [](std::int64_t i) { return i / 2; };
      const auto to = [chunks](std::int64_t) { return chunks; };
      pack_causal_transposed(w.ds.data(), T, w.pairs.data(), at);
      rows_by_pairs(reinterpret_cast<const char*>(at), chunks * 1024, 64, 1024, qp, T, hs, from,
                    to, dq + C, ld);
      pack_causal_transposed(used + head, T, w.pairs.data(), at);
      rows_by_pairs(reinterpret_cast<const char*>(at), chunks * 1024, 64, 1024, yp, T, hs, from,
                    to, dq + 2 * C, ld);
    }
  _tile_release();
}

}  // namespace amx
COHORT_TARGET_END
#endif

void amx_attention_forward(const bf16* qkv, const float* mask, float* p, bf16* used, bf16* y,
                           const AttentionShape& shape, float scale) {
#if defined(COHORT_X86_DISPATCH)
  if (amx_attention_usable(shape.T, shape.hs)) {
    amx::forward(qkv, mask, p, used, y, shape, scale,
                 attention_detail::scratch(shape.T, shape.hs));
    return;
  }
#endif
  (void)qkv, (void)mask, (void)p, (void)used, (void)y, (void)scale;
  COHORT_CHECK(false, "amx_attention_forward where amx_attention_usable is false");
}

void amx_attention_backward(const bf16* qkv, const float* p, const bf16* used, const float* mask,
                            const bf16* dy, bf16* dqkv, const AttentionShape& shape, float scale) {
#if defined(COHORT_X86_DISPATCH)
  if (amx_attention_usable(shape.T, shape.hs)) {
    amx::backward(qkv, p, used, mask, dy, dqkv, shape, scale,
                  attention_detail::scratch(shape.T, shape.hs));
    return;
  }
#endif
  (void)qkv, (void)p, (void)used, (void)mask, (void)dy, (void)dqkv, (void)scale;
  COHORT_CHECK(false, "amx_attention_backward where amx_attention_usable is false");
}

}  // namespace cohort::nn
