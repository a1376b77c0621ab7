// Naive float64 reference for every layer cohort runs on oneDNN — linear, conv2d (stride,
// padding, with or without bias), max and average pooling, global average pooling, ReLU,
// flatten, dropout, batch normalization, residual blocks, softmax cross-entropy — forward and
// backward, on plain (N, C, H, W) arrays, written for clarity, not speed. The oracle of nn tests.
// Optionally it stores activations and their gradients in bf16 as a bf16 Net does (rounding each
// layer's output and input gradient), to follow the same ReLU and max-pooling decisions.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "cohort/nn/dropout.hpp"
#include "cohort/nn/model.hpp"
#include "cohort/tensor/bf16.hpp"

namespace cohort::reference {

struct NetResult {
  double loss = 0;                  // summed over rows
  std::vector<double> logits;       // (N, C)
  std::vector<double> grad;         // layout().total(), gradient of the summed loss
  std::vector<double> batch_stats;  // stats_layout().total(): each bn's batch mean, biased var
};

// v rounded to the nearest bf16 (through float: a double rounding, off by one bf16 step in rare
// ties, which tests' tolerances cover).
inline double round_to_bf16(double v) { return to_float(to_bf16(static_cast<float>(v))); }

// PyTorch's BatchNorm epsilon, as nn::Net uses.
inline constexpr double kBnEpsilon = 1e-5;

namespace detail {

// What one call shares: the model's parameters, the mode, and where gradients go.
struct Context {
  const std::vector<double>& params;
  std::int64_t N;
  nn::StreamKey key;
  bool bf16_activations;
  bool training;                             // dropout on, bn on batch statistics
  const std::vector<double>* running_stats;  // inference: bn normalizes with these
  std::vector<double>* grad;                 // layout().total()
  std::vector<double>* batch_stats;          // stats_layout().total()
  void round(std::vector<double>& v) const {
    if (bf16_activations)
      for (double& e : v) e = round_to_bf16(e);
  }
};

// What backward needs of one layer's forward.
struct Tape {
  std::vector<double> in, out;
  std::vector<float> mask;         // dropout
  std::vector<double> mean, istd;  // bn: per channel, 1 / sqrt(var + eps)
  std::vector<Tape> body, shortcut;
};

using K = nn::LayerSpec::Kind;

// One layer's forward over the batch; `round_out`: store its output in bf16 (when asked).
inline Tape forward_layer(const Context& cx, const nn::LayerSpec& l, std::size_t li,
                          std::vector<double> in, bool round_out) {
  const auto& params = cx.params;
  const std::int64_t N = cx.N;
  const std::int64_t IC = l.in.C, IH = l.in.H, IW = l.in.W;
  const std::int64_t OC = l.out.C, OH = l.out.H, OW = l.out.W;
  Tape t;
  t.in = std::move(in);
  std::vector<double> out(static_cast<std::size_t>(N * l.out.numel()), 0.0);
  switch (l.kind) {
    case K::kDropout:
      if (cx.training) {
        t.mask.resize(out.size());
        nn::dropout_mask(cx.key, li, l.p, out.size(), t.mask.data());
        for (std::size_t i = 0; i < out.size(); ++i) out[i] = t.in[i] * t.mask[i];
      } else {
        out = t.in;
      }
      break;
    case K::kBatchNorm: {
      // Per channel c over the N x H x W values: y = gamma (x - mean) / sqrt(var + eps) + beta,
      // with the batch's mean and biased variance (training) or the running ones.
      const std::int64_t HW = IH * IW;
      const double M = double(N * HW);
      t.mean.assign(IC, 0.0);
      t.istd.assign(IC, 0.0);
      for (std::int64_t c = 0; c < IC; ++c) {
        double mean = 0, var = 0;
        if (cx.training) {
          for (std::int64_t n = 0; n < N; ++n)
            for (std::int64_t i = 0; i < HW; ++i) mean += t.in[(n * IC + c) * HW + i];
          mean /= M;
          for (std::int64_t n = 0; n < N; ++n)
            for (std::int64_t i = 0; i < HW; ++i) {
              const double d = t.in[(n * IC + c) * HW + i] - mean;
              var += d * d;
            }
          var /= M;
          if (cx.batch_stats) {
            (*cx.batch_stats)[l.running_mean + c] = mean;
            (*cx.batch_stats)[l.running_var + c] = var;
          }
        } else {
          mean = (*cx.running_stats)[l.running_mean + c];
          var = (*cx.running_stats)[l.running_var + c];
        }
        t.mean[c] = mean;
        t.istd[c] = 1.0 / std::sqrt(var + kBnEpsilon);
        for (std::int64_t n = 0; n < N; ++n)
          for (std::int64_t i = 0; i < HW; ++i) {
            const std::int64_t at = (n * IC + c) * HW + i;
            out[at] = params[l.weight + c] * (t.in[at] - mean) * t.istd[c] + params[l.bias + c];
          }
      }
      break;
    }
    case K::kResidual: {
      // relu(body(x) + shortcut(x)); every stored value (each sub-layer's output, the sum) is
      // rounded as the Net stores it.
      std::vector<double> b = t.in, s = t.in;
      for (const auto& sub : l.body) {
        t.body.push_back(forward_layer(cx, sub, li, b, true));
        b = t.body.back().out;
      }
      for (const auto& sub : l.shortcut) {
        t.shortcut.push_back(forward_layer(cx, sub, li, s, true));
        s = t.shortcut.back().out;
      }
      for (std::size_t i = 0; i < out.size(); ++i) out[i] = b[i] + s[i];
      cx.round(out);
      for (double& v : out) v = v > 0 ? v : 0;
      break;
    }
    default:
      for (std::int64_t n = 0; n < N; ++n) {
        const double* src = t.in.data() + n * l.in.numel();
        double* dst = out.data() + n * l.out.numel();
        switch (l.kind) {
          case K::kLinear:
            for (std::int64_t o = 0; o < OC; ++o) {
              double s = params[l.bias + o];
              // Linear weights are stored (IC, OC): element (o, i) at i * OC + o.
              for (std::int64_t i = 0; i < IC; ++i) s += params[l.weight + i * OC + o] * src[i];
              dst[o] = s;
            }
            break;
          case K::kConv:
            for (std::int64_t o = 0; o < OC; ++o)
              for (std::int64_t oh = 0; oh < OH; ++oh)
                for (std::int64_t ow = 0; ow < OW; ++ow) {
                  double s = l.has_bias ? params[l.bias + o] : 0.0;
                  for (std::int64_t c = 0; c < IC; ++c)
                    for (std::int64_t kh = 0; kh < l.kernel; ++kh)
                      for (std::int64_t kw = 0; kw < l.kernel; ++kw) {
                        const std::int64_t ih = oh * l.stride - l.pad + kh;
                        const std::int64_t iw = ow * l.stride - l.pad + kw;
                        if (ih < 0 || ih >= IH || iw < 0 || iw >= IW) continue;
                        s += params[l.weight + ((o * IC + c) * l.kernel + kh) * l.kernel + kw] *
                             src[(c * IH + ih) * IW + iw];
                      }
                  dst[(o * OH + oh) * OW + ow] = s;
                }
            break;
          case K::kMaxPool:
          case K::kAvgPool:
            for (std::int64_t c = 0; c < OC; ++c)
              for (std::int64_t oh = 0; oh < OH; ++oh)
                for (std::int64_t ow = 0; ow < OW; ++ow) {
                  double best = -std::numeric_limits<double>::infinity(), sum = 0;
                  for (std::int64_t kh = 0; kh < l.kernel; ++kh)
                    for (std::int64_t kw = 0; kw < l.kernel; ++kw) {
                      double v = src[(c * IH + oh * l.stride + kh) * IW + ow * l.stride + kw];
                      best = std::max(best, v);
                      sum += v;
                    }
                  dst[(c * OH + oh) * OW + ow] =
                      l.kind == K::kMaxPool ? best : sum / double(l.kernel * l.kernel);
                }
            break;
          case K::kGap:
            for (std::int64_t c = 0; c < IC; ++c) {
              double sum = 0;
              for (std::int64_t i = 0; i < IH * IW; ++i) sum += src[c * IH * IW + i];
              dst[c] = sum / double(IH * IW);
            }
            break;
          case K::kReLU:
            for (std::int64_t i = 0; i < l.in.numel(); ++i) dst[i] = src[i] > 0 ? src[i] : 0;
            break;
          case K::kFlatten:
            for (std::int64_t i = 0; i < l.in.numel(); ++i) dst[i] = src[i];
            break;
          default:
            break;
        }
      }
  }
  if (round_out) cx.round(out);
  t.out = std::move(out);
  return t;
}

// One layer's backward over the batch: adds its parameter gradients to cx.grad and returns its
// input gradient (rounded when activations are bf16).
inline std::vector<double> backward_layer(const Context& cx, const nn::LayerSpec& l, const Tape& t,
                                          const std::vector<double>& diff) {
  const auto& params = cx.params;
  auto& grad = *cx.grad;
  const std::int64_t N = cx.N;
  const std::int64_t IC = l.in.C, IH = l.in.H, IW = l.in.W;
  const std::int64_t OC = l.out.C, OH = l.out.H, OW = l.out.W;
  std::vector<double> diff_in(static_cast<std::size_t>(N * l.in.numel()), 0.0);
  switch (l.kind) {
    case K::kBatchNorm: {
      // With xhat = (x - mean) istd over M values of a channel: dgamma = sum dy xhat,
      // dbeta = sum dy, dx = gamma istd / M (M dy - dbeta - xhat dgamma) — through the batch
      // mean and variance.
      const std::int64_t HW = IH * IW;
      const double M = double(N * HW);
      for (std::int64_t c = 0; c < IC; ++c) {
        double dgamma = 0, dbeta = 0;
        for (std::int64_t n = 0; n < N; ++n)
          for (std::int64_t i = 0; i < HW; ++i) {
            const std::int64_t at = (n * IC + c) * HW + i;
            dgamma += diff[at] * (t.in[at] - t.mean[c]) * t.istd[c];
            dbeta += diff[at];
          }
        grad[l.weight + c] += dgamma;
        grad[l.bias + c] += dbeta;
        const double g = params[l.weight + c] * t.istd[c] / M;
        for (std::int64_t n = 0; n < N; ++n)
          for (std::int64_t i = 0; i < HW; ++i) {
            const std::int64_t at = (n * IC + c) * HW + i;
            const double xhat = (t.in[at] - t.mean[c]) * t.istd[c];
            diff_in[at] = g * (M * diff[at] - dbeta - xhat * dgamma);
          }
      }
      break;
    }
    case K::kResidual: {
      std::vector<double> d(diff.size());
      for (std::size_t i = 0; i < d.size(); ++i) d[i] = t.out[i] > 0 ? diff[i] : 0;
      std::vector<double> b = d, s = d;
      for (std::size_t k = l.body.size(); k-- > 0;) b = backward_layer(cx, l.body[k], t.body[k], b);
      for (std::size_t k = l.shortcut.size(); k-- > 0;)
        s = backward_layer(cx, l.shortcut[k], t.shortcut[k], s);
      for (std::size_t i = 0; i < diff_in.size(); ++i) diff_in[i] = b[i] + s[i];
      break;
    }
    case K::kDropout:
      for (std::size_t i = 0; i < diff_in.size(); ++i) diff_in[i] = diff[i] * t.mask[i];
      break;
    default:
      for (std::int64_t n = 0; n < N; ++n) {
        const double* src = t.in.data() + n * l.in.numel();
        const double* dst = t.out.data() + n * l.out.numel();
        const double* dd = diff.data() + n * l.out.numel();
        double* ds = diff_in.data() + n * l.in.numel();
        switch (l.kind) {
          case K::kLinear:
            for (std::int64_t o = 0; o < OC; ++o) {
              grad[l.bias + o] += dd[o];
              for (std::int64_t i = 0; i < IC; ++i) {
                grad[l.weight + i * OC + o] += dd[o] * src[i];
                ds[i] += dd[o] * params[l.weight + i * OC + o];
              }
            }
            break;
          case K::kConv:
            for (std::int64_t o = 0; o < OC; ++o)
              for (std::int64_t oh = 0; oh < OH; ++oh)
                for (std::int64_t ow = 0; ow < OW; ++ow) {
                  const double d = dd[(o * OH + oh) * OW + ow];
                  if (l.has_bias) grad[l.bias + o] += d;
                  for (std::int64_t c = 0; c < IC; ++c)
                    for (std::int64_t kh = 0; kh < l.kernel; ++kh)
                      for (std::int64_t kw = 0; kw < l.kernel; ++kw) {
                        const std::int64_t ih = oh * l.stride - l.pad + kh;
                        const std::int64_t iw = ow * l.stride - l.pad + kw;
                        if (ih < 0 || ih >= IH || iw < 0 || iw >= IW) continue;
                        const std::size_t w =
                            l.weight + ((o * IC + c) * l.kernel + kh) * l.kernel + kw;
                        grad[w] += d * src[(c * IH + ih) * IW + iw];
                        ds[(c * IH + ih) * IW + iw] += d * params[w];
                      }
                }
            break;
          case K::kMaxPool:
          case K::kAvgPool:
            for (std::int64_t c = 0; c < OC; ++c)
              for (std::int64_t oh = 0; oh < OH; ++oh)
                for (std::int64_t ow = 0; ow < OW; ++ow) {
                  const double d = dd[(c * OH + oh) * OW + ow];
                  bool routed = false;  // max: the first maximal input takes the gradient
                  for (std::int64_t kh = 0; kh < l.kernel; ++kh)
                    for (std::int64_t kw = 0; kw < l.kernel; ++kw) {
                      const std::int64_t at =
                          (c * IH + oh * l.stride + kh) * IW + ow * l.stride + kw;
                      if (l.kind == K::kAvgPool) {
                        ds[at] += d / double(l.kernel * l.kernel);
                      } else if (!routed && src[at] == dst[(c * OH + oh) * OW + ow]) {
                        ds[at] += d;
                        routed = true;
                      }
                    }
                }
            break;
          case K::kGap:
            for (std::int64_t c = 0; c < IC; ++c)
              for (std::int64_t i = 0; i < IH * IW; ++i)
                ds[c * IH * IW + i] = dd[c] / double(IH * IW);
            break;
          case K::kReLU:
            for (std::int64_t i = 0; i < l.in.numel(); ++i) ds[i] = src[i] > 0 ? dd[i] : 0;
            break;
          case K::kFlatten:
            for (std::int64_t i = 0; i < l.in.numel(); ++i) ds[i] = dd[i];
            break;
          default:
            break;
        }
      }
  }
  cx.round(diff_in);
  return diff_in;
}

// The forward pass over the model's layers; tapes of every layer, the logits last.
inline std::vector<Tape> forward_all(const nn::Model& m, const Context& cx,
                                     const std::vector<double>& x) {
  const auto& layers = m.layers();
  std::vector<Tape> tapes;
  std::vector<double> cur = x;
  for (std::size_t li = 0; li < layers.size(); ++li) {
    // Every output is stored in the activations' type but the last (the logits stay unrounded).
    tapes.push_back(forward_layer(cx, layers[li], li, cur, li + 1 < layers.size()));
    cur = tapes.back().out;
  }
  return tapes;
}

}  // namespace detail

// The summed softmax cross-entropy of logits (N, C) against labels; with `diff`, also its
// gradient.
inline double summed_loss(const std::vector<double>& logits,
                          const std::vector<std::int32_t>& labels, std::int64_t N, std::int64_t C,
                          std::vector<double>* diff = nullptr) {
  double loss = 0;
  for (std::int64_t r = 0; r < N; ++r) {
    double mx = logits[r * C];
    for (std::int64_t c = 1; c < C; ++c) mx = std::max(mx, logits[r * C + c]);
    double sum = 0;
    for (std::int64_t c = 0; c < C; ++c) sum += std::exp(logits[r * C + c] - mx);
    loss += std::log(sum) + mx - logits[r * C + labels[r]];
    if (diff)
      for (std::int64_t c = 0; c < C; ++c)
        (*diff)[r * C + c] = std::exp(logits[r * C + c] - mx) / sum - (c == labels[r] ? 1.0 : 0.0);
  }
  return loss;
}

// params: layout().total() values; x (N, C, H, W) of the model's input; labels (N).
// Dropout masks come from nn::dropout_mask with `key` (the same streams as nn::Net); bn layers
// normalize with the batch's statistics, which go to NetResult::batch_stats.
// bf16_activations: round every layer's output but the last (the logits stay unrounded), the
// logits' gradient and every layer's input gradient to bf16, as a bf16 Net stores them; all
// arithmetic stays float64 and parameter gradients are not rounded.
inline NetResult net_forward_backward(const nn::Model& m, const std::vector<double>& params,
                                      const std::vector<double>& x,
                                      const std::vector<std::int32_t>& labels, std::int64_t N,
                                      const nn::StreamKey& key = {},
                                      bool bf16_activations = false) {
  NetResult res;
  res.grad.assign(m.layout().total(), 0.0);
  res.batch_stats.assign(m.stats_layout().total(), 0.0);
  const detail::Context cx{params, N,       key,       bf16_activations,
                           true,   nullptr, &res.grad, &res.batch_stats};
  const auto tapes = detail::forward_all(m, cx, x);
  res.logits = tapes.back().out;
  const std::int64_t C = m.num_classes();
  std::vector<double> diff(static_cast<std::size_t>(N * C));
  res.loss = summed_loss(res.logits, labels, N, C, &diff);
  cx.round(diff);
  for (std::size_t li = m.layers().size(); li-- > 0;)
    diff = detail::backward_layer(cx, m.layers()[li], tapes[li], diff);
  return res;
}

// The training loss only (forward, no backward): for finite differences.
inline double net_loss(const nn::Model& m, const std::vector<double>& params,
                       const std::vector<double>& x, const std::vector<std::int32_t>& labels,
                       std::int64_t N, const nn::StreamKey& key = {}) {
  const detail::Context cx{params, N, key, false, true, nullptr, nullptr, nullptr};
  return summed_loss(detail::forward_all(m, cx, x).back().out, labels, N, m.num_classes());
}

// Inference: dropout is the identity and bn layers normalize with `running_stats`
// (stats_layout().total() values); returns the logits (N, C).
inline std::vector<double> net_forward_inference(const nn::Model& m,
                                                 const std::vector<double>& params,
                                                 const std::vector<double>& x, std::int64_t N,
                                                 const std::vector<double>& running_stats) {
  const detail::Context cx{params, N, {}, false, false, &running_stats, nullptr, nullptr};
  return detail::forward_all(m, cx, x).back().out;
}

}  // namespace cohort::reference
