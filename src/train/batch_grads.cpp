// Batch weight gradients; see batch_grads.hpp.
#include "batch_grads.hpp"

#include <algorithm>
#include <cstring>

#include "cohort/nn/batch_grad.hpp"
#include "cohort/reduce/kernels.hpp"
#include "cohort/reduce/reducer.hpp"
#include "time_account.hpp"

namespace cohort::train {

BatchGrads::BatchGrads(const nn::Model& model, std::size_t batch, nn::Precision precision,
                       std::size_t micro_batch)
    : precision_(precision), pairs_(row_pairs_for(precision, micro_batch)) {
  const bool b16 = precision == nn::Precision::kBf16;
  batch += batch % 2;  // row pairs: an odd batch's last pair has room for its zero partner
  const auto& layers = model.layers();
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const nn::LayerSpec& l = layers[i];
    if (l.kind != nn::LayerSpec::Kind::kLinear) continue;
    Linear b;
    b.in = l.in.C;
    b.out = l.out.C;
    b.reads_input = i == 0;  // its input is the staged batch (a linear layer's input is flat)
    const auto in = static_cast<std::size_t>(b.in), out = static_cast<std::size_t>(b.out);
    if (!b.reads_input) {  // (B, IC)
      if (b16)
        b.x16 = AlignedBuffer<bf16>(batch * in);
      else
        b.x = AlignedBuffer<float>(batch * in);
    }
    if (b16)
      b.dy16 = AlignedBuffer<bf16>(batch * out);  // (B, OC)
    else
      b.dy = AlignedBuffer<float>(batch * out);
    ranges_.push_back({l.weight, l.weight + in * out, linear_.size(), false});
    ranges_.push_back({l.bias, l.bias + out, linear_.size(), true});
    widest_ = std::max(widest_, out);
    linear_.push_back(std::move(b));
  }
  std::sort(ranges_.begin(), ranges_.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
}

void BatchGrads::leaf_rows(std::size_t first, std::vector<nn::LinearRows>& rows) {
  rows.resize(linear_.size());
  for (std::size_t o = 0; o < linear_.size(); ++o) {
    Linear& l = linear_[o];
    const std::size_t in = first * static_cast<std::size_t>(l.in),
                      out = first * static_cast<std::size_t>(l.out);
    if (precision_ == nn::Precision::kBf16) {
      rows[o] = {l.reads_input ? nullptr : l.x16.data() + in, l.dy16.data() + out, pairs_};
    } else {
      rows[o] = {l.reads_input ? nullptr : l.x.data() + in, l.dy.data() + out};
    }
  }
}

std::vector<BatchGrads::RowArray> BatchGrads::row_arrays() {
  std::vector<RowArray> out;
  for (std::size_t o = 0; o < linear_.size(); ++o) {
    Linear& l = linear_[o];
    std::size_t wb = 0, we = 0, bb = 0, be = 0;
    for (const Range& r : ranges_) {
      if (r.linear != o) continue;
      (r.bias ? bb : wb) = r.begin;
      (r.bias ? be : we) = r.end;
    }
    // X is read by the weight's gradient only; dY by the weight's and the bias's.
    const bool b16 = precision_ == nn::Precision::kBf16;
    const std::size_t bytes = b16 ? sizeof(bf16) : sizeof(float);
    void* x = b16 ? static_cast<void*>(l.x16.data()) : static_cast<void*>(l.x.data());
    void* dy = b16 ? static_cast<void*>(l.dy16.data()) : static_cast<void*>(l.dy.data());
    if (!l.reads_input)
      out.push_back({x, static_cast<std::size_t>(l.in), 1, bytes, {wb, 0}, {we, 0}});
    out.push_back(
        {dy, static_cast<std::size_t>(l.out), pairs_ ? 2u : 1u, bytes, {wb, bb}, {we, be}});
  }
  return out;
}

std::vector<std::pair<std::size_t, std::size_t>> BatchGrads::computed_ranges() const {
  std::vector<std::pair<std::size_t, std::size_t>> out;
  for (const Range& r : ranges_) out.emplace_back(r.begin, r.end);
  return out;
}

std::pair<std::size_t, std::size_t> BatchGrads::input_reader() const {
  for (const Range& r : ranges_)
    if (!r.bias && linear_[r.linear].reads_input) return {r.begin, r.end};
  return {0, 0};
}

// A chunk end inside a weight row computes the whole rows into `scratch` and copies its part.
double BatchGrads::gradient(const float* const* sources, std::size_t k, std::size_t begin,
                            std::size_t end, std::size_t rows, const void* staged_input, float* out,
                            float* scratch, const Consumer* consumer) const {
  const bool b16 = precision_ == nn::Precision::kBf16;
  const auto n_rows = static_cast<std::int64_t>(rows);
  std::size_t pos = begin;
  double gemm_seconds = 0, taking = 0;  // taking: the consumer's seconds
  bool going = true;
  auto hand = [&](const float* g, std::size_t a, std::size_t b) {
    if (consumer == nullptr || a >= b) return;
    const auto t0 = Clock::now();
    going = consumer->take(g, a, b);
    taking += seconds_since(t0);
  };
  auto leaf_sum = [&](std::size_t a, std::size_t b) {
    if (a >= b) return;
    const float* at[reduce::kMaxArity];
    for (std::size_t j = 0; j < k; ++j) at[j] = sources[j] + a;
    reduce::sum_sources(out + (a - begin), at, k, b - a);
    hand(out + (a - begin), a, b);
  };
  for (const Range& r : ranges_) {
    if (r.end <= begin) continue;
    if (r.begin >= end || !going) break;
    const std::size_t a = std::max(r.begin, begin), b = std::min(r.end, end);
    leaf_sum(pos, a);
    if (!going) break;
    pos = b;
    const Linear& l = linear_[r.linear];
    const auto t0 = Clock::now();
    const double taken_before = taking;
    float* dst = out + (a - begin);
    const auto lo = static_cast<std::int64_t>(a - r.begin),
               hi = static_cast<std::int64_t>(b - r.begin);
    bool handed = false;
    if (r.bias) {
      if (pairs_)
        nn::linear_bias_grad_pairs(l.dy16.data(), n_rows, l.out, lo, hi, dst);
      else if (b16)
        nn::linear_bias_grad(l.dy16.data(), n_rows, l.out, lo, hi, dst);
      else
        nn::linear_bias_grad(l.dy.data(), n_rows, l.out, lo, hi, dst);
    } else {
      const std::int64_t r0 = lo / l.out, r1 = (hi + l.out - 1) / l.out;
      const bool whole_rows = lo % l.out == 0 && hi % l.out == 0;
      float* dw = whole_rows ? dst : scratch;
      if (b16) {
        const bf16* x = l.reads_input ? static_cast<const bf16*>(staged_input) : l.x16.data();
        if (pairs_ && whole_rows && consumer != nullptr) {
          // Rows i of this weight are [r.begin + i * OC, r.begin + (i + 1) * OC) of the array.
          const auto width = static_cast<std::size_t>(l.out);
          auto take_rows = [&](std::int64_t i, std::int64_t j, const float* g) {
            hand(g, r.begin + static_cast<std::size_t>(i) * width,
                 r.begin + static_cast<std::size_t>(j) * width);
            return going;
          };
          nn::RowConsumer rows_to{take_rows, scratch, {}};
          for (std::size_t j = 0; j < consumer->arrays.size(); ++j)
            if (const auto [base, bytes] = consumer->arrays[j]; base != nullptr)
              rows_to.touched[j] = {static_cast<char*>(base) + r.begin * bytes, width * bytes};
          handed = true;
          nn::linear_weight_grad_pairs(x, l.dy16.data(), n_rows, l.in, l.out, r0, r1, rows_to);
        } else if (pairs_) {
          nn::linear_weight_grad_pairs(x, l.dy16.data(), n_rows, l.in, l.out, r0, r1, dw);
        } else {
          nn::linear_weight_grad(x, l.dy16.data(), n_rows, l.in, l.out, r0, r1, dw);
        }
      } else {
        const float* x = l.reads_input ? static_cast<const float*>(staged_input) : l.x.data();
        nn::linear_weight_grad(x, l.dy.data(), n_rows, l.in, l.out, r0, r1, dw);
      }
      if (!whole_rows) std::memcpy(dst, scratch + (lo - r0 * l.out), (b - a) * sizeof(float));
    }
    gemm_seconds += seconds_since(t0) - (taking - taken_before);
    if (!handed) hand(dst, a, b);
  }
  if (going) leaf_sum(pos, end);
  return gemm_seconds;
}

}  // namespace cohort::train
