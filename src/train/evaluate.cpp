// Evaluation over the replicas; see evaluate.hpp.
#include "evaluate.hpp"

#include <algorithm>
#include <numeric>
#include <vector>

#include "cohort/nn/loss.hpp"

namespace cohort::train {

std::pair<double, double> evaluate(StepGraph& graph, const data::Dataset& set, const float* weights,
                                   std::size_t eval_rows, int classes) {
  const std::size_t chunks = (set.count + eval_rows - 1) / eval_rows;
  std::vector<double> loss(chunks);
  std::vector<std::int64_t> correct(chunks);
  std::vector<std::uint32_t> ids(set.count);
  std::iota(ids.begin(), ids.end(), std::uint32_t{0});
  const std::size_t workers = std::min(graph.workers(), chunks);
  graph.for_each_replica(workers, [&](std::size_t w) {
    Replica& r = graph.replica(w);
    for (std::size_t c = w; c < chunks; c += workers) {
      const std::size_t first = c * eval_rows, n = std::min(eval_rows, set.count - first);
      const auto N = static_cast<std::int64_t>(n);
      data::assemble_batch(set, std::span(ids).subspan(first, n), r.eval_x.data(), r.eval_y.data());
      const float* logits = r.net.forward(weights, r.eval_x.data(), N);  // (N, classes)
      loss[c] = nn::softmax_cross_entropy(logits, r.eval_y.data(), N, classes, nullptr);
      correct[c] = nn::count_correct(logits, r.eval_y.data(), N, classes);
    }
  });
  for (std::size_t w = 0; w < graph.workers(); ++w)
    graph.replica(w).net.reset_times();  // inference is not training time
  double total_loss = 0, total_correct = 0;
  for (std::size_t c = 0; c < chunks; ++c) {
    total_loss += loss[c];
    total_correct += static_cast<double>(correct[c]);
  }
  return {total_loss / static_cast<double>(set.count),
          total_correct / static_cast<double>(set.count)};
}

}  // namespace cohort::train
