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
#include "gpt_lanes.hpp"

// The kernel is built by GCC only: clang 14 refuses its calls into gpt_lanes.hpp's vector helpers,
// which are compiled for the build's baseline, from the AMX region (a 64-byte vector crossing that
// ABI boundary is an error there). The clang builds (the tsan and fuzz presets) run attention on
// oneDNN's matmuls.
#if defined(COHORT_X86_DISPATCH) && !defined(__clang__)
#define COHORT_AMX_ATTENTION 1
#include <immintrin.h>
#endif

namespace cohort::nn {

namespace attention_detail {

bool tiles_permitted() {
#if defined(COHORT_AMX_ATTENTION) && defined(SYS_arch_prctl)
  // Linux's arch_prctl codes: the process asks for AMX's tile data state once (since 5.16).
  constexpr int kArchReqXcompPerm = 0x1023;
  constexpr int kXfeatureXtiledata = 18;
  static const bool permitted = syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  return permitted;
#else
  return false;
#endif
}

// A head's scratch, on the calling thread: reused from call to call. f, fd: a query block's
// scores or weights and dused, (16, T); used and ds: the head's, (T, T); pairs: ds's or used's
// row pairs before their tiles are transposed; packed: a (T, hs) operand's B tiles each;
// transposed: ds^T's or used^T's A tiles, (T, T); sums: a block's products, (16, hs).
struct Scratch {
  std::vector<float> f, fd, sums;
  std::vector<bf16> used, ds, pairs, packed[5], transposed;
  void fit(std::int64_t T, std::int64_t hs) {
    const auto tt = static_cast<std::size_t>(T * T), th = static_cast<std::size_t>(T * hs);
    grow(f, static_cast<std::size_t>(16 * T));
    grow(fd, static_cast<std::size_t>(16 * T));
    grow(sums, static_cast<std::size_t>(16 * hs));
    for (auto* v : {&used, &ds, &pairs, &transposed}) grow(*v, tt);
    for (auto& p : packed) grow(p, th);
  }
  template <class V>
  static void grow(V& v, std::size_t n) {
    if (v.size() < n) v.resize(n);
  }
};

Scratch& scratch(std::int64_t T, std::int64_t hs) {
  thread_local Scratch s;
  s.fit(T, hs);
  return s;
}

}  // namespace attention_detail

bool amx_attention_usable(std::int64_t T, std::int64_t hs) {
#if defined(COHORT_AMX_ATTENTION)
  const CpuFeatures& f = cpu_features();
  return f.amx_bf16 && f.avx512_bf16_kernels() && T > 0 && T % 32 == 0 && T <= 1024 && hs > 0 &&
         hs % 32 == 0 && hs <= 256 && attention_detail::tiles_permitted();
#else
  (void)T;
  (void)hs;
  return false;
#endif
}

#if defined(COHORT_AMX_ATTENTION)
COHORT_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16")
namespace amx {  // entered where amx_attention_usable (tests/build/check_baseline_isa.py)

using attention_detail::Scratch;

// Tiles 0 to 3 hold sums, 4 an A operand, 6 and 7 B operands; each 16 rows of 64 bytes.
struct alignas(64) TileConfig {
  std::uint8_t palette = 1, start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t bytes_per_row[16] = {64, 64, 64, 64, 64, 0, 64, 64};
  std::uint8_t rows[16] = {16, 16, 16, 16, 16, 0, 16, 16};
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
    t[2 * i] = __builtin_shufflevector(r[2 * i], r[2 * i + 1], 0, 16, 1, 17, 4, 20, 5, 21, 8, 24, 9,
                                       25, 12, 28, 13, 29);
    t[2 * i + 1] = __builtin_shufflevector(r[2 * i], r[2 * i + 1], 2, 18, 3, 19, 6, 22, 7, 23, 10,
                                           26, 11, 27, 14, 30, 15, 31);
  }
  // r[4g + k]: in each lane L, column 4L + k of rows 4g .. 4g + 3.
  for (int g = 0; g < 4; ++g) {
    const D16 a = t[4 * g], b = t[4 * g + 1], c = t[4 * g + 2], d = t[4 * g + 3];
    r[4 * g] =
        __builtin_shufflevector(a, c, 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29);
    r[4 * g + 1] =
        __builtin_shufflevector(a, c, 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
    r[4 * g + 2] =
        __builtin_shufflevector(b, d, 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29);
    r[4 * g + 3] =
        __builtin_shufflevector(b, d, 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
  }
  // Lanes 0 and 2 (even), 1 and 3 (odd) of two vectors, twice: the row of column c in r[c].
  for (int g = 0; g < 2; ++g)
    for (int k = 0; k < 4; ++k) {
      const D16 a = r[8 * g + k], b = r[8 * g + 4 + k];
      t[8 * g + k] =
          __builtin_shufflevector(a, b, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
      t[8 * g + 4 + k] =
          __builtin_shufflevector(a, b, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    }
  for (int k = 0; k < 8; ++k) {
    const D16 a = t[k], b = t[8 + k];
    r[k] = __builtin_shufflevector(a, b, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
    r[8 + k] =
        __builtin_shufflevector(a, b, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
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
                                             22, 54, 23, 55, 24, 56, 25, 57, 26, 58, 27, 59, 28, 60,
                                             29, 61, 30, 62, 31, 63));
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

// Sums of 16 rows by 16 NB columns (NB column blocks, tiles 0 .. NB - 1): the sum over chunks
// [c0, c1) of A tile k (at a + k a_step bytes, its rows lda bytes apart) times B tile k of each
// column block (block m's at b + m next bytes, each chunk's 1 KB after the last), stored as f32
// rows ldc bytes apart.
template <int NB>
[[gnu::always_inline]] inline void product(const char* a, std::int64_t lda, std::int64_t a_step,
                                           const char* b, std::int64_t next, std::int64_t c0,
                                           std::int64_t c1, float* c, std::int64_t ldc) {
  static_assert(NB >= 1 && NB <= 4);
  _tile_zero(0);
  if constexpr (NB > 1) _tile_zero(1);
  if constexpr (NB > 2) _tile_zero(2);
  if constexpr (NB > 3) _tile_zero(3);
  for (std::int64_t k = c0; k < c1; ++k) {
    const char* bk = b + k * 1024;
    _tile_loadd(4, a + k * a_step, lda);
    _tile_loadd(6, bk, 64);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (NB > 1) {
      _tile_loadd(7, bk + next, 64);
      _tile_dpbf16ps(1, 4, 7);
    }
    if constexpr (NB > 2) {
      _tile_loadd(6, bk + 2 * next, 64);
      _tile_dpbf16ps(2, 4, 6);
    }
    if constexpr (NB > 3) {
      _tile_loadd(7, bk + 3 * next, 64);
      _tile_dpbf16ps(3, 4, 7);
    }
  }
  _tile_stored(0, c, ldc);
  if constexpr (NB > 1) _tile_stored(1, c + 16, ldc);
  if constexpr (NB > 2) _tile_stored(2, c + 32, ldc);
  if constexpr (NB > 3) _tile_stored(3, c + 48, ldc);
}

// product() over `blocks` column blocks, four at a time.
inline void products(const char* a, std::int64_t lda, std::int64_t a_step, const bf16* b,
                     std::int64_t next, std::int64_t blocks, std::int64_t c0, std::int64_t c1,
                     float* c, std::int64_t ldc) {
  const char* bb = reinterpret_cast<const char*>(b);
  std::int64_t m = 0;
  for (; m + 4 <= blocks; m += 4)
    product<4>(a, lda, a_step, bb + m * next, next, c0, c1, c + 16 * m, ldc);
  switch (blocks - m) {
    case 3:
      product<3>(a, lda, a_step, bb + m * next, next, c0, c1, c + 16 * m, ldc);
      break;
    case 2:
      product<2>(a, lda, a_step, bb + m * next, next, c0, c1, c + 16 * m, ldc);
      break;
    case 1:
      product<1>(a, lda, a_step, bb + m * next, next, c0, c1, c + 16 * m, ldc);
      break;
    default:
      break;
  }
}

// 16 rows of `cols` sums (rows `ld_sums` floats apart; cols a multiple of 32) rounded to bf16 (to
// nearest even) into out, its rows ld elements apart.
inline void store_rows(const float* sums, std::int64_t ld_sums, std::int64_t cols, bf16* out,
                       std::int64_t ld) {
  for (int r = 0; r < 16; ++r)
    for (std::int64_t d = 0; d < cols; d += 32) {
      const float* x = sums + r * ld_sums + d;
      const __m512 lo = _mm512_loadu_ps(x), hi = _mm512_loadu_ps(x + 16);
      _mm512_storeu_si512(out + r * ld + d,
                          __builtin_bit_cast(__m512i, _mm512_cvtne2ps_pbh(hi, lo)));
    }
}

using lanes::F16;
using lanes::U16;
constexpr std::int64_t kW = 16;

[[gnu::always_inline]] inline F16 select(U16 keep, F16 v, F16 other) { return keep ? v : other; }
[[gnu::always_inline]] inline U16 first_lanes(std::int64_t count) {
  const U16 lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  return lane < static_cast<std::uint32_t>(count);
}
// Sixteen lanes added pairwise, as eight twice (gpt_lanes.hpp's add_lanes).
[[gnu::always_inline]] inline float add16(F16 v) {
  const lanes::F8 lo = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7);
  const lanes::F8 hi = __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  return lanes::add_lanes(lo) + lanes::add_lanes(hi);
}
[[gnu::always_inline]] inline F16 fma16(F16 a, F16 b, F16 c) {
  return __builtin_bit_cast(
      F16, _mm512_fmadd_ps(__builtin_bit_cast(__m512, a), __builtin_bit_cast(__m512, b),
                           __builtin_bit_cast(__m512, c)));
}

// Query block i's scores (16 rows of f, T apart) = q's rows times k^T (packed by
// pack_transposed), on the key blocks up to the diagonal.
void block_scores(const bf16* q, std::int64_t ld, const bf16* kt, std::int64_t i, std::int64_t hs,
                  float* f, std::int64_t T) {
  const std::int64_t chunks = hs / 32;
  products(reinterpret_cast<const char*>(q + 16 * i * ld), ld * 2, 64, kt, chunks * 1024, i + 1, 0,
           chunks, f, T * 4);
}

// Query block i's 16 rows (row r: queries 16 i + r, its first 16 i + r + 1 entries unmasked) are
// i + 1 vectors of 16 lanes each, the last holding the diagonal: lanes 0 .. r of row r. The loops
// below walk them column of vectors by column, the 16 rows' work independent within a column.
[[gnu::always_inline]] inline U16 diagonal(std::int64_t r) { return first_lanes(r + 1); }

// Each row's largest score, scaled (scale > 0).
void block_tops(const float* f, std::int64_t T, std::int64_t i, float scale, float* tops) {
  F16 top[16];
  for (std::int64_t r = 0; r < 16; ++r) top[r] = lanes::splat<F16>(f[r * T]);
  for (std::int64_t j = 0; j <= i; ++j)
    for (std::int64_t r = 0; r < 16; ++r) {
      F16 v = lanes::load<F16>(f + r * T + 16 * j);
      if (j == i) v = select(diagonal(r), v, top[r]);
      top[r] = top[r] < v ? v : top[r];
    }
  for (std::int64_t r = 0; r < 16; ++r) {
    float t = top[r][0];
    for (int k = 1; k < kW; ++k) t = t < top[r][k] ? top[r][k] : t;
    tops[r] = t * scale;
  }
}

// e = exp(scale s - top) in place over each row's unmasked entries (the diagonal's vector written
// whole, its other lanes 0); with `sums`, each row's sum (its vectors added in order in 16 lanes,
// then the lanes pairwise). One function for forward and backward, so that both compute the same
// weights bit for bit.
[[gnu::noinline]] void block_exps(float* f, std::int64_t T, std::int64_t i, const float* tops,
                                  float* sums, float scale) {
  const F16 scale16 = lanes::splat<F16>(scale);
  F16 acc[16] = {};
  for (std::int64_t j = 0; j <= i; ++j)
    for (std::int64_t r = 0; r < 16; ++r) {
      float* x = f + r * T + 16 * j;
      F16 e =
          lanes::exp_nonpositive(fma16(lanes::load<F16>(x), scale16, lanes::splat<F16>(-tops[r])));
      if (j == i) e = select(diagonal(r), e, F16{});
      lanes::store(x, e);
      acc[r] += e;
    }
  if (sums)
    for (std::int64_t r = 0; r < 16; ++r) sums[r] = add16(acc[r]);
}

// p = e inv in place (kP: else not stored), and used = p mask (or p) rounded to bf16, 0 past the
// diagonal to the end of the 32-key chunk that holds it.
template <bool kP>
[[gnu::noinline]] void block_used(float* f, std::int64_t T, std::int64_t i, const float* invs,
                                  const float* mask, bf16* used) {
  for (std::int64_t j = 0; j <= i; ++j)
    for (std::int64_t r = 0; r < 16; ++r) {
      const std::int64_t at = r * T + 16 * j;
      const F16 v = lanes::load<F16>(f + at) * lanes::splat<F16>(invs[r]);  // 0 past the diagonal
      if constexpr (kP) lanes::store(f + at, v);
      F16 u = mask ? v * lanes::load<F16>(mask + at) : v;
      if (mask && j == i) u = select(diagonal(r), u, F16{});  // the mask past it is not read
      lanes::store(used + at, u);
    }
  if (i % 2 == 0)
    for (std::int64_t r = 0; r < 16; ++r) lanes::store(used + r * T + 16 * (i + 1), F16{});
}

// ds = scale p (d - sum_k p d) with d = dp mask (or dp) over each row's unmasked entries (p's
// rows T apart, dp's too), rounded to bf16 (16 rows T apart), 0 past the diagonal to the end of
// its chunk; the sums as block_exps's.
void block_ds(const float* p, const float* dp, std::int64_t T, std::int64_t i, const float* mask,
              float scale, bf16* ds) {
  auto d = [&](std::int64_t at) __attribute__((always_inline)) {
    const F16 g = lanes::load<F16>(dp + at);
    return mask ? g * lanes::load<F16>(mask + at) : g;
  };
  F16 acc[16] = {};
  for (std::int64_t j = 0; j <= i; ++j)
    for (std::int64_t r = 0; r < 16; ++r) {
      const std::int64_t at = r * T + 16 * j;
      F16 v = lanes::load<F16>(p + at) * d(at);
      if (j == i) v = select(diagonal(r), v, F16{});
      acc[r] += v;
    }
  float dot[16];
  for (std::int64_t r = 0; r < 16; ++r) dot[r] = add16(acc[r]);
  const F16 scale16 = lanes::splat<F16>(scale);
  for (std::int64_t j = 0; j <= i; ++j)
    for (std::int64_t r = 0; r < 16; ++r) {
      const std::int64_t at = r * T + 16 * j;
      F16 v = scale16 * lanes::load<F16>(p + at) * (d(at) - lanes::splat<F16>(dot[r]));
      if (j == i) v = select(diagonal(r), v, F16{});
      lanes::store(ds + at, v);
    }
  if (i % 2 == 0)
    for (std::int64_t r = 0; r < 16; ++r) lanes::store(ds + r * T + 16 * (i + 1), F16{});
}

// Query block i's weights from its scores in f (16 rows T apart; `mask` the block's rows or
// null), forward: used (16 rows T apart), each row's top and 1 / sum written to stats[2 r] and
// stats[2 r + 1].
void forward_weights(float* f, std::int64_t T, std::int64_t i, const float* mask, bf16* used,
                     float* stats, float scale) {
  float tops[16], sums[16], invs[16];
  block_tops(f, T, i, scale, tops);
  block_exps(f, T, i, tops, sums, scale);
  for (std::int64_t r = 0; r < 16; ++r) {
    invs[r] = 1.0f / sums[r];
    stats[2 * r] = tops[r];
    stats[2 * r + 1] = invs[r];
  }
  block_used<false>(f, T, i, invs, mask, used);
}

// The same backward from the forward's stats: used again, and p in f.
void backward_weights(float* f, std::int64_t T, std::int64_t i, const float* mask, bf16* used,
                      const float* stats, float scale) {
  float tops[16], invs[16];
  for (std::int64_t r = 0; r < 16; ++r) {
    tops[r] = stats[2 * r];
    invs[r] = stats[2 * r + 1];
  }
  block_exps(f, T, i, tops, nullptr, scale);
  block_used<true>(f, T, i, invs, mask, used);
}

void forward(const bf16* qkv, const float* mask, float* stats, bf16* y, const AttentionShape& s,
             float scale, Scratch& w) {
  const std::int64_t T = s.T, hs = s.hs, C = s.H * s.hs, ld = 3 * C, chunks = T / 32;
  bf16* kt = w.packed[0].data();
  bf16* vp = w.packed[1].data();
  float* f = w.f.data();
  bf16* used = w.used.data();
  float* sums = w.sums.data();
  configure_tiles();
  for (std::int64_t n = 0; n < s.N; ++n)
    for (std::int64_t h = 0; h < s.H; ++h) {
      const bf16* q = qkv + n * T * ld + h * hs;
      const std::int64_t head = (n * s.H + h) * T;
      pack_transposed(q + C, ld, T, hs, kt);
      pack_pairs(q + 2 * C, ld, T, hs, vp);
      for (std::int64_t i = 0; i < T / 16; ++i) {
        block_scores(q, ld, kt, i, hs, f, T);
        forward_weights(f, T, i, mask ? mask + (head + 16 * i) * T : nullptr, used,
                        stats + 2 * (head + 16 * i), scale);
        // y = used v over the keys up to the chunk of the diagonal.
        products(reinterpret_cast<const char*>(used), T * 2, 64, vp, chunks * 1024, hs / 16, 0,
                 (16 * i + 16 + 31) / 32, sums, hs * 4);
        store_rows(sums, hs, hs, y + (n * T + 16 * i) * C + h * hs, C);
      }
    }
  _tile_release();
}

void backward(const bf16* qkv, const float* stats, const float* mask, const bf16* dy, bf16* dqkv,
              const AttentionShape& s, float scale, Scratch& w) {
  const std::int64_t T = s.T, hs = s.hs, C = s.H * s.hs, ld = 3 * C, chunks = T / 32;
  const std::int64_t hchunks = hs / 32;
  bf16* kt = w.packed[0].data();   // B of q k^T
  bf16* vt = w.packed[1].data();   // B of dy v^T
  bf16* kp = w.packed[2].data();   // B of ds k
  bf16* qp = w.packed[3].data();   // B of ds^T q
  bf16* yp = w.packed[4].data();   // B of used^T dy
  bf16* at = w.transposed.data();  // A tiles of ds^T, then of used^T
  float* f = w.f.data();
  float* fd = w.fd.data();
  float* sums = w.sums.data();
  configure_tiles();
  for (std::int64_t n = 0; n < s.N; ++n)
    for (std::int64_t h = 0; h < s.H; ++h) {
      const bf16* q = qkv + n * T * ld + h * hs;
      const bf16* g = dy + n * T * C + h * hs;
      bf16* dq = dqkv + n * T * ld + h * hs;
      const std::int64_t head = (n * s.H + h) * T;
      pack_transposed(q + C, ld, T, hs, kt);
      pack_transposed(q + 2 * C, ld, T, hs, vt);
      pack_pairs(q + C, ld, T, hs, kp);
      pack_pairs(q, ld, T, hs, qp);
      pack_pairs(g, C, T, hs, yp);
      for (std::int64_t i = 0; i < T / 16; ++i) {
        // The forward's weights again (the same bits: its top and 1 / sum, the same loops).
        const float* mi = mask ? mask + (head + 16 * i) * T : nullptr;
        bf16* ui = w.used.data() + 16 * i * T;
        bf16* di = w.ds.data() + 16 * i * T;
        block_scores(q, ld, kt, i, hs, f, T);
        backward_weights(f, T, i, mi, ui, stats + 2 * (head + 16 * i), scale);
        // dused = dy v^T on the key blocks up to the diagonal, then ds.
        products(reinterpret_cast<const char*>(g + 16 * i * C), C * 2, 64, vt, hchunks * 1024,
                 i + 1, 0, hchunks, fd, T * 4);
        const std::int64_t end = (16 * i + 16 + 31) / 32 * 32;
        block_ds(f, fd, T, i, mi, scale, di);
        // dq = ds k over the keys up to the chunk of the diagonal.
        products(reinterpret_cast<const char*>(di), T * 2, 64, kp, chunks * 1024, hs / 16, 0,
                 end / 32, sums, hs * 4);
        store_rows(sums, hs, hs, dq + 16 * i * ld, ld);
      }
      // dk = ds^T q and dv = used^T dy: a key block's queries from the chunk of its diagonal.
      pack_causal_transposed(w.ds.data(), T, w.pairs.data(), at);
      for (std::int64_t m = 0; m < T / 16; ++m) {
        products(reinterpret_cast<const char*>(at + m * chunks * 512), 64, 1024, qp, chunks * 1024,
                 hs / 16, m / 2, chunks, sums, hs * 4);
        store_rows(sums, hs, hs, dq + C + 16 * m * ld, ld);
      }
      pack_causal_transposed(w.used.data(), T, w.pairs.data(), at);
      for (std::int64_t m = 0; m < T / 16; ++m) {
        products(reinterpret_cast<const char*>(at + m * chunks * 512), 64, 1024, yp, chunks * 1024,
                 hs / 16, m / 2, chunks, sums, hs * 4);
        store_rows(sums, hs, hs, dq + 2 * C + 16 * m * ld, ld);
      }
    }
  _tile_release();
}

}  // namespace amx
COHORT_TARGET_END
#endif

void amx_attention_forward(const bf16* qkv, const float* mask, float* stats, bf16* y,
                           const AttentionShape& shape, float scale) {
#if defined(COHORT_AMX_ATTENTION)
  if (amx_attention_usable(shape.T, shape.hs)) {
    amx::forward(qkv, mask, stats, y, shape, scale, attention_detail::scratch(shape.T, shape.hs));
    return;
  }
#endif
  (void)qkv, (void)mask, (void)stats, (void)y, (void)shape, (void)scale;
  COHORT_CHECK(false, "amx_attention_forward where amx_attention_usable is false");
}

void amx_attention_backward(const bf16* qkv, const float* stats, const float* mask, const bf16* dy,
                            bf16* dqkv, const AttentionShape& shape, float scale) {
#if defined(COHORT_AMX_ATTENTION)
  if (amx_attention_usable(shape.T, shape.hs)) {
    amx::backward(qkv, stats, mask, dy, dqkv, shape, scale,
                  attention_detail::scratch(shape.T, shape.hs));
    return;
  }
#endif
  (void)qkv, (void)stats, (void)mask, (void)dy, (void)dqkv, (void)shape, (void)scale;
  COHORT_CHECK(false, "amx_attention_backward where amx_attention_usable is false");
}

}  // namespace cohort::nn
