// A language model's LayerNorm as cohort's loops (bf16 plans; see cohort/nn/gpt/gpt_kernels.hpp and
// docs/decisions.md, "LayerNorm in bf16 as cohort's loop"), and the linear layers' bias gradients.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cohort/core/cpu.hpp"
#include "cohort/nn/gpt/gpt_kernels.hpp"
#include "gpt_lanes.hpp"

namespace cohort::nn {

namespace lanes {

// LayerNorm's rows, R at a time: each row's sums in eight lanes (j mod 8) added pairwise, then
// the remainder. A row's sums are chains of dependent additions (a row of 128 floats: 16 of
// them), so the R rows' chains are interleaved; each row's operations, and so its bits, are those
// of one row alone. Each lane of dgamma adds the rows' terms in row order.
template <int R, class Out>
[[gnu::always_inline]] inline void layer_norm_group(const float* x, const float* gamma,
                                                    const float* beta, Out* y, float* mean,
                                                    float* rstd, std::int64_t C, float eps) {
  const float inv_c = 1.0f / static_cast<float>(C);
  const std::int64_t whole = C / 8 * 8;
  F8 acc[R];
  float mu[R], rs[R];
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i) acc[i] = F8{};
  for (std::int64_t j = 0; j < whole; j += 8)
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i) acc[i] += load8(x + i * C + j);
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i) {
    float rest = 0.0f;
    for (std::int64_t j = whole; j < C; ++j) rest += x[i * C + j];
    mu[i] = (add_lanes(acc[i]) + rest) * inv_c;
    acc[i] = F8{};
  }
  for (std::int64_t j = 0; j < whole; j += 8)
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i) {
      const F8 d = load8(x + i * C + j) - mu[i];
      acc[i] += d * d;
    }
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i) {
    const float* xr = x + i * C;
    float rest = 0.0f;
    for (std::int64_t j = whole; j < C; ++j) rest += (xr[j] - mu[i]) * (xr[j] - mu[i]);
    rs[i] = 1.0f / std::sqrt((add_lanes(acc[i]) + rest) * inv_c + eps);
    mean[i] = mu[i];
    rstd[i] = rs[i];
  }
  for (int i = 0; i < R; ++i) {
    const float* xr = x + i * C;
    Out* yr = y + i * C;
    if (beta) {
      for (std::int64_t j = 0; j < whole; j += 8)
        store(yr + j, fma8((load8(xr + j) - mu[i]) * rs[i], load8(gamma + j), load8(beta + j)));
      for (std::int64_t j = whole; j < C; ++j)
        store(yr + j, std::fma((xr[j] - mu[i]) * rs[i], gamma[j], beta[j]));
      continue;
    }
    for (std::int64_t j = 0; j < whole; j += 8)
      store(yr + j, (load8(xr + j) - mu[i]) * rs[i] * load8(gamma + j));
    for (std::int64_t j = whole; j < C; ++j) store(yr + j, (xr[j] - mu[i]) * rs[i] * gamma[j]);
  }
}

template <class Out>
[[gnu::always_inline]] inline void layer_norm_rows(const float* x, const float* gamma,
                                                   const float* beta, Out* y, float* mean,
                                                   float* rstd, std::int64_t rows, std::int64_t C,
                                                   float eps) {
  std::int64_t r = 0;
  for (; r + 4 <= rows; r += 4)
    layer_norm_group<4>(x + r * C, gamma, beta, y + r * C, mean + r, rstd + r, C, eps);
  for (; r < rows; ++r)
    layer_norm_group<1>(x + r * C, gamma, beta, y + r * C, mean + r, rstd + r, C, eps);
}

// With kAccumulate, dx += the input gradient, else dx = it.
template <int R, bool kAccumulate, class In>
[[gnu::always_inline]] inline void layer_norm_backward_group(const float* x, const float* gamma,
                                                             const float* mean, const float* rstd,
                                                             const In* dy, float* dx, float* dgamma,
                                                             float* dbeta, std::int64_t C) {
  const float inv_c = 1.0f / static_cast<float>(C);
  const std::int64_t whole = C / 8 * 8;
  F8 ga[R], gb[R];
  float mu[R], rs[R], a[R], b[R];  // locals: the stores to dx and dgamma cannot change them
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i) {
    ga[i] = gb[i] = F8{};
    mu[i] = mean[i];
    rs[i] = rstd[i];
  }
  for (std::int64_t j = 0; j < whole; j += 8)
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i) {
      const F8 g = load<F8>(dy + i * C + j) * load8(gamma + j);
      ga[i] += g;
      gb[i] += g * ((load8(x + i * C + j) - mu[i]) * rs[i]);
    }
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i) {
    const float* xr = x + i * C;
    const In* dyr = dy + i * C;
    float ra = 0.0f, rb = 0.0f;
    for (std::int64_t j = whole; j < C; ++j) {
      const float g = load1(dyr + j) * gamma[j];
      ra += g;
      rb += g * ((xr[j] - mu[i]) * rs[i]);
    }
    a[i] = (add_lanes(ga[i]) + ra) * inv_c;
    b[i] = (add_lanes(gb[i]) + rb) * inv_c;
  }
  for (std::int64_t j = 0; j < whole; j += 8) {
    F8 dg = load8(dgamma + j);
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i) {
      const F8 d = load<F8>(dy + i * C + j), xhat = (load8(x + i * C + j) - mu[i]) * rs[i];
      const F8 inner = (d * load8(gamma + j) - a[i]) - xhat * b[i];
      float* dxr = dx + i * C;
      if constexpr (kAccumulate)
        store8(dxr + j, fma8(splat(rs[i]), inner, load8(dxr + j)));
      else
        store8(dxr + j, rs[i] * inner);
      dg += d * xhat;
    }
    store8(dgamma + j, dg);
    if (dbeta) {
      F8 db = load8(dbeta + j);
      for (int i = 0; i < R; ++i) db += load<F8>(dy + i * C + j);
      store8(dbeta + j, db);
    }
  }
  for (int i = 0; i < R; ++i) {
    const float* xr = x + i * C;
    const In* dyr = dy + i * C;
    float* dxr = dx + i * C;
    for (std::int64_t j = whole; j < C; ++j) {
      const float d = load1(dyr + j), xhat = (xr[j] - mu[i]) * rs[i];
      const float inner = (d * gamma[j] - a[i]) - xhat * b[i];
      dxr[j] = kAccumulate ? std::fma(rs[i], inner, dxr[j]) : rs[i] * inner;
      dgamma[j] += d * xhat;
      if (dbeta) dbeta[j] += d;
    }
  }
}

template <bool kAccumulate, class In>
[[gnu::always_inline]] inline void layer_norm_backward_groups(const float* x, const float* gamma,
                                                              const float* mean, const float* rstd,
                                                              const In* dy, float* dx,
                                                              float* dgamma, float* dbeta,
                                                              std::int64_t rows, std::int64_t C) {
  std::fill(dgamma, dgamma + C, 0.0f);
  if (dbeta) std::fill(dbeta, dbeta + C, 0.0f);
  std::int64_t r = 0;
  for (; r + 4 <= rows; r += 4)
    layer_norm_backward_group<4, kAccumulate>(x + r * C, gamma, mean + r, rstd + r, dy + r * C,
                                              dx + r * C, dgamma, dbeta, C);
  for (; r < rows; ++r)
    layer_norm_backward_group<1, kAccumulate>(x + r * C, gamma, mean + r, rstd + r, dy + r * C,
                                              dx + r * C, dgamma, dbeta, C);
}

template <class In>
[[gnu::always_inline]] inline void layer_norm_backward_rows(
    const float* x, const float* gamma, const float* mean, const float* rstd, const In* dy,
    float* dx, bool accumulate, float* dgamma, float* dbeta, std::int64_t rows, std::int64_t C) {
  if (accumulate)
    layer_norm_backward_groups<true>(x, gamma, mean, rstd, dy, dx, dgamma, dbeta, rows, C);
  else
    layer_norm_backward_groups<false>(x, gamma, mean, rstd, dy, dx, dgamma, dbeta, rows, C);
}

// A bias's gradient: each column's sum over the rows in row order, 16 columns at a time.
template <class In>
[[gnu::always_inline]] inline void column_sums(const In* dy, float* db, std::int64_t rows,
                                               std::int64_t O) {
  std::int64_t o = 0;
  for (; o + 16 <= O; o += 16) {
    F16 acc{};
    for (std::int64_t r = 0; r < rows; ++r) acc += load<F16>(dy + r * O + o);
    store(db + o, acc);
  }
  for (; o < O; ++o) {
    float acc = 0.0f;
    for (std::int64_t r = 0; r < rows; ++r) acc += load1(dy + r * O + o);
    db[o] = acc;
  }
}

}  // namespace lanes

COHORT_CLONES_AVX512
void layer_norm_forward(const float* x, const float* gamma, const float* beta, float* y,
                        float* mean, float* rstd, std::int64_t rows, std::int64_t C, float eps) {
  lanes::layer_norm_rows(x, gamma, beta, y, mean, rstd, rows, C, eps);
}

COHORT_CLONES_AVX512
void layer_norm_forward(const float* x, const float* gamma, const float* beta, bf16* y, float* mean,
                        float* rstd, std::int64_t rows, std::int64_t C, float eps) {
  lanes::layer_norm_rows(x, gamma, beta, y, mean, rstd, rows, C, eps);
}

COHORT_CLONES_AVX512
void layer_norm_backward(const float* x, const float* gamma, const float* mean, const float* rstd,
                         const float* dy, float* dx, bool accumulate, float* dgamma, float* dbeta,
                         std::int64_t rows, std::int64_t C) {
  lanes::layer_norm_backward_rows(x, gamma, mean, rstd, dy, dx, accumulate, dgamma, dbeta, rows, C);
}

COHORT_CLONES_AVX512
void layer_norm_backward(const float* x, const float* gamma, const float* mean, const float* rstd,
                         const bf16* dy, float* dx, bool accumulate, float* dgamma, float* dbeta,
                         std::int64_t rows, std::int64_t C) {
  lanes::layer_norm_backward_rows(x, gamma, mean, rstd, dy, dx, accumulate, dgamma, dbeta, rows, C);
}

COHORT_CLONES_AVX512
void bias_backward(const float* dy, float* db, std::int64_t rows, std::int64_t O) {
  lanes::column_sums(dy, db, rows, O);
}

COHORT_CLONES_AVX512
void bias_backward(const bf16* dy, float* db, std::int64_t rows, std::int64_t O) {
  lanes::column_sums(dy, db, rows, O);
}

}  // namespace cohort::nn
