// Naive float64 reference of nn::GptNet — token and position embeddings, LayerNorm (its weight,
// and its bias where the model has biases), causal multi-head self-attention, the GELU MLP
// (the exact erf form or GPT-2's tanh one), linear layers with or without biases, pre-LN
// residual blocks, the final LayerNorm, the head tied to the token embedding's first `vocab`
// rows (the padded ones are not read), softmax cross-entropy over every position, dropout with
// GptNet's keyed masks — forward and backward, written for clarity, not speed. The oracle of the
// GPT tests; itself checked against finite differences there.
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>
#include <vector>

#include "cohort/nn/dropout.hpp"
#include "cohort/nn/gpt/gpt.hpp"

namespace cohort::reference {

struct GptResult {
  double loss = 0;             // summed over the N x block positions
  std::vector<double> grad;    // layout().total(): the gradient of the summed loss
  std::vector<double> logits;  // (N x block, vocab)
};

// The dropout streams' layer numbers, as GptNet draws them: the embeddings' 0, then per block i
// the attention weights' 1 + 3i, the attention branch's 2 + 3i, the MLP branch's 3 + 3i.
inline std::size_t gpt_dropout_layer(std::int64_t block, int which) {
  return 1 + 3 * static_cast<std::size_t>(block) + static_cast<std::size_t>(which);
}

namespace gpt_detail {

using Vec = std::vector<double>;

struct LnTape {
  Vec xhat, istd;
};

// y (M, C) = LayerNorm(x) * w (+ b, unless null).
inline Vec ln_forward(const Vec& x, const double* w, const double* b, std::int64_t M,
                      std::int64_t C, LnTape& t) {
  Vec y(x.size());
  t.xhat.assign(x.size(), 0);
  t.istd.assign(static_cast<std::size_t>(M), 0);
  for (std::int64_t m = 0; m < M; ++m) {
    const double* r = &x[static_cast<std::size_t>(m * C)];
    double mean = 0, var = 0;
    for (std::int64_t c = 0; c < C; ++c) mean += r[c];
    mean /= double(C);
    for (std::int64_t c = 0; c < C; ++c) var += (r[c] - mean) * (r[c] - mean);
    var /= double(C);
    const double istd = 1.0 / std::sqrt(var + double(nn::GptModel::kLayerNormEpsilon));
    t.istd[static_cast<std::size_t>(m)] = istd;
    for (std::int64_t c = 0; c < C; ++c) {
      const std::size_t i = static_cast<std::size_t>(m * C + c);
      t.xhat[i] = (r[c] - mean) * istd;
      y[i] = t.xhat[i] * w[c] + (b ? b[c] : 0.0);
    }
  }
  return y;
}

// dx from dy; adds dw (and db, unless null).
inline Vec ln_backward(const Vec& dy, const double* w, std::int64_t M, std::int64_t C,
                       const LnTape& t, double* dw, double* db) {
  Vec dx(dy.size());
  for (std::int64_t m = 0; m < M; ++m) {
    double sum_g = 0, sum_gx = 0;
    for (std::int64_t c = 0; c < C; ++c) {
      const std::size_t i = static_cast<std::size_t>(m * C + c);
      const double g = dy[i] * w[c];
      dw[c] += dy[i] * t.xhat[i];
      if (db) db[c] += dy[i];
      sum_g += g;
      sum_gx += g * t.xhat[i];
    }
    const double istd = t.istd[static_cast<std::size_t>(m)];
    for (std::int64_t c = 0; c < C; ++c) {
      const std::size_t i = static_cast<std::size_t>(m * C + c);
      const double g = dy[i] * w[c];
      dx[i] = istd * (g - sum_g / double(C) - t.xhat[i] * sum_gx / double(C));
    }
  }
  return dx;
}

// y (M, O) = x (M, I) W^T (+ b, unless null), W (O, I).
inline Vec linear(const Vec& x, const double* W, const double* b, std::int64_t M, std::int64_t I,
                  std::int64_t O) {
  Vec y(static_cast<std::size_t>(M * O), 0);
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t o = 0; o < O; ++o) {
      double s = b ? b[o] : 0.0;
      for (std::int64_t i = 0; i < I; ++i)
        s += x[static_cast<std::size_t>(m * I + i)] * W[o * I + i];
      y[static_cast<std::size_t>(m * O + o)] = s;
    }
  return y;
}

// dx (M, I) = dy W; adds dW += dy^T x (and db += dy's column sums, unless null).
inline Vec linear_backward(const Vec& dy, const Vec& x, const double* W, std::int64_t M,
                           std::int64_t I, std::int64_t O, double* dW, double* db = nullptr) {
  Vec dx(static_cast<std::size_t>(M * I), 0);
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t o = 0; o < O; ++o) {
      const double g = dy[static_cast<std::size_t>(m * O + o)];
      if (db) db[o] += g;
      for (std::int64_t i = 0; i < I; ++i) {
        dx[static_cast<std::size_t>(m * I + i)] += g * W[o * I + i];
        dW[o * I + i] += g * x[static_cast<std::size_t>(m * I + i)];
      }
    }
  return dx;
}

inline double gelu(double x, bool tanh_form) {
  if (tanh_form) {
    const double k = std::sqrt(2.0 / std::numbers::pi);
    return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
  }
  return 0.5 * x * (1.0 + std::erf(x / std::numbers::sqrt2));
}
inline double gelu_grad(double x, bool tanh_form) {
  if (tanh_form) {
    const double k = std::sqrt(2.0 / std::numbers::pi);
    const double t = std::tanh(k * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3 * 0.044715 * x * x);
  }
  return 0.5 * (1.0 + std::erf(x / std::numbers::sqrt2)) +
         x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * std::numbers::pi);
}

struct BlockTape {
  Vec x_in, h1, qkv, p, p_drop, y, a_mask, x_mid, h2, f, g, m_mask;
  std::vector<float> p_mask;
  LnTape ln1, ln2;
};

}  // namespace gpt_detail

// Forward and backward of `model` on N windows (N x (block + 1) tokens), params and the result
// in float64; training = false: no dropout, no gradient.
inline GptResult gpt_forward_backward(const nn::GptModel& model, const std::vector<double>& params,
                                      const std::int32_t* windows, std::int64_t N,
                                      const nn::StreamKey& key = {}, bool training = true) {
  using namespace gpt_detail;
  const nn::GptShape& s = model.shape();
  const std::int64_t T = s.block, C = s.embd, H = s.heads, hs = s.head_size(), V = s.vocab;
  const std::int64_t M = N * T;
  const double* P = params.data();
  const double scale = 1.0 / std::sqrt(double(hs));
  const bool drop = training && s.dropout > 0;
  auto sz = [](std::int64_t n) { return static_cast<std::size_t>(n); };
  auto token = [&](std::int64_t n, std::int64_t t) { return windows[n * (T + 1) + t]; };
  // A bias's values (or its gradient's), or null where the model has none.
  auto bias = [](const double* base, std::size_t at) {
    return at == nn::GptModel::kNoBias ? nullptr : base + at;
  };
  auto bias_grad = [](double* base, std::size_t at) {
    return at == nn::GptModel::kNoBias ? nullptr : base + at;
  };
  auto apply_mask = [&](Vec& v, std::size_t layer, std::vector<float>& mask) {
    if (!drop) return;
    mask.resize(v.size());
    nn::dropout_mask(key, layer, s.dropout, v.size(), mask.data());
    for (std::size_t i = 0; i < v.size(); ++i) v[i] *= mask[i];
  };

  // Embeddings.
  Vec x(sz(M * C));
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t c = 0; c < C; ++c)
        x[sz((n * T + t) * C + c)] =
            P[model.wte() + sz(token(n, t) * C + c)] + P[model.wpe() + sz(t * C + c)];
  std::vector<float> emb_mask;
  apply_mask(x, 0, emb_mask);

  std::vector<BlockTape> tapes(sz(s.layers));
  std::vector<std::vector<float>> a_masks(sz(s.layers)), m_masks(sz(s.layers));
  for (std::int64_t l = 0; l < s.layers; ++l) {
    const nn::GptModel::BlockOffsets& b = model.block(l);
    BlockTape& tp = tapes[sz(l)];
    tp.x_in = x;
    tp.h1 = ln_forward(x, P + b.ln_1, bias(P, b.ln_1_bias), M, C, tp.ln1);
    tp.qkv = linear(tp.h1, P + b.c_attn, bias(P, b.c_attn_bias), M, C, 3 * C);
    tp.p.assign(sz(N * H * T * T), 0);
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t i = 0; i < T; ++i) {
          double* row = &tp.p[sz(((n * H + h) * T + i) * T)];
          double mx = -INFINITY;
          for (std::int64_t j = 0; j <= i; ++j) {
            double d = 0;
            for (std::int64_t e = 0; e < hs; ++e)
              d += tp.qkv[sz((n * T + i) * 3 * C + h * hs + e)] *
                   tp.qkv[sz((n * T + j) * 3 * C + C + h * hs + e)];
            row[j] = d * scale;
            mx = std::max(mx, row[j]);
          }
          double sum = 0;
          for (std::int64_t j = 0; j <= i; ++j) sum += (row[j] = std::exp(row[j] - mx));
          for (std::int64_t j = 0; j <= i; ++j) row[j] /= sum;
        }
    tp.p_drop = tp.p;
    apply_mask(tp.p_drop, gpt_dropout_layer(l, 0), tp.p_mask);
    tp.y.assign(sz(M * C), 0);
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t i = 0; i < T; ++i)
          for (std::int64_t j = 0; j < T; ++j) {
            const double w = tp.p_drop[sz(((n * H + h) * T + i) * T + j)];
            for (std::int64_t e = 0; e < hs; ++e)
              tp.y[sz((n * T + i) * C + h * hs + e)] +=
                  w * tp.qkv[sz((n * T + j) * 3 * C + 2 * C + h * hs + e)];
          }
    Vec a = linear(tp.y, P + b.attn_proj, bias(P, b.attn_proj_bias), M, C, C);
    apply_mask(a, gpt_dropout_layer(l, 1), a_masks[sz(l)]);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += a[i];
    tp.x_mid = x;
    tp.h2 = ln_forward(x, P + b.ln_2, bias(P, b.ln_2_bias), M, C, tp.ln2);
    tp.f = linear(tp.h2, P + b.c_fc, bias(P, b.c_fc_bias), M, C, 4 * C);
    tp.g.resize(tp.f.size());
    for (std::size_t i = 0; i < tp.f.size(); ++i) tp.g[i] = gelu(tp.f[i], s.tanh_gelu);
    Vec mo = linear(tp.g, P + b.mlp_proj, bias(P, b.mlp_proj_bias), M, 4 * C, C);
    apply_mask(mo, gpt_dropout_layer(l, 2), m_masks[sz(l)]);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += mo[i];
  }
  LnTape lnf;
  const Vec xf = ln_forward(x, P + model.ln_f(), bias(P, model.ln_f_bias()), M, C, lnf);
  const Vec logits = linear(xf, P + model.wte(), nullptr, M, C, V);

  GptResult r;
  r.logits = logits;
  Vec dlogits(logits.size());
  for (std::int64_t m = 0; m < M; ++m) {
    const double* z = &logits[sz(m * V)];
    double mx = z[0];
    for (std::int64_t v = 1; v < V; ++v) mx = std::max(mx, z[v]);
    double sum = 0;
    for (std::int64_t v = 0; v < V; ++v) sum += std::exp(z[v] - mx);
    const std::int32_t y = token(m / T, m % T + 1);
    r.loss += std::log(sum) - (z[y] - mx);
    for (std::int64_t v = 0; v < V; ++v) dlogits[sz(m * V + v)] = std::exp(z[v] - mx) / sum;
    dlogits[sz(m * V + y)] -= 1;
  }
  if (!training) return r;

  r.grad.assign(model.layout().total(), 0);
  double* G = r.grad.data();
  Vec dx =
      ln_backward(linear_backward(dlogits, xf, P + model.wte(), M, C, V, G + model.wte()),
                  P + model.ln_f(), M, C, lnf, G + model.ln_f(), bias_grad(G, model.ln_f_bias()));
  for (std::int64_t l = s.layers; l-- > 0;) {
    const nn::GptModel::BlockOffsets& b = model.block(l);
    const BlockTape& tp = tapes[sz(l)];
    // MLP branch.
    Vec dmo = dx;
    if (drop)
      for (std::size_t i = 0; i < dmo.size(); ++i) dmo[i] *= m_masks[sz(l)][i];
    Vec dg = linear_backward(dmo, tp.g, P + b.mlp_proj, M, 4 * C, C, G + b.mlp_proj,
                             bias_grad(G, b.mlp_proj_bias));
    for (std::size_t i = 0; i < dg.size(); ++i) dg[i] *= gelu_grad(tp.f[i], s.tanh_gelu);
    const Vec dh2 =
        linear_backward(dg, tp.h2, P + b.c_fc, M, C, 4 * C, G + b.c_fc, bias_grad(G, b.c_fc_bias));
    const Vec dln2 =
        ln_backward(dh2, P + b.ln_2, M, C, tp.ln2, G + b.ln_2, bias_grad(G, b.ln_2_bias));
    for (std::size_t i = 0; i < dx.size(); ++i) dx[i] += dln2[i];
    // Attention branch.
    Vec da = dx;
    if (drop)
      for (std::size_t i = 0; i < da.size(); ++i) da[i] *= a_masks[sz(l)][i];
    const Vec dy = linear_backward(da, tp.y, P + b.attn_proj, M, C, C, G + b.attn_proj,
                                   bias_grad(G, b.attn_proj_bias));
    Vec dqkv(sz(M * 3 * C), 0);
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t i = 0; i < T; ++i) {
          const std::size_t row = sz(((n * H + h) * T + i) * T);
          Vec dp(sz(T), 0);
          for (std::int64_t j = 0; j < T; ++j) {
            double d = 0;
            for (std::int64_t e = 0; e < hs; ++e) {
              const double g = dy[sz((n * T + i) * C + h * hs + e)];
              d += g * tp.qkv[sz((n * T + j) * 3 * C + 2 * C + h * hs + e)];
              dqkv[sz((n * T + j) * 3 * C + 2 * C + h * hs + e)] += tp.p_drop[row + sz(j)] * g;
            }
            dp[sz(j)] = drop ? d * tp.p_mask[row + sz(j)] : d;
          }
          double dot = 0;
          for (std::int64_t j = 0; j < T; ++j) dot += dp[sz(j)] * tp.p[row + sz(j)];
          for (std::int64_t j = 0; j <= i; ++j) {
            const double ds = tp.p[row + sz(j)] * (dp[sz(j)] - dot) * scale;
            for (std::int64_t e = 0; e < hs; ++e) {
              dqkv[sz((n * T + i) * 3 * C + h * hs + e)] +=
                  ds * tp.qkv[sz((n * T + j) * 3 * C + C + h * hs + e)];
              dqkv[sz((n * T + j) * 3 * C + C + h * hs + e)] +=
                  ds * tp.qkv[sz((n * T + i) * 3 * C + h * hs + e)];
            }
          }
        }
    const Vec dh1 = linear_backward(dqkv, tp.h1, P + b.c_attn, M, C, 3 * C, G + b.c_attn,
                                    bias_grad(G, b.c_attn_bias));
    const Vec dln1 =
        ln_backward(dh1, P + b.ln_1, M, C, tp.ln1, G + b.ln_1, bias_grad(G, b.ln_1_bias));
    for (std::size_t i = 0; i < dx.size(); ++i) dx[i] += dln1[i];
  }
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t c = 0; c < C; ++c) {
        const std::size_t i = sz((n * T + t) * C + c);
        const double g = drop ? dx[i] * emb_mask[i] : dx[i];
        G[model.wte() + sz(token(n, t) * C + c)] += g;
        G[model.wpe() + sz(t * C + c)] += g;
      }
  return r;
}

}  // namespace cohort::reference
