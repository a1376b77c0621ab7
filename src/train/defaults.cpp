// The default leaf size: defaults.hpp.
#include "defaults.hpp"

#include <algorithm>

#include "cohort/tensor/bf16.hpp"

namespace cohort::train {

std::size_t gpt_leaf_windows(const nn::GptShape& s, nn::Precision precision) {
  const auto per_window =
      static_cast<std::size_t>(s.block * s.layers * (s.embd + s.heads * s.block));
  const std::size_t values =
      precision == nn::Precision::kBf16 ? kLeafActivationValues : kLeafActivationValues / 2;
  const std::size_t tokens = kLeafTokens / static_cast<std::size_t>(s.block);
  return std::max<std::size_t>(1, std::min(values / per_window, tokens));
}

std::size_t conv_micro_batch(const nn::Model& model, nn::Precision precision) {
  if (precision != nn::Precision::kBf16) return kConvMicroBatch;
  std::int64_t largest = model.input().numel();  // values a row, of any layer's output
  for (const nn::LayerSpec& l : model.layers()) largest = std::max(largest, l.out.numel());
  const auto bytes = static_cast<std::size_t>(largest) * sizeof(bf16) * kConvMicroBatch;
  return bytes > kConvLeafBytes ? kConvMicroBatch / 2 : kConvMicroBatch;
}

std::size_t balanced_leaf(std::size_t batch, std::size_t cap) {
  const std::size_t leaves = (batch + cap - 1) / std::max<std::size_t>(cap, 1);
  return (batch + leaves - 1) / std::max<std::size_t>(leaves, 1);
}

std::size_t default_micro_batch(const nn::Model& model, std::size_t batch,
                                nn::Precision precision) {
  if (batch == 0) return 0;
  // The leaf's rows are the statistics' sample.
  if (model.has_batchnorm()) return std::min(batch, kBatchNormMicroBatch);
  std::size_t cap = kLinearMicroBatch;
  if (model.gpt()) cap = gpt_leaf_windows(model.gpt()->shape(), precision);
  if (model.has_conv()) cap = conv_micro_batch(model, precision);
  return balanced_leaf(batch, cap);
}

}  // namespace cohort::train
