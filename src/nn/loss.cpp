// Softmax cross-entropy with its gradient, numerically stable (subtract the row max before exp).
#include "cohort/nn/loss.hpp"

#include <cmath>

namespace cohort::nn {

double softmax_cross_entropy(const float* logits, const std::int32_t* labels, std::int64_t N,
                             std::int64_t C, float* diff_logits, std::int64_t stride) {
  if (stride == 0) stride = C;
  double loss = 0;
  for (std::int64_t r = 0; r < N; ++r) {
    const float* z = logits + r * stride;  // (C)
    float zmax = z[0];
    for (std::int64_t c = 1; c < C; ++c) zmax = std::max(zmax, z[c]);
    const float zy = z[labels[r]];
    float sum = 0;
    float* d = diff_logits ? diff_logits + r * stride : nullptr;
    for (std::int64_t c = 0; c < C; ++c) {
      const float e = std::exp(z[c] - zmax);
      sum += e;
      if (d) d[c] = e;  // each exponential computed once, scaled below
    }
    const float log_sum = std::log(sum);
    // loss_r = log(sum_c exp(z_c)) - z_y, computed around zmax.
    loss += static_cast<double>(log_sum - (zy - zmax));
    if (d) {
      const float inv = 1.0f / sum;
      for (std::int64_t c = 0; c < C; ++c) d[c] *= inv;
      d[labels[r]] -= 1.0f;
    }
  }
  return loss;
}

std::int64_t count_correct(const float* logits, const std::int32_t* labels, std::int64_t N,
                           std::int64_t C, std::int64_t stride) {
  if (stride == 0) stride = C;
  std::int64_t correct = 0;
  for (std::int64_t r = 0; r < N; ++r) {
    const float* z = logits + r * stride;
    std::int64_t best = 0;
    for (std::int64_t c = 1; c < C; ++c)
      if (z[c] > z[best]) best = c;
    correct += best == labels[r];
  }
  return correct;
}

}  // namespace cohort::nn
