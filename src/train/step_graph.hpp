// The workers of one trainer: a TBB arena of W threads, the replicas they run (one Net each), and
// the step's flow graph — a broadcast start node and one continue_node per replica, built once
// and run once per step. Not the step's logic: a node only calls the body the trainer passes.
//
// Thread-safety: run_replicas, parallel_for and replica(w) between runs are for the controller
// (one thread); a running body may use replica(w) for its own w and the executor.
// Every task body it runs (replica nodes, evaluation, executor chunks) first sets OpenMP (oneDNN's
// runtime) to one thread on its own thread: a call in main does not reach TBB's workers, and
// without it each primitive starts a team of its own and two workers' small layers run slower
// than one core.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "cohort/nn/net.hpp"
#include "cohort/reduce/executor.hpp"
#include "cohort/tensor/buffer.hpp"
#include "time_account.hpp"

namespace cohort::train {

// The weights the replicas read: the f32 master weights, and with --precision bf16 their bf16
// copy (which a bf16 Net reads instead); and the bn layers' running statistics that inference
// normalizes with (null without bn layers).
struct ReplicaWeights {
  const float* f32 = nullptr;
  const bf16* b16 = nullptr;
  const float* stats = nullptr;
};

// What one worker owns: its Net (primitives, activations, scratchpad), staging for evaluation,
// where its leaves' linear rows go (batch weight gradients), and its time accounts.
struct Replica {
  nn::Net net;
  AlignedBuffer<float> eval_x;       // (eval rows, features)
  AlignedBuffer<bf16> eval_x16;      // bf16 rows: eval_x converted, the Net's input
  std::vector<std::int32_t> eval_y;  // (eval rows)
  std::vector<nn::LinearRows> linear_rows;
  ReplicaClock clock;
  Replica(const nn::Model& model, std::size_t eval_rows, bool blocked_layouts,
          nn::Precision precision);
  // The first N samples of eval_x and eval_y in inference mode (the rows converted to bf16 first
  // where a bf16 Net's are: nn::ModelKind::bf16_rows): nn::Net::evaluate.
  nn::Evaluation evaluate(const ReplicaWeights& weights, std::int64_t N);
};

class StepGraph {
 public:
  // `workers` must be validated (train::validate): the arena and W replicas are sized from it.
  StepGraph(std::size_t workers, const nn::Model& model, std::size_t eval_rows,
            bool blocked_layouts, nn::Precision precision);
  ~StepGraph();

  std::size_t workers() const { return replicas_.size(); }
  Replica& replica(std::size_t w) { return *replicas_[w]; }

  // Both runs below first tell every replica's Net that the weights may have changed
  // (weights_changed): they do not change while a run's bodies run (a step's leaves, an
  // evaluation's chunks), and may between runs.
  // Runs body(w) for every w in [0, W) on the graph's replica nodes, inside the arena, and
  // returns when all have returned. If a body throws, the graph cancels what has not started,
  // waits for the running bodies, is reset for the next run, and the first exception is rethrown.
  void run_replicas(FunctionRef<void(std::size_t)> body);
  // Runs body(i) for i in [0, n) on the arena's threads (from inside or outside the arena); the
  // reducer's and the root's chunk-parallel work.
  reduce::Executor& executor();
  // One body per index, each on its own task (evaluation: index = replica).
  void for_each_replica(std::size_t n, FunctionRef<void(std::size_t)> body);
  // nn::Net::keep_weight_copies and weights_written on the replicas' shared copies: the caller
  // reports every write to the bf16 weights `params` (the trainer's root, chunk by chunk).
  void keep_weight_copies(const bf16* params);
  void weights_written(std::size_t begin, std::size_t end);

 private:
  void weights_changed();  // nn::Net::weights_changed on every replica's Net
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::vector<std::unique_ptr<Replica>> replicas_;
};

}  // namespace cohort::train
