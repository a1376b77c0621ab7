// Softmax cross-entropy over logits, fused with its gradient. A plain loop: at (N, 10) it is a
// few microseconds and not worth a primitive.
#pragma once

#include <cstdint>

namespace cohort::nn {

// logits (N, C); labels (N) in [0, C). Writes diff_logits (N, C) = softmax(logits) - onehot(y),
// the gradient of the *summed* per-sample loss (the caller divides by the global batch once,
// at the root of the reduction). Returns the summed loss. diff_logits may be null (inference).
// `stride` (C where 0): the distance between rows of logits and of diff_logits, whose columns
// past C are neither read nor written.
double softmax_cross_entropy(const float* logits, const std::int32_t* labels, std::int64_t N,
                             std::int64_t C, float* diff_logits, std::int64_t stride = 0);

// Number of rows whose largest logit is at the label (ties: the lowest index wins); rows
// `stride` apart as above.
std::int64_t count_correct(const float* logits, const std::int32_t* labels, std::int64_t N,
                           std::int64_t C, std::int64_t stride = 0);

}  // namespace cohort::nn
