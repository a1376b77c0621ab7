// Causal self-attention as cohort's kernel; see cohort/nn/gpt/gpt_attention.hpp.
//
// Its products are those of AMX's TDPBF16PS, which multiplies a 16 x 32 bf16 tile A (row-major)
// by a 32 x 16 tile B held as 16 rows of 16 pairs, B's rows 2k and 2k + 1 interleaved (row k of
// the tile: B[2k][n], B[2k+1][n] for n = 0..15), into 16 x 16 f32 sums. A head's operands are
// packed into such B tiles once a call (the keys transposed for q k^T, the values' row pairs
// interleaved for p v, ...), each 1 KB, tiles of one column block stored chunk after chunk so that
// a product walks them 1 KB apart. An A operand that is a transpose (ds^T, used^T) is packed the
// same way and each tile then transposed as 16 x 16 dwords, which turns interleaved row pairs into
// the A tile's rows. Without AMX, AVX-512's VDPBF16PS computes the same products from the same
// packed tiles: a B tile's row k is one vector of 16 pairs, and row r of A's pair k, broadcast,
// multiplies it into row r's 16 sums.
//
// The causal structure: a query block of 16 rows needs the keys up to its last row, so the
// scores and dused are computed on the blocks at or below the diagonal (the softmax reads no
// other entry) and the products over keys stop at the chunk holding the diagonal; the entries
// past it are zeros the softmax wrote.
#include "cohort/nn/gpt/gpt_attention.hpp"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "cohort/core/cpu.hpp"
#include "cohort/core/error.hpp"
#include "gpt_lanes.hpp"

// The kernel is built by GCC only: clang 14 refuses its calls into gpt_lanes.hpp's vector helpers,
// which are compiled for the build's baseline, from the AVX-512 regions (a 64-byte vector crossing
// that ABI boundary is an error there). The clang builds (the tsan and fuzz presets) run attention
// on oneDNN's matmuls.
#if defined(COHORT_X86_DISPATCH) && !defined(__clang__)
#define COHORT_ATTENTION_KERNEL 1
#include <immintrin.h>
#endif

namespace cohort::nn {

namespace attention_detail {

bool tiles_permitted() {
#if defined(COHORT_ATTENTION_KERNEL) && defined(SYS_arch_prctl)
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

const char* attention_engine_name(AttentionEngine engine) {
  return engine == AttentionEngine::kAmx ? "amx" : "avx512_bf16";
}

bool attention_kernel_usable(AttentionEngine engine, std::int64_t T, std::int64_t hs) {
#if defined(COHORT_ATTENTION_KERNEL)
  const CpuFeatures& f = cpu_features();
  const bool shape = T > 0 && T % 32 == 0 && T <= 1024 && hs > 0 && hs % 32 == 0 && hs <= 256;
  if (!shape || !f.avx512_bf16_kernels()) return false;
  return engine == AttentionEngine::kAvx512Bf16 ||
         (f.amx_bf16 && attention_detail::tiles_permitted());
#else
  (void)engine, (void)T, (void)hs;
  return false;
#endif
}

std::optional<AttentionEngine> attention_kernel_engine(std::int64_t T, std::int64_t hs) {
  for (const AttentionEngine e : {AttentionEngine::kAmx, AttentionEngine::kAvx512Bf16})
    if (attention_kernel_usable(e, T, hs)) return e;
  return std::nullopt;
}

#if defined(COHORT_ATTENTION_KERNEL)
COHORT_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16")
namespace amx {  // entered where attention_kernel_usable (tests/build/check_baseline_isa.py)

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
inline void begin_products() {
  static const TileConfig config;
  __asm__ volatile("ldtilecfg %0" : : "m"(config));
}
inline void end_products() { _tile_release(); }

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

#include "gpt_attention_kernel.inc"

}  // namespace amx
COHORT_TARGET_END

COHORT_TARGET_AVX512_BF16_BEGIN
namespace avx512_bf16 {  // entered where attention_kernel_usable (check_baseline_isa.py)

using attention_detail::Scratch;

inline void begin_products() {}
inline void end_products() {}

// amx::product's sums with VDPBF16PS: R rows at a time (16 / R groups), R NB sums in registers,
// each pair k of the chunk one vector of B per column block and one broadcast pair of A per row.
template <int NB>
[[gnu::always_inline]] inline void product(const char* a, std::int64_t lda, std::int64_t a_step,
                                           const char* b, std::int64_t next, std::int64_t c0,
                                           std::int64_t c1, float* c, std::int64_t ldc) {
  static_assert(NB >= 1 && NB <= 4);
  constexpr int R = NB == 1 ? 16 : NB == 2 ? 8 : NB == 3 ? 8 : 4;
  for (int r0 = 0; r0 < 16; r0 += R) {
    __m512 acc[R][NB];
    for (int r = 0; r < R; ++r)
      for (int m = 0; m < NB; ++m) acc[r][m] = _mm512_setzero_ps();
    for (std::int64_t k = c0; k < c1; ++k) {
      const char* ak = a + k * a_step + r0 * lda;
      const char* bk = b + k * 1024;
      for (int p = 0; p < 16; ++p) {
        __m512bh bv[NB];
        for (int m = 0; m < NB; ++m)
          bv[m] = __builtin_bit_cast(__m512bh, _mm512_loadu_si512(bk + m * next + p * 64));
        for (int r = 0; r < R; ++r) {
          std::int32_t pair;
          std::memcpy(&pair, ak + r * lda + 4 * p, 4);
          const __m512bh av = __builtin_bit_cast(__m512bh, _mm512_set1_epi32(pair));
          for (int m = 0; m < NB; ++m) acc[r][m] = _mm512_dpbf16_ps(acc[r][m], av, bv[m]);
        }
      }
    }
    for (int r = 0; r < R; ++r)
      for (int m = 0; m < NB; ++m)
        _mm512_storeu_ps(reinterpret_cast<char*>(c) + (r0 + r) * ldc + 64 * m, acc[r][m]);
  }
}

#include "gpt_attention_kernel.inc"

}  // namespace avx512_bf16
COHORT_TARGET_END
#endif

void attention_kernel_forward(AttentionEngine engine, const bf16* qkv, const float* mask,
                              float* stats, bf16* y, const AttentionShape& shape, float scale) {
  COHORT_CHECK(attention_kernel_usable(engine, shape.T, shape.hs),
               "attention_kernel_forward where attention_kernel_usable is false");
#if defined(COHORT_ATTENTION_KERNEL)
  auto& w = attention_detail::scratch(shape.T, shape.hs);
  if (engine == AttentionEngine::kAmx)
    amx::forward(qkv, mask, stats, y, shape, scale, w);
  else
    avx512_bf16::forward(qkv, mask, stats, y, shape, scale, w);
#else
  (void)qkv, (void)mask, (void)stats, (void)y, (void)scale;
#endif
}

void attention_kernel_backward(AttentionEngine engine, const bf16* qkv, const float* stats,
                               const float* mask, const bf16* dy, bf16* dqkv,
                               const AttentionShape& shape, float scale) {
  COHORT_CHECK(attention_kernel_usable(engine, shape.T, shape.hs),
               "attention_kernel_backward where attention_kernel_usable is false");
#if defined(COHORT_ATTENTION_KERNEL)
  auto& w = attention_detail::scratch(shape.T, shape.hs);
  if (engine == AttentionEngine::kAmx)
    amx::backward(qkv, stats, mask, dy, dqkv, shape, scale, w);
  else
    avx512_bf16::backward(qkv, stats, mask, dy, dqkv, shape, scale, w);
#else
  (void)qkv, (void)stats, (void)mask, (void)dy, (void)dqkv, (void)scale;
#endif
}

}  // namespace cohort::nn
