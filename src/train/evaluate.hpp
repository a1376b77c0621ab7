// Evaluation of the current weights on a whole split: forward passes in inference mode over
// chunks of `eval_rows` rows spread over the replicas. Per-chunk results are added in chunk order,
// so the figures do not depend on the number of workers (or, split over ranks and gathered, on
// the number of ranks). Not training: no gradients, no reducer.
#pragma once

#include <span>
#include <utility>
#include <vector>

#include "cohort/data/augment.hpp"
#include "cohort/data/dataset.hpp"
#include "step_graph.hpp"

namespace cohort::train {

// Per-chunk results: summed loss and correct count of chunk c (rows [c * eval_rows, ...)).
struct EvalParts {
  std::vector<double> loss, correct;  // correct counts are exact in a double (< 2^53)
};

// The number of chunks of `set`.
std::size_t eval_chunks(const data::Dataset& set, std::size_t eval_rows);
// Chunks [first, last) of `set` into parts (sized eval_chunks); the others are left as they are.
// `augment` (--augment; may be null): its normalization applies to the rows, nothing random.
void evaluate_chunks(StepGraph& graph, const data::Dataset& set, const ReplicaWeights& weights,
                     std::size_t eval_rows, std::size_t first, std::size_t last, EvalParts& parts,
                     const data::Augmenter* augment = nullptr);
// Mean loss and accuracy from every chunk's parts, added in chunk order.
std::pair<double, double> eval_totals(const EvalParts& parts, std::size_t count);

}  // namespace cohort::train
