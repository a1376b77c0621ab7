// Naive float64 reference for the layers cohort runs on oneDNN: linear, ReLU, softmax
// cross-entropy, forward and backward, written for clarity, not speed. The oracle for nn tests.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "cohort/nn/model.hpp"

namespace cohort::reference {

struct MlpResult {
  double loss = 0;              // summed over rows
  std::vector<double> logits;   // (N, C)
  std::vector<double> grad;     // layout().total(), gradient of the summed loss
};

// params: layout().total() values; x (N, IC0); labels (N).
inline MlpResult mlp_forward_backward(const nn::Model& m, const std::vector<double>& params,
                                      const std::vector<double>& x,
                                      const std::vector<std::int32_t>& labels, std::int64_t N) {
  using nn::LayerSpec;
  std::vector<std::vector<double>> acts{x};  // input of each layer, then the logits
  for (const auto& l : m.layers()) {
    const auto& in = acts.back();
    std::vector<double> out;
    if (l.kind == LayerSpec::Kind::kLinear) {
      out.assign(static_cast<std::size_t>(N * l.out), 0.0);
      for (std::int64_t r = 0; r < N; ++r)
        for (std::int64_t o = 0; o < l.out; ++o) {
          double s = params[l.bias + o];
          for (std::int64_t i = 0; i < l.in; ++i)
            s += params[l.weight + o * l.in + i] * in[r * l.in + i];
          out[r * l.out + o] = s;
        }
    } else {
      out = in;
      for (auto& v : out) v = v > 0 ? v : 0;
    }
    acts.push_back(std::move(out));
  }
  MlpResult res;
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
  for (std::size_t k = m.layers().size(); k-- > 0;) {
    const auto& l = m.layers()[k];
    const auto& in = acts[k];
    if (l.kind == LayerSpec::Kind::kReLU) {
      for (std::size_t i = 0; i < diff.size(); ++i) diff[i] = in[i] > 0 ? diff[i] : 0;
      continue;
    }
    std::vector<double> diff_in(static_cast<std::size_t>(N * l.in), 0.0);
    for (std::int64_t r = 0; r < N; ++r)
      for (std::int64_t o = 0; o < l.out; ++o) {
        double d = diff[r * l.out + o];
        res.grad[l.bias + o] += d;
        for (std::int64_t i = 0; i < l.in; ++i) {
          res.grad[l.weight + o * l.in + i] += d * in[r * l.in + i];
          diff_in[r * l.in + i] += d * params[l.weight + o * l.in + i];
        }
      }
    diff = std::move(diff_in);
  }
  return res;
}

}  // namespace cohort::reference
