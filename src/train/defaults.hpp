// The default leaf size (micro-batch): a function of the model, the batch and the precision only,
// never of the machine, the workers or the ranks, so that the same command gives the same weights
// on any machine whose kernels dispatch alike. Each model kind has a largest leaf (its cap,
// nn::ModelKind::leaf_rule: the caps and their reasons in src/nn/leaf_caps.hpp); the batch is cut
// into as few leaves as the cap allows (and at least the kind's min_leaves where the batch has
// that many rows), of equal rows (the last one possibly shorter), so that no leaf is a sliver. How
// the leaves serve more cores: docs/scaling.md.
#pragma once

#include <cstddef>

#include "cohort/nn/model.hpp"
#include "cohort/nn/net.hpp"

namespace cohort::train {

// The rows of each of the fewest leaves of at most `cap` rows that cover `batch`, as even as
// whole rows allow: ceil(batch / ceil(batch / cap)).
std::size_t balanced_leaf(std::size_t batch, std::size_t cap);
// The default micro-batch of `model` at `batch` in `precision` (0 for a batch of 0).
std::size_t default_micro_batch(const nn::Model& model, std::size_t batch, nn::Precision precision);

}  // namespace cohort::train
