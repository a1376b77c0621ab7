// Causal attention's six products in f32, cohort's own (see gpt_kernels.hpp for why): per window
// and head, each operand read with its row stride is packed into a contiguous (or transposed)
// buffer, then a kernel of two rows by up to 32 columns keeps its sums in eight vectors and walks
// the causal triangle only.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "cohort/core/cpu.hpp"
#include "cohort/nn/gpt_kernels.hpp"
#include "vec8.hpp"

namespace cohort::nn {

namespace {

using detail::F8;
using detail::load8;
using detail::store8;

// Where head h of window n starts in the plan's layouts.
struct Head {
  const AttentionShape& s;
  std::int64_t n, h;
  std::int64_t qkv(std::int64_t which) const {  // which: 0 q, 1 k, 2 v
    return n * s.T * 3 * s.C() + which * s.C() + h * s.hs;
  }
  std::int64_t y() const { return n * s.T * s.C() + h * s.hs; }
  std::int64_t scores() const { return (n * s.H + h) * s.T * s.T; }
};

// rows (T, hs) of stride ld into `to`, contiguous.
void pack(const float* from, std::int64_t ld, std::int64_t T, std::int64_t hs, float* to) {
  for (std::int64_t t = 0; t < T; ++t) std::copy_n(from + t * ld, hs, to + t * hs);
}

// rows (T, hs) of stride ld into `to` transposed, (hs, T).
void pack_transposed(const float* from, std::int64_t ld, std::int64_t T, std::int64_t hs,
                     float* to) {
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t e = 0; e < hs; ++e) to[e * T + t] = from[t * ld + e];
}

// C[i][j] = scale sum_k A[i][k] Bt[k][j] for rows i, i + 1 and NV chunks of 8 columns from j0.
template <int NV>
[[gnu::always_inline]] inline void abt_block(const float* a0, const float* a1, const float* bt,
                                             std::int64_t T, std::int64_t K, float scale, float* c0,
                                             float* c1) {
  F8 s0[NV] = {}, s1[NV] = {};
  for (std::int64_t k = 0; k < K; ++k) {
    const float x = a0[k], y = a1[k];
    for (int v = 0; v < NV; ++v) {
      const F8 b = load8(bt + k * T + 8 * v);
      s0[v] += x * b;
      s1[v] += y * b;
    }
  }
  for (int v = 0; v < NV; ++v) {
    store8(c0 + 8 * v, s0[v] * scale);
    store8(c1 + 8 * v, s1[v] * scale);
  }
}

// C (T, T; ld T) = scale A B^T on and below the diagonal, A rows of stride lda, Bt = B^T (K, T).
// Columns go in chunks of 8, so a row also gets the entries up to its chunk's end.
void abt_causal(const float* a, std::int64_t lda, const float* bt, std::int64_t T, std::int64_t K,
                float scale, float* c) {
  for (std::int64_t i = 0; i < T; i += 2) {
    const std::int64_t chunks = (i + 2 + 7) / 8;  // columns 0 .. i + 1
    for (std::int64_t g = 0; g < chunks; g += 4) {
      const float* a0 = a + i * lda;
      const float* bg = bt + 8 * g;
      float* c0 = c + i * T + 8 * g;
      switch (std::min<std::int64_t>(4, chunks - g)) {
        case 1:
          abt_block<1>(a0, a0 + lda, bg, T, K, scale, c0, c0 + T);
          break;
        case 2:
          abt_block<2>(a0, a0 + lda, bg, T, K, scale, c0, c0 + T);
          break;
        case 3:
          abt_block<3>(a0, a0 + lda, bg, T, K, scale, c0, c0 + T);
          break;
        default:
          abt_block<4>(a0, a0 + lda, bg, T, K, scale, c0, c0 + T);
          break;
      }
    }
  }
}

// Rows i, i + 1 of C = scale P B over NV chunks of 8 columns: sum_{j <= i} P[i][j] B[j] (row
// i + 1 also takes j = i + 1), j ascending. B (T, K) contiguous, offset to the chunks.
template <int NV>
[[gnu::always_inline]] inline void ab_block(const float* p0, const float* p1, const float* b,
                                            std::int64_t K, std::int64_t i, float scale, float* c0,
                                            float* c1) {
  F8 s0[NV] = {}, s1[NV] = {};
  for (std::int64_t j = 0; j <= i; ++j) {
    const float x = p0[j], y = p1[j];
    for (int v = 0; v < NV; ++v) {
      const F8 bv = load8(b + j * K + 8 * v);
      s0[v] += x * bv;
      s1[v] += y * bv;
    }
  }
  const float y = p1[i + 1];
  for (int v = 0; v < NV; ++v) s1[v] += y * load8(b + (i + 1) * K + 8 * v);
  for (int v = 0; v < NV; ++v) {
    store8(c0 + 8 * v, s0[v] * scale);
    store8(c1 + 8 * v, s1[v] * scale);
  }
}

// C (T, K; ld ldc) = scale P B, P (T, T; ld T) causal (P[i][j] = 0 for j > i, not read).
void ab_causal(const float* p, const float* b, std::int64_t T, std::int64_t K, float scale,
               float* c, std::int64_t ldc) {
  for (std::int64_t i = 0; i < T; i += 2)
    for (std::int64_t g = 0; g < K / 8; g += 4) {
      const float* p0 = p + i * T;
      float* c0 = c + i * ldc + 8 * g;
      switch (std::min<std::int64_t>(4, K / 8 - g)) {
        case 1:
          ab_block<1>(p0, p0 + T, b + 8 * g, K, i, scale, c0, c0 + ldc);
          break;
        case 2:
          ab_block<2>(p0, p0 + T, b + 8 * g, K, i, scale, c0, c0 + ldc);
          break;
        case 3:
          ab_block<3>(p0, p0 + T, b + 8 * g, K, i, scale, c0, c0 + ldc);
          break;
        default:
          ab_block<4>(p0, p0 + T, b + 8 * g, K, i, scale, c0, c0 + ldc);
          break;
      }
    }
}

// Rows j, j + 1 of C = scale P^T B over NV chunks of 8 columns: sum_{i >= j} P[i][j] B[i] (row
// j + 1 from i = j + 1), i ascending.
template <int NV>
[[gnu::always_inline]] inline void atb_block(const float* p, const float* b, std::int64_t T,
                                             std::int64_t K, std::int64_t j, float scale, float* c0,
                                             float* c1) {
  F8 s0[NV], s1[NV] = {};
  const float first = p[j * T + j];
  for (int v = 0; v < NV; ++v) s0[v] = first * load8(b + j * K + 8 * v);
  for (std::int64_t i = j + 1; i < T; ++i) {
    const float x = p[i * T + j], y = p[i * T + j + 1];
    for (int v = 0; v < NV; ++v) {
      const F8 bv = load8(b + i * K + 8 * v);
      s0[v] += x * bv;
      s1[v] += y * bv;
    }
  }
  for (int v = 0; v < NV; ++v) {
    store8(c0 + 8 * v, s0[v] * scale);
    store8(c1 + 8 * v, s1[v] * scale);
  }
}

// C (T, K; ld ldc) = scale P^T B, P (T, T; ld T) causal (entries above the diagonal not read).
void atb_causal(const float* p, const float* b, std::int64_t T, std::int64_t K, float scale,
                float* c, std::int64_t ldc) {
  for (std::int64_t j = 0; j < T; j += 2)
    for (std::int64_t g = 0; g < K / 8; g += 4) {
      float* c0 = c + j * ldc + 8 * g;
      switch (std::min<std::int64_t>(4, K / 8 - g)) {
        case 1:
          atb_block<1>(p, b + 8 * g, T, K, j, scale, c0, c0 + ldc);
          break;
        case 2:
          atb_block<2>(p, b + 8 * g, T, K, j, scale, c0, c0 + ldc);
          break;
        case 3:
          atb_block<3>(p, b + 8 * g, T, K, j, scale, c0, c0 + ldc);
          break;
        default:
          atb_block<4>(p, b + 8 * g, T, K, j, scale, c0, c0 + ldc);
          break;
      }
    }
}

}  // namespace

bool attention_kernels_fit(std::int64_t T, std::int64_t hs) {
  return T > 0 && hs > 0 && T % 8 == 0 && hs % 8 == 0;
}

COHORT_CLONES_AVX512
void attention_scores(const float* qkv, float* s, const AttentionShape& a, float scale) {
  std::vector<float> kt(static_cast<std::size_t>(a.hs * a.T));
  for (std::int64_t n = 0; n < a.N; ++n)
    for (std::int64_t h = 0; h < a.H; ++h) {
      const Head at{a, n, h};
      pack_transposed(qkv + at.qkv(1), 3 * a.C(), a.T, a.hs, kt.data());
      abt_causal(qkv + at.qkv(0), 3 * a.C(), kt.data(), a.T, a.hs, scale, s + at.scores());
    }
}

COHORT_CLONES_AVX512
void attention_values(const float* p, const float* qkv, float* y, const AttentionShape& a) {
  std::vector<float> v(static_cast<std::size_t>(a.T * a.hs));
  for (std::int64_t n = 0; n < a.N; ++n)
    for (std::int64_t h = 0; h < a.H; ++h) {
      const Head at{a, n, h};
      pack(qkv + at.qkv(2), 3 * a.C(), a.T, a.hs, v.data());
      ab_causal(p + at.scores(), v.data(), a.T, a.hs, 1.0f, y + at.y(), a.C());
    }
}

COHORT_CLONES_AVX512
void attention_grad_weights(const float* dy, const float* qkv, float* dp, const AttentionShape& a) {
  std::vector<float> vt(static_cast<std::size_t>(a.hs * a.T));
  for (std::int64_t n = 0; n < a.N; ++n)
    for (std::int64_t h = 0; h < a.H; ++h) {
      const Head at{a, n, h};
      pack_transposed(qkv + at.qkv(2), 3 * a.C(), a.T, a.hs, vt.data());
      abt_causal(dy + at.y(), a.C(), vt.data(), a.T, a.hs, 1.0f, dp + at.scores());
    }
}

COHORT_CLONES_AVX512
void attention_grad_values(const float* p, const float* dy, float* dqkv, const AttentionShape& a) {
  std::vector<float> g(static_cast<std::size_t>(a.T * a.hs));
  for (std::int64_t n = 0; n < a.N; ++n)
    for (std::int64_t h = 0; h < a.H; ++h) {
      const Head at{a, n, h};
      pack(dy + at.y(), a.C(), a.T, a.hs, g.data());
      atb_causal(p + at.scores(), g.data(), a.T, a.hs, 1.0f, dqkv + at.qkv(2), 3 * a.C());
    }
}

COHORT_CLONES_AVX512
void attention_grad_queries_keys(const float* ds, const float* qkv, float* dqkv,
                                 const AttentionShape& a, float scale) {
  std::vector<float> m(static_cast<std::size_t>(a.T * a.hs));
  for (std::int64_t n = 0; n < a.N; ++n)
    for (std::int64_t h = 0; h < a.H; ++h) {
      const Head at{a, n, h};
      pack(qkv + at.qkv(1), 3 * a.C(), a.T, a.hs, m.data());
      ab_causal(ds + at.scores(), m.data(), a.T, a.hs, scale, dqkv + at.qkv(0), 3 * a.C());
      pack(qkv + at.qkv(0), 3 * a.C(), a.T, a.hs, m.data());
      atb_causal(ds + at.scores(), m.data(), a.T, a.hs, scale, dqkv + at.qkv(1), 3 * a.C());
    }
}

}  // namespace cohort::nn
