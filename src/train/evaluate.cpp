// Evaluation over the replicas; see evaluate.hpp.
#include "evaluate.hpp"

#include <algorithm>
#include <numeric>
#include <vector>

namespace cohort::train {

std::size_t eval_chunks(const data::Dataset& set, std::size_t eval_rows) {
  return (set.count + eval_rows - 1) / eval_rows;
}

void evaluate_chunks(StepGraph& graph, const data::Dataset& set, const ReplicaWeights& weights,
                     std::size_t eval_rows, std::size_t first, std::size_t last, EvalParts& parts,
                     const data::Augmenter* augment) {
  const std::size_t chunks = eval_chunks(set, eval_rows);
  parts.loss.resize(chunks);
  parts.correct.resize(chunks);
  last = std::min(last, chunks);
  if (first >= last) return;
  std::vector<std::uint32_t> ids(set.count);
  std::iota(ids.begin(), ids.end(), std::uint32_t{0});
  const std::size_t workers = std::min(graph.workers(), last - first);
  graph.for_each_replica(workers, [&](std::size_t w) {
    Replica& r = graph.replica(w);
    for (std::size_t c = first + w; c < last; c += workers) {
      const std::size_t row = c * eval_rows, n = std::min(eval_rows, set.count - row);
      const auto N = static_cast<std::int64_t>(n);
      const auto chunk_ids = std::span<const std::uint32_t>(ids).subspan(row, n);
      if (augment)
        augment->assemble(set, chunk_ids, 0, /*train=*/false, r.eval_x.data(), r.eval_y.data());
      else
        data::assemble_batch(set, chunk_ids, r.eval_x.data(), r.eval_y.data());
      const nn::Evaluation e = r.evaluate(weights, N);
      parts.loss[c] = e.loss;
      parts.correct[c] = e.correct;
    }
  });
  for (std::size_t w = 0; w < graph.workers(); ++w) {
    graph.replica(w).net.reset_times();  // inference is not training time
    graph.replica(w).net.release_inference_plans();
  }
}

std::pair<double, double> eval_totals(const EvalParts& parts, std::size_t count) {
  double total_loss = 0, total_correct = 0;
  for (std::size_t c = 0; c < parts.loss.size(); ++c) {
    total_loss += parts.loss[c];
    total_correct += parts.correct[c];
  }
  return {total_loss / static_cast<double>(count), total_correct / static_cast<double>(count)};
}

}  // namespace cohort::train
