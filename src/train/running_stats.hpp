// The bn layers' running statistics in training (docs/architecture.md, "BatchNorm per leaf"):
// every leaf's Net writes its batch statistics into the leaf's slice here, and after an applied
// step they are folded into the running statistics in leaf order, never in the order replicas
// finished. With several ranks the leaves' slices are all-gathered first, so every rank folds the
// same array. Empty (size 0, null pointers) for a model without bn layers.
//
// Thread-safety: leaf(l) slices are written by the replica computing leaf l; fold and the rest
// are for the controller, between steps.
#pragma once

#include <cstddef>
#include <vector>

#include "cohort/dist/comm.hpp"
#include "cohort/nn/model.hpp"
#include "cohort/tensor/buffer.hpp"

namespace cohort::train {

class RunningStats {
 public:
  // PyTorch's initial statistics (mean 0, variance 1); room for `max_leaves` leaves' statistics.
  // The model must outlive this.
  RunningStats(const nn::Model& model, std::size_t max_leaves);

  std::size_t size() const { return n_; }  // floats: model.stats_layout().total()
  // Where leaf l's Net writes its batch mean and biased variance (null without bn).
  float* leaf(std::size_t l) { return n_ ? leaves_.data() + l * n_ : nullptr; }
  // The running statistics evaluation normalizes with (null without bn).
  const float* running() const { return n_ ? running_.data() : nullptr; }
  float* running() { return n_ ? running_.data() : nullptr; }

  // After an applied step of `rows` rows in leaves of `micro_batch` (the last may be shorter):
  // for each leaf in order, running = (1 - momentum) running + momentum batch, the variance made
  // unbiased with m / (m - 1) for the leaf's m = rows x H x W values per channel (PyTorch's
  // update once per forward pass). `comm` with several ranks: each rank holds the slices of its
  // leaves (dist::even_part of the leaves), which are all-gathered first.
  void fold(std::size_t rows, std::size_t micro_batch, dist::Comm& comm);

 private:
  const nn::Model& model_;
  const std::size_t n_;
  AlignedBuffer<float> running_;
  AlignedBuffer<float> leaves_;  // (max leaves, n_)
};

}  // namespace cohort::train
