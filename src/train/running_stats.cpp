// The fold of the leaves' bn statistics; see running_stats.hpp.
#include "running_stats.hpp"

#include <algorithm>

#include "cohort/dist/shard_plan.hpp"
#include "cohort/train/trainer.hpp"

namespace cohort::train {

RunningStats::RunningStats(const nn::Model& model, std::size_t max_leaves)
    : model_(model), n_(model.stats_layout().total()), running_(n_), leaves_(max_leaves * n_) {
  model.init_stats(running_.data());
}

void RunningStats::fold(std::size_t rows, std::size_t micro_batch, dist::Comm& comm) {
  if (n_ == 0) return;
  const std::size_t leaves = (rows + micro_batch - 1) / micro_batch;
  if (comm.size() > 1) {
    const auto ranks = static_cast<std::size_t>(comm.size());
    std::vector<std::size_t> bytes(ranks);
    for (std::size_t r = 0; r < ranks; ++r)
      bytes[r] = dist::even_part(leaves, ranks, r).size() * n_ * sizeof(float);
    comm.allgatherv(leaves_.data(), bytes);
  }
  constexpr float m = kBatchNormMomentum;
  float* run = running_.data();
  for (std::size_t leaf = 0; leaf < leaves; ++leaf) {
    const std::size_t n = std::min(micro_batch, rows - leaf * micro_batch);
    const float* batch = leaves_.data() + leaf * n_;
    for (const nn::LayerSpec* l : model_.batchnorm_layers()) {
      const auto C = static_cast<std::size_t>(l->in.C);
      const double values = static_cast<double>(n) * static_cast<double>(l->in.H * l->in.W);
      const float unbiased = values > 1 ? static_cast<float>(values / (values - 1)) : 1.0f;
      for (std::size_t c = 0; c < C; ++c) {
        float& mean = run[l->running_mean + c];
        float& var = run[l->running_var + c];
        mean = (1 - m) * mean + m * batch[l->running_mean + c];
        var = (1 - m) * var + m * (batch[l->running_var + c] * unbiased);
      }
    }
  }
}

}  // namespace cohort::train
