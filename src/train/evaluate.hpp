// Evaluation of the current weights on a whole split: forward passes in inference mode over
// chunks of `eval_rows` rows spread over the replicas. Per-chunk results are added in chunk order,
// so the figures do not depend on the number of workers. Not training: no gradients, no reducer.
#pragma once

#include <utility>

#include "cohort/data/dataset.hpp"
#include "step_graph.hpp"

namespace cohort::train {

// Mean loss and accuracy of `weights` on `set`.
std::pair<double, double> evaluate(StepGraph& graph, const data::Dataset& set, const float* weights,
                                   std::size_t eval_rows, int classes);

}  // namespace cohort::train
