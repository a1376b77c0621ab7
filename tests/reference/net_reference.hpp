// Naive float64 reference for every layer cohort runs on oneDNN — linear, conv2d (stride,
// padding), max and average pooling, ReLU, flatten, dropout, softmax cross-entropy — forward and
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
  double loss = 0;             // summed over rows
  std::vector<double> logits;  // (N, C)
  std::vector<double> grad;    // layout().total(), gradient of the summed loss
};

// v rounded to the nearest bf16 (through float: a double rounding, off by one bf16 step in rare
// ties, which tests' tolerances cover).
inline double round_to_bf16(double v) { return to_float(to_bf16(static_cast<float>(v))); }

// params: layout().total() values; x (N, C, H, W) of the model's input; labels (N).
// Dropout masks come from nn::dropout_mask with `key` (the same streams as nn::Net).
// bf16_activations: round every layer's output but the last (the logits stay unrounded), the
// logits' gradient and every layer's input gradient to bf16, as a bf16 Net stores them; all
// arithmetic stays float64 and parameter gradients are not rounded.
inline NetResult net_forward_backward(const nn::Model& m, const std::vector<double>& params,
                                      const std::vector<double>& x,
                                      const std::vector<std::int32_t>& labels, std::int64_t N,
                                      const nn::StreamKey& key = {},
                                      bool bf16_activations = false) {
  auto round_all = [&](std::vector<double>& v) {
    if (bf16_activations)
      for (double& e : v) e = round_to_bf16(e);
  };
  using K = nn::LayerSpec::Kind;
  const auto& layers = m.layers();
  std::vector<std::vector<double>> acts{x};  // input of each layer, then the logits
  std::vector<std::vector<float>> masks(layers.size());
  for (std::size_t li = 0; li < layers.size(); ++li) {
    const auto& l = layers[li];
    const auto& in = acts.back();
    const std::int64_t IC = l.in.C, IH = l.in.H, IW = l.in.W;
    const std::int64_t OC = l.out.C, OH = l.out.H, OW = l.out.W;
    std::vector<double> out(static_cast<std::size_t>(N * l.out.numel()), 0.0);
    for (std::int64_t n = 0; n < N; ++n) {
      const double* src = in.data() + n * l.in.numel();
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
                double s = params[l.bias + o];
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
        case K::kReLU:
          for (std::int64_t i = 0; i < l.in.numel(); ++i) dst[i] = src[i] > 0 ? src[i] : 0;
          break;
        case K::kFlatten:
          for (std::int64_t i = 0; i < l.in.numel(); ++i) dst[i] = src[i];
          break;
        case K::kDropout:
          break;  // below, over the whole batch
      }
    }
    if (l.kind == K::kDropout) {
      masks[li].resize(out.size());
      nn::dropout_mask(key, li, l.p, out.size(), masks[li].data());
      for (std::size_t i = 0; i < out.size(); ++i) out[i] = in[i] * masks[li][i];
    }
    if (li + 1 < layers.size()) round_all(out);
    acts.push_back(std::move(out));
  }

  NetResult res;
  res.logits = acts.back();
  res.grad.assign(m.layout().total(), 0.0);
  const std::int64_t C = m.num_classes();
  std::vector<double> diff(static_cast<std::size_t>(N * C));
  for (std::int64_t r = 0; r < N; ++r) {
    double mx = res.logits[r * C];
    for (std::int64_t c = 1; c < C; ++c) mx = std::max(mx, res.logits[r * C + c]);
    double sum = 0;
    for (std::int64_t c = 0; c < C; ++c) sum += std::exp(res.logits[r * C + c] - mx);
    res.loss += std::log(sum) + mx - res.logits[r * C + labels[r]];
    for (std::int64_t c = 0; c < C; ++c)
      diff[r * C + c] = std::exp(res.logits[r * C + c] - mx) / sum - (c == labels[r] ? 1.0 : 0.0);
  }
  round_all(diff);

  for (std::size_t li = layers.size(); li-- > 0;) {
    const auto& l = layers[li];
    const auto& in = acts[li];
    const auto& outv = acts[li + 1];
    const std::int64_t IC = l.in.C, IH = l.in.H, IW = l.in.W;
    const std::int64_t OC = l.out.C, OH = l.out.H, OW = l.out.W;
    std::vector<double> diff_in(static_cast<std::size_t>(N * l.in.numel()), 0.0);
    for (std::int64_t n = 0; n < N; ++n) {
      const double* src = in.data() + n * l.in.numel();
      const double* dst = outv.data() + n * l.out.numel();
      const double* dd = diff.data() + n * l.out.numel();
      double* ds = diff_in.data() + n * l.in.numel();
      switch (l.kind) {
        case K::kLinear:
          for (std::int64_t o = 0; o < OC; ++o) {
            res.grad[l.bias + o] += dd[o];
            for (std::int64_t i = 0; i < IC; ++i) {
              res.grad[l.weight + i * OC + o] += dd[o] * src[i];
              ds[i] += dd[o] * params[l.weight + i * OC + o];
            }
          }
          break;
        case K::kConv:
          for (std::int64_t o = 0; o < OC; ++o)
            for (std::int64_t oh = 0; oh < OH; ++oh)
              for (std::int64_t ow = 0; ow < OW; ++ow) {
                const double d = dd[(o * OH + oh) * OW + ow];
                res.grad[l.bias + o] += d;
                for (std::int64_t c = 0; c < IC; ++c)
                  for (std::int64_t kh = 0; kh < l.kernel; ++kh)
                    for (std::int64_t kw = 0; kw < l.kernel; ++kw) {
                      const std::int64_t ih = oh * l.stride - l.pad + kh;
                      const std::int64_t iw = ow * l.stride - l.pad + kw;
                      if (ih < 0 || ih >= IH || iw < 0 || iw >= IW) continue;
                      const std::size_t w =
                          l.weight + ((o * IC + c) * l.kernel + kh) * l.kernel + kw;
                      res.grad[w] += d * src[(c * IH + ih) * IW + iw];
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
                    const std::int64_t at = (c * IH + oh * l.stride + kh) * IW + ow * l.stride + kw;
                    if (l.kind == K::kAvgPool) {
                      ds[at] += d / double(l.kernel * l.kernel);
                    } else if (!routed && src[at] == dst[(c * OH + oh) * OW + ow]) {
                      ds[at] += d;
                      routed = true;
                    }
                  }
              }
          break;
        case K::kReLU:
          for (std::int64_t i = 0; i < l.in.numel(); ++i) ds[i] = src[i] > 0 ? dd[i] : 0;
          break;
        case K::kFlatten:
          for (std::int64_t i = 0; i < l.in.numel(); ++i) ds[i] = dd[i];
          break;
        case K::kDropout:
          for (std::int64_t i = 0; i < l.in.numel(); ++i)
            ds[i] = dd[i] * masks[li][n * l.in.numel() + i];
          break;
      }
    }
    round_all(diff_in);
    diff = std::move(diff_in);
  }
  return res;
}

}  // namespace cohort::reference
