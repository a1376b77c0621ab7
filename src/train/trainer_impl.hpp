// Private to src/train: the trainer's state (Trainer::Impl) and the declarations of its parts,
// defined in trainer.cpp (construction, the run loop, checkpoints, evaluation) and step.cpp (one
// training step: the replicas' leaves, staging ahead, the reducer and its root, the checks that
// refuse a non-finite step). Not an interface: only those two files include it.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "batch_grads.hpp"
#include "cohort/core/error.hpp"
#include "cohort/data/augment.hpp"
#include "cohort/dist/comm.hpp"
#include "cohort/train/root.hpp"
#include "cohort/train/trainer.hpp"
#include "evaluate.hpp"
#include "leaf_chain.hpp"
#include "roofline.hpp"
#include "running_stats.hpp"
#include "sharded.hpp"
#include "staging.hpp"
#include "step_graph.hpp"
#include "time_account.hpp"
#include "trace.hpp"
#include "tuning.hpp"

namespace cohort::train {

// What a step did, for the run loop and the observers.
struct StepOutcome {
  double loss = 0;  // mean over the batch
  float lr = 0;
  double grad_norm = std::numeric_limits<double>::quiet_NaN();
  bool skipped = false;
  std::string skip_reason;
};

struct Trainer::Impl {
  // The step being run: written by the controller before the graph runs, read by the replicas.
  struct StepPlan {
    std::uint64_t number = 0;             // 1-based
    std::span<const std::uint32_t> ids;   // this step's samples (Staging assembles them)
    std::size_t leaves = 0, workers = 0;  // workers: replicas with leaves this step
    std::size_t first_leaf = 0;           // this rank's leaves: [first_leaf, end_leaf)
    std::size_t end_leaf = 0;
    reduce::Reducer* reducer = nullptr;
    // Next unclaimed leaf (replicas claim leaves one by one).
    alignas(kCacheLine) std::atomic<std::size_t> next_leaf{0};
    // Leaves whose contribution has begun: all of them, and the root is running or done.
    alignas(kCacheLine) std::atomic<std::size_t> contributing{0};
  };

  const data::Splits& data;
  dist::Comm& comm;  // the run's process group: one process, or MPI ranks
  const nn::Model model;
  const TrainConfig config;  // validated, defaults resolved: everything below is sized from it
  const std::size_t features;
  const optim::Optimizer optimizer;
  AlignedBuffer<float> weights;
  AlignedBuffer<bf16> weights16;  // bf16: the copy replicas read, written by the root
  AlignedBuffer<float> state[2];  // the optimizer's per-parameter arrays (momentum, moments)
  std::vector<AlignedBuffer<float>> leaf_grads;  // one per leaf of a full batch (or none: chain)
  std::unique_ptr<LeafChain> chain;  // leaf gradients summed in leaf order (leaf_chain_bytes)
  std::vector<double> leaf_loss;     // summed loss of each leaf
  RunningStats bn_stats;             // bn: per leaf, and the running statistics
  std::unique_ptr<BatchGrads> batch_grads;   // --weight-grads batch
  std::optional<data::Augmenter> augmenter;  // --augment (training set statistics)
  Staging staging;                           // the step's batch, and the next one's leaves
  Tracer tracer;
  Root root;
  StepGraph graph;
  const float base_lr;  // --lr after the linear scaling rule
  TimeAccount time;
  // Where the leaves go: the local reduction tree, or (more than one rank) the sharded root.
  std::unique_ptr<Exchange> exchange;
  StepPlan plan;
  Observer* run_observer = nullptr;  // of the current run(), for the ranks' stop agreement
  std::uint64_t steps_done = 0;      // training steps done (batches consumed)
  std::uint64_t updates_done = 0;    // optimizer updates applied to `weights`
  std::uint64_t skipped_total = 0, skipped_in_a_row = 0;
  std::uint64_t total_steps = 0;  // of the current run(): the schedule's horizon

  Impl(TrainConfig c, const data::Splits& d, dist::Comm& world);

  bool bf16_run() const { return config.precision == nn::Precision::kBf16; }
  ReplicaWeights replica_weights() const {
    return {weights.data(), weights16.data(), bn_stats.running()};
  }
  // The bf16 copy of the whole weights (after initialization or a restore).
  void copy_to_bf16() {
    if (!bf16_run()) return;
    to_bf16(weights.data(), weights16.data(), weights.size());
    root.bf16_written(0, weights.size());
  }

  // The optimizer's state array i (allocated here, during construction), or null if it keeps none.
  float* make_state(std::size_t i) {
    if (i >= optimizer.state_buffers()) return nullptr;
    state[i] = AlignedBuffer<float>(model.layout().total());
    return state[i].data();
  }

  std::size_t leaves_for(std::size_t rows) const {
    return (rows + config.micro_batch - 1) / config.micro_batch;
  }
  // Whether the steps sum their leaves in a LeafChain (TrainConfig::leaf_chain_bytes).
  bool chains_leaves() const;
  // The leaves' gradient buffers, whose contents are dead between steps (the roofline's scratch).
  std::vector<float*> idle_leaf_buffers();
  // What holds the memory now (Summary::memory).
  MemoryBreakdown memory_breakdown();

  // Graph node body: replica w claims leaves one at a time, assembles, computes and contributes
  // each, then finishes. Claiming balances a slow core; the contribution that completes the tree
  // runs the root. Nothing here waits for another node (chunk-owner's finish waits only for
  // leaves that running replicas have claimed). On failure the step is aborted, so no replica
  // waits for a leaf that will never come.
  void run_replica(std::size_t w);

  // Nothing left to claim, and the root waits for a leaf another replica is computing: rather
  // than wait, assemble rows of the next step, a small piece at a time, until the last leaf is in
  // (from then on this thread is the root's). Bitwise neutral: rows depend on (id, epoch) only.
  void stage_ahead(Replica& r, std::uint32_t track);

  // One leaf: its rows assembled into the staged batch (unless staged ahead), forward and
  // backward into its gradient buffer (and, with batch weight gradients, its linear rows into the
  // batch arrays).
  void compute_leaf(Replica& r, std::uint32_t track, std::size_t leaf, float* grad);
  // The leaf (computed into `grad`, a chain buffer) joins the chain; the call that completes the
  // chain contributes its sum as the one leaf of the step's reducer, which runs the root.
  void chain_leaf(std::size_t leaf, float* grad);

  // One training step on `current`'s ids: replicas compute the leaves, the exchange brings their
  // sum to the root, which applies the optimizer (fused, or after the whole gradient is checked
  // and measured, on the exchange's owned chunks).
  // `next`: the step after it, whose leaves an idle replica may stage ahead (ids empty: none).
  StepOutcome step(const Staging::Step& current, const Staging::Step& next);

  // Several ranks, batch weight gradients: a first linear layer's gradient reads the whole
  // staged batch, so this rank assembles the other ranks' rows too (data is never sent).
  void assemble_other_ranks_rows();

  // The two-phase root's second phase: the norm of the mean gradient, the clip factor, and the
  // optimizer over every chunk, spread over the arena's threads. Returns the norm.
  double apply_second_phase(float lr, float inv_rows);

  // A non-finite loss or gradient: stop the run, or (--on-nonfinite skip, two-phase: nothing was
  // applied) skip the step.
  StepOutcome refuse(StepOutcome out, const std::string& reason);

  // Where element i of the flat parameter array belongs, for messages: "fc1.weight[1234]".
  std::string tensor_of(std::size_t i) const;

  // The first non-finite leaf loss or summed-gradient element of the step just run, or "".
  std::string non_finite_reason() const;

  void end_step_accounts(double wall);

  // Each rank evaluates a contiguous run of the chunks; the parts are all-gathered and added in
  // chunk order, as one process adds them (one process: every chunk, nothing to gather).
  std::pair<double, double> evaluate_set(const data::Dataset& set);

  // Every rank's owned chunks of `array` (n floats) to every rank, in place (one process: none).
  void gather_owned(float* array);

  Summary run(Observer& observer);
};

}  // namespace cohort::train
