// The training loop: epochs of steps; a step = replicas computing leaf gradients in the step
// graph, the reducer combining them and, at its root, applying the optimizer to the master
// weights. The pieces live beside this file: root (include/cohort/train/root.hpp), batch weight
// gradients, the step graph and replicas, evaluation, time accounting, tracing, validation.
#include "cohort/train/trainer.hpp"

#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>
#include <tuple>

#include "batch_grads.hpp"
#include "cohort/core/error.hpp"
#include "cohort/data/augment.hpp"
#include "cohort/dist/comm.hpp"
#include "cohort/train/root.hpp"
#include "evaluate.hpp"
#include "roofline.hpp"
#include "running_stats.hpp"
#include "sharded.hpp"
#include "staging.hpp"
#include "step_graph.hpp"
#include "time_account.hpp"
#include "trace.hpp"

namespace cohort::train {

namespace {
// What a step did, for the run loop and the observers.
struct StepOutcome {
  double loss = 0;  // mean over the batch
  float lr = 0;
  double grad_norm = std::numeric_limits<double>::quiet_NaN();
  bool skipped = false;
  std::string skip_reason;
};

nn::Model parse_model(const std::string& spec, const data::Splits& d) {
  return nn::Model::parse(spec, input_shape(d.train));
}

TrainConfig checked(TrainConfig c, const nn::Model& model, const data::Splits& data) {
  validate(c, model, data);
  return resolve_defaults(std::move(c), model);
}

// Rethrows the exception in flight with the step number: InputError stays InputError (exit 2),
// anything else becomes InternalError (exit 1).
[[noreturn]] void rethrow_at_step(std::uint64_t step) {
  const std::string where = "step " + std::to_string(step) + ": ";
  try {
    throw;
  } catch (const InputError& e) {
    throw InputError(where + e.what());
  } catch (const std::exception& e) {
    throw InternalError(where + e.what());
  }
}
}  // namespace

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
  std::vector<AlignedBuffer<float>> leaf_grads;  // one per leaf of a full batch
  std::vector<double> leaf_loss;                 // summed loss of each leaf
  RunningStats bn_stats;                         // bn: per leaf, and the running statistics
  std::unique_ptr<BatchGrads> batch_grads;       // --weight-grads batch
  std::optional<data::Augmenter> augmenter;      // --augment (training set statistics)
  Staging staging;                               // the step's batch, and the next one's leaves
  Tracer tracer;
  Root root;
  StepGraph graph;
  std::map<std::size_t, std::unique_ptr<reduce::Reducer>> reducers;  // by leaf count
  const float base_lr;  // --lr after the linear scaling rule
  TimeAccount time;
  std::unique_ptr<ShardedStep> sharded;  // more than one rank
  StepPlan plan;
  Observer* run_observer = nullptr;  // of the current run(), for the ranks' stop agreement
  std::uint64_t steps_done = 0;      // training steps done (batches consumed)
  std::uint64_t updates_done = 0;    // optimizer updates applied to `weights`
  std::uint64_t skipped_total = 0, skipped_in_a_row = 0;
  std::uint64_t total_steps = 0;  // of the current run(): the schedule's horizon

  Impl(TrainConfig c, const data::Splits& d, dist::Comm& world)
      : data(d),
        comm(world),
        model(parse_model(c.model, d)),
        config(checked(std::move(c), model, d)),
        features(static_cast<std::size_t>(model.input_features())),
        optimizer(config.optimizer),
        weights(model.layout().total()),
        weights16(bf16_run() ? weights.size() : 0),
        bn_stats(model, leaves_for(config.batch)),
        batch_grads(config.weight_grads == TrainConfig::WeightGrads::kBatch
                        ? std::make_unique<BatchGrads>(model, config.batch, config.precision)
                        : nullptr),
        augmenter(config.augment.empty()
                      ? std::nullopt
                      : std::make_optional<data::Augmenter>(data::parse_augment(config.augment),
                                                            data.train, config.seed)),
        staging(data.train, augmenter ? &*augmenter : nullptr, config.batch, config.micro_batch,
                bf16_run()),
        tracer(config.workers, config.trace),
        root(optimizer, weights.data(), bf16_run() ? weights16.data() : nullptr, make_state(0),
             make_state(1), model.layout().total(), kRootChunk,
             config.clip_norm > 0 || config.on_nonfinite == TrainConfig::OnNonFinite::kSkip
                 ? Root::Mode::kTwoPhase
                 : Root::Mode::kFused,
             batch_grads.get(), config.trace ? &tracer : nullptr),
        graph(config.workers, model, config.eval_batch, config.blocked_layouts, config.precision),
        base_lr(optim::scaled_base_lr(config.schedule, config.optimizer.lr, config.batch)) {
    model.init(weights.data(), config.seed);
    copy_to_bf16();
    if (config.no_decay_norm_bias && config.optimizer.weight_decay > 0)
      root.set_no_decay(model.norm_and_bias_ranges());
    const std::size_t max_leaves = leaves_for(config.batch);
    for (std::size_t i = 0; i < max_leaves; ++i) leaf_grads.emplace_back(model.layout().total());
    leaf_loss.resize(max_leaves);
    if (comm.size() > 1)
      sharded = std::make_unique<ShardedStep>(
          comm, root, model.layout().total(), leaf_grads, leaf_loss, weights.data(),
          bf16_run() ? weights16.data() : nullptr, batch_grads.get(), config.micro_batch,
          config.trace ? &tracer : nullptr);
  }

  bool bf16_run() const { return config.precision == nn::Precision::kBf16; }
  ReplicaWeights replica_weights() const {
    return {weights.data(), weights16.data(), bn_stats.running()};
  }
  // The bf16 copy of the whole weights (after initialization or a restore).
  void copy_to_bf16() {
    if (bf16_run()) to_bf16(weights.data(), weights16.data(), weights.size());
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

  // One reducer per leaf count (a partial last batch has its own decomposition). Arity: one flat
  // root over all leaves, up to 64 (docs/reduce_results.md measured binary trees at 0.31 of it
  // for 2 MiB gradients). Its workers are the replicas that get leaves (each calls finish).
  reduce::Reducer& reducer_for(std::size_t leaves) {
    auto& slot = reducers[leaves];
    if (!slot)
      slot = reduce::make_reducer(config.reducer,
                                  {.n = model.layout().total(),
                                   .leaves = leaves,
                                   .workers = std::min(config.workers, leaves),
                                   .arity = std::clamp<std::size_t>(leaves, 2, reduce::kMaxArity),
                                   .chunk = root.chunk()},
                                  graph.executor());
    return *slot;
  }

  // Graph node body: replica w claims leaves one at a time, assembles, computes and contributes
  // each, then finishes. Claiming balances a slow core; the contribution that completes the tree
  // runs the root. Nothing here waits for another node (chunk-owner's finish waits only for
  // leaves that running replicas have claimed). On failure the step is aborted, so no replica
  // waits for a leaf that will never come.
  void run_replica(std::size_t w) {
    if (w >= plan.workers) return;
    Replica& r = graph.replica(w);
    const auto track = static_cast<std::uint32_t>(w);
    tracer.enter_replica(track);
    try {
      for (;;) {
        // relaxed: the counter only hands out distinct indices; the plan was published to this
        // node by the graph's start message.
        const std::size_t leaf =
            plan.first_leaf + plan.next_leaf.fetch_add(1, std::memory_order_relaxed);
        if (leaf >= plan.end_leaf) break;
        compute_leaf(r, track, leaf);
        if (!plan.reducer) continue;  // several ranks: the sharded root takes the leaves
        const auto t0 = Clock::now();
        {
          ReducerCall call;
          plan.contributing.fetch_add(1, std::memory_order_relaxed);
          plan.reducer->contribute(w, leaf, leaf_grads[leaf].data());
        }
        r.clock.reduce += seconds_since(t0);
        if (tracer.on()) tracer.record("combine", track, "leaf", leaf, t0, Clock::now());
      }
      if (!plan.reducer) return;
      stage_ahead(r, track);
      const auto t0 = Clock::now();
      {
        ReducerCall call;
        plan.reducer->finish(w);
      }
      r.clock.reduce += seconds_since(t0);
    } catch (...) {
      if (plan.reducer) plan.reducer->abort_step();
      throw;
    }
  }

  // Nothing left to claim, and the root waits for a leaf another replica is computing: rather
  // than wait, assemble rows of the next step, a small piece at a time, until the last leaf is in
  // (from then on this thread is the root's). Bitwise neutral: rows depend on (id, epoch) only.
  void stage_ahead(Replica& r, std::uint32_t track) {
    while (plan.contributing.load(std::memory_order_relaxed) < plan.leaves) {
      const auto t0 = Clock::now();
      if (!staging.stage_ahead()) return;
      r.clock.data += seconds_since(t0);
      if (tracer.on()) tracer.record("stage ahead", track, nullptr, 0, t0, Clock::now());
    }
  }

  // One leaf: its rows assembled into the staged batch (unless staged ahead), forward and
  // backward into its gradient buffer (and, with batch weight gradients, its linear rows into the
  // batch arrays).
  void compute_leaf(Replica& r, std::uint32_t track, std::size_t leaf) {
    const std::size_t first = leaf * config.micro_batch;
    const std::size_t n = std::min(config.micro_batch, plan.ids.size() - first);
    const auto t0 = Clock::now();
    const bool assembled = staging.stage(first, n) > 0;
    r.clock.data += seconds_since(t0);
    const auto t1 = Clock::now();
    if (tracer.on() && assembled) tracer.record("data", track, "leaf", leaf, t0, t1);
    if (config.leaf_hook) config.leaf_hook(plan.number, leaf);
    if (batch_grads) batch_grads->leaf_rows(first, r.linear_rows);
    float* grad = leaf_grads[leaf].data();
    const nn::StreamKey key{config.seed, plan.number, leaf};  // dropout: never keyed by worker
    const auto rows = batch_grads ? std::span<const nn::LinearRows>(r.linear_rows)
                                  : std::span<const nn::LinearRows>();
    const auto N = static_cast<std::int64_t>(n);
    float* batch_stats = bn_stats.leaf(leaf);
    leaf_loss[leaf] =
        bf16_run() ? r.net.forward_backward(weights16.data(), staging.x16() + first * features,
                                            staging.y() + first, N, grad, key, rows, batch_stats)
                   : r.net.forward_backward(weights.data(), staging.x() + first * features,
                                            staging.y() + first, N, grad, key, rows, batch_stats);
    if (tracer.on()) {
      tracer.record("forward", track, "leaf", leaf, t1, r.net.backward_begin());
      tracer.record("backward", track, "leaf", leaf, r.net.backward_begin(), Clock::now());
    }
    if (config.gradient_hook) config.gradient_hook(plan.number, leaf, grad, model.layout().total());
    // A non-finite loss must never reach the weights. Stopping: fail the step before
    // contributing, so the root (the only writer) never runs. Skipping: the two-phase root sees
    // the loss and applies nothing.
    if (!std::isfinite(leaf_loss[leaf]) && config.on_nonfinite == TrainConfig::OnNonFinite::kStop)
      throw InternalError("non-finite loss (" + std::to_string(leaf_loss[leaf]) + ") in leaf " +
                          std::to_string(leaf) + "; the weights are those after step " +
                          std::to_string(plan.number - 1));
  }

  // One training step on `current`'s ids: replicas compute the leaves, the reducer sums them, the
  // root applies the optimizer (fused, or after the whole gradient is checked and measured).
  // `next`: the step after it, whose leaves an idle replica may stage ahead (ids empty: none).
  StepOutcome step(const Staging::Step& current, const Staging::Step& next) {
    const std::span<const std::uint32_t> ids = current.ids;
    const std::size_t rows = ids.size();
    plan.ids = ids;
    plan.leaves = leaves_for(rows);
    plan.first_leaf = 0;
    plan.end_leaf = plan.leaves;
    plan.reducer = nullptr;
    if (sharded) {
      const dist::Range mine = sharded->begin_step(rows);
      plan.first_leaf = mine.begin;
      plan.end_leaf = mine.end;
    } else {
      plan.reducer = &reducer_for(plan.leaves);
    }
    plan.workers = std::min(config.workers, plan.end_leaf - plan.first_leaf);
    plan.next_leaf.store(0, std::memory_order_relaxed);  // ordered before the nodes by try_put
    plan.contributing.store(0, std::memory_order_relaxed);
    // Several ranks stage no leaves ahead (a rank's leaves are its share of the batch).
    staging.begin_step(current, sharded ? Staging::Step{} : next);
    tracer.begin_step(plan.number);
    StepOutcome out;
    out.lr = optim::lr_at(config.schedule, base_lr, updates_done, total_steps);
    const float inv_rows = 1.0f / static_cast<float>(rows);
    root.begin_step(optimizer.scalars(out.lr, inv_rows, updates_done + 1), rows, staging.input());
    if (plan.reducer) plan.reducer->begin_step(root.sink());
    try {
      graph.run_replicas([this](std::size_t w) { run_replica(w); });
      if (plan.reducer) plan.reducer->wait_step();  // the parameter server: on its own thread
    } catch (...) {
      if (plan.reducer) plan.reducer->reset();  // the root never ran whole: it needs every leaf
      rethrow_at_step(plan.number);
    }
    if (sharded) {
      try {
        sharded->reduce(graph.executor(), run_observer && run_observer->stop_requested(),
                        [&] { assemble_other_ranks_rows(); });
      } catch (...) {
        rethrow_at_step(plan.number);
      }
    }
    time.add_root(root.stats());
    for (std::size_t leaf = 0; leaf < plan.leaves; ++leaf) out.loss += leaf_loss[leaf];
    out.loss /= static_cast<double>(rows);  // in leaf order
    if (std::string reason = non_finite_reason(); !reason.empty()) {
      out = refuse(out, reason);  // (or throws: the run stops)
    } else if (root.mode() == Root::Mode::kTwoPhase) {
      out.grad_norm = apply_second_phase(out.lr, inv_rows);
    }
    if (!out.skipped) bn_stats.fold(rows, config.micro_batch, comm);  // in leaf order
    if (sharded) {
      sharded->end_step();
      time.add_exchange(sharded->exchange_seconds());
    }
    return out;
  }

  // Several ranks, batch weight gradients: a first linear layer's gradient reads the whole
  // staged batch, so this rank assembles the other ranks' rows too (data is never sent).
  void assemble_other_ranks_rows() {
    if (!batch_grads || !sharded->needs_staged_input()) return;
    const std::size_t rows = plan.ids.size();
    constexpr std::size_t kRowsBetweenProgress = 32;  // the messages move while rows are staged
    auto assemble = [&](std::size_t first, std::size_t last) {
      last = std::min(last, rows);
      for (std::size_t at = first; at < last; at += kRowsBetweenProgress) {
        staging.stage(at, std::min(kRowsBetweenProgress, last - at));
        comm.progress();
      }
    };
    assemble(0, plan.first_leaf * config.micro_batch);
    assemble(plan.end_leaf * config.micro_batch, rows);
  }

  // The two-phase root's second phase: the norm of the mean gradient, the clip factor, and the
  // optimizer over every chunk, spread over the arena's threads. Returns the norm.
  double apply_second_phase(float lr, float inv_rows) {
    const double norm = std::sqrt(root.sum_squares()) * static_cast<double>(inv_rows);
    double clip = 1.0;
    if (config.clip_norm > 0)
      clip = std::min(1.0, static_cast<double>(config.clip_norm) / (norm + 1e-6));
    const auto t0 = Clock::now();
    if (sharded) {
      const dist::Range owned = sharded->owned_chunks();
      root.apply_summed(
          optimizer.scalars(lr, static_cast<float>(inv_rows * clip), updates_done + 1),
          graph.executor(), owned.begin, owned.end);
      sharded->share_weights();
    } else {
      root.apply_summed(
          optimizer.scalars(lr, static_cast<float>(inv_rows * clip), updates_done + 1),
          graph.executor());
    }
    time.add_second_phase(seconds_since(t0));
    return norm;
  }

  // A non-finite loss or gradient: stop the run, or (--on-nonfinite skip, two-phase: nothing was
  // applied) skip the step.
  StepOutcome refuse(StepOutcome out, const std::string& reason) {
    const std::string at = "step " + std::to_string(plan.number) + ": " + reason;
    if (root.mode() == Root::Mode::kFused)
      throw InternalError(at +
                          "; the run stops (blocks with finite gradients were applied; "
                          "nothing is saved from this state)");
    if (config.on_nonfinite == TrainConfig::OnNonFinite::kStop)
      throw InternalError(at + "; the weights are those after step " +
                          std::to_string(plan.number - 1));
    out.skipped = true;
    out.skip_reason = reason;
    return out;
  }

  // Where element i of the flat parameter array belongs, for messages: "fc1.weight[1234]".
  std::string tensor_of(std::size_t i) const {
    for (const auto& e : model.layout().entries())
      if (i >= e.offset && i < e.offset + e.shape.numel())
        return e.name + "[" + std::to_string(i - e.offset) + "]";
    return "padding[" + std::to_string(i) + "]";
  }

  // The first non-finite leaf loss or summed-gradient element of the step just run, or "".
  std::string non_finite_reason() const {
    for (std::size_t leaf = 0; leaf < plan.leaves; ++leaf)
      if (!std::isfinite(leaf_loss[leaf]))
        return "non-finite loss (" + std::to_string(leaf_loss[leaf]) + ") in leaf " +
               std::to_string(leaf);
    if (const std::size_t i = root.first_non_finite(); i != model.layout().total())
      return "non-finite gradient in " + tensor_of(i);
    return "";
  }

  void end_step_accounts(double wall) {
    for (std::size_t w = 0; w < graph.workers(); ++w)
      time.add_replica(graph.replica(w).clock, graph.replica(w).net);
    time.end_step(wall, config.workers);
  }

  // Several ranks: each evaluates a contiguous run of the chunks; the parts are all-gathered
  // and added in chunk order, as one process adds them.
  std::pair<double, double> evaluate_set(const data::Dataset& set) {
    if (!sharded)
      return evaluate(graph, set, replica_weights(), config.eval_batch, model.num_classes(),
                      augmenter ? &*augmenter : nullptr);
    const std::size_t chunks = eval_chunks(set, config.eval_batch);
    const auto ranks = static_cast<std::size_t>(comm.size());
    const dist::Range mine = dist::even_part(chunks, ranks, static_cast<std::size_t>(comm.rank()));
    EvalParts parts;
    evaluate_chunks(graph, set, replica_weights(), config.eval_batch, model.num_classes(),
                    mine.begin, mine.end, parts, augmenter ? &*augmenter : nullptr);
    std::vector<std::size_t> bytes(ranks);
    for (std::size_t r = 0; r < ranks; ++r)
      bytes[r] = dist::even_part(chunks, ranks, r).size() * sizeof(double);
    comm.allgatherv(parts.loss.data(), bytes);
    comm.allgatherv(parts.correct.data(), bytes);
    return eval_totals(parts, set.count);
  }

  // Several ranks: every rank's owned chunks of `array` (n floats) to every rank, in place.
  void gather_owned(float* array) {
    if (!sharded) return;
    const auto ranks = static_cast<std::size_t>(comm.size());
    const std::size_t n = model.layout().total(), chunk = root.chunk();
    std::vector<std::size_t> bytes(ranks);
    for (std::size_t r = 0; r < ranks; ++r) {
      const dist::Range c = dist::even_part(root.chunks(), ranks, r);
      bytes[r] = (std::min(n, c.end * chunk) - std::min(n, c.begin * chunk)) * sizeof(float);
    }
    comm.allgatherv(array, bytes);
  }

  Summary run(Observer& observer);
};

// Epochs of steps from the current step (0, or a checkpoint's) to --steps or --epochs; evaluation
// after each epoch; observers between steps.
Summary Trainer::Impl::run(Observer& observer) {
  run_observer = &observer;
  const std::uint64_t bytes_at_start = comm.bytes_sent();
  data::Sampler sampler(data.train.count, config.seed);
  const std::size_t B = config.batch;
  const std::size_t steps_per_epoch =
      config.drop_last ? data.train.count / B : (data.train.count + B - 1) / B;
  total_steps = config.steps != 0 ? config.steps : steps_per_epoch * config.epochs;
  Summary s;
  double first_step_seconds = 0;
  std::uint64_t step_number = steps_done;
  const std::uint64_t steps_done_at_start = steps_done;
  const std::uint64_t rows_staged_ahead_at_start = staging.rows_staged_ahead();
  std::size_t first_b = static_cast<std::size_t>(step_number % steps_per_epoch);
  bool stopped = false;
  // This epoch's sample order, and the next epoch's once its first step is the next step (its
  // leaves may be staged ahead; moved into `order`, its ids stay where they were).
  std::vector<std::uint32_t> order, next_order;
  auto batch_of = [&](const std::vector<std::uint32_t>& o, std::size_t b) {
    return std::span(o).subspan(b * B, std::min(B, o.size() - b * B));
  };
  for (std::size_t epoch = static_cast<std::size_t>(step_number / steps_per_epoch);
       step_number < total_steps && !stopped; ++epoch) {
    order = next_order.empty() ? sampler.epoch_order(epoch) : std::move(next_order);
    next_order.clear();
    double epoch_loss = 0, epoch_seconds = 0;
    std::size_t epoch_samples = 0, epoch_loss_samples = 0;  // the latter: applied steps only
    for (std::size_t b = first_b; b < steps_per_epoch && step_number < total_steps; ++b) {
      const auto ids = batch_of(order, b);
      plan.number = step_number + 1;
      Staging::Step next;  // the step after this one, if the run goes on
      if (step_number + 1 < total_steps) {
        if (b + 1 < steps_per_epoch) {
          next = {plan.number + 1, epoch, batch_of(order, b + 1)};
        } else {
          if (next_order.empty()) next_order = sampler.epoch_order(epoch + 1);
          next = {plan.number + 1, epoch + 1, batch_of(next_order, 0)};
        }
      }
      const auto t0 = Clock::now();
      const StepOutcome o = step({plan.number, epoch, ids}, next);
      const double dt = seconds_since(t0);
      if (step_number == steps_done_at_start) first_step_seconds = dt;  // builds the primitives
      tracer.end_step(t0, plan.workers);
      end_step_accounts(dt);
      steps_done = ++step_number;
      epoch_seconds += dt;
      epoch_samples += ids.size();
      if (o.skipped) {
        ++skipped_total;
        if (++skipped_in_a_row >= config.max_skips)
          throw InternalError("step " + std::to_string(step_number) + ": " +
                              std::to_string(skipped_in_a_row) +
                              " steps in a row skipped (--max-skips), the last for a " +
                              o.skip_reason + "; the run stops");
      } else {
        ++updates_done;
        skipped_in_a_row = 0;
        epoch_loss += o.loss * static_cast<double>(ids.size());
        epoch_loss_samples += ids.size();
      }
      observer.on_step({step_number, epoch, b + 1, steps_per_epoch, o.loss, ids.size(),
                        time.total().step, o.lr, o.grad_norm, o.skipped, o.skip_reason,
                        skipped_total, total_steps});
      // Between steps: the weights are a whole step's. Several ranks stop together, at the
      // step where any of them asked (gathered within the step).
      if (sharded ? sharded->stop_agreed() : observer.stop_requested()) {
        stopped = true;
        break;
      }
    }
    first_b = 0;
    if (epoch_samples == 0) break;
    const auto t_eval = Clock::now();
    std::tie(s.test_loss, s.test_accuracy) = evaluate_set(data.test);
    if (tracer.on())
      tracer.record("evaluate", tracer.controller_track(), nullptr, 0, t_eval, Clock::now());
    s.train_loss = epoch_loss_samples ? epoch_loss / static_cast<double>(epoch_loss_samples)
                                      : std::numeric_limits<double>::quiet_NaN();
    s.epochs = static_cast<double>(epoch) +
               static_cast<double>(epoch_samples) / static_cast<double>(data.train.count);
    observer.on_epoch({epoch, step_number, s.train_loss, s.test_loss, s.test_accuracy,
                       static_cast<double>(epoch_samples) / epoch_seconds, time.total().step});
    s.samples_per_second += static_cast<double>(epoch_samples);  // total, divided below
  }
  if (step_number == steps_done_at_start) {  // nothing left to train (e.g. a finished resume)
    std::tie(s.test_loss, s.test_accuracy) = evaluate_set(data.test);
    s.epochs = static_cast<double>(step_number) / static_cast<double>(steps_per_epoch);
  }
  s.steps = step_number;
  s.updates = updates_done;
  s.skipped = skipped_total;
  s.stopped = stopped;
  s.time = time.total();
  s.samples_per_second = s.time.step > 0 ? s.samples_per_second / s.time.step : 0;
  s.workers = config.workers;
  s.ranks = static_cast<std::size_t>(comm.size());
  s.precision = config.precision;
  // The mean over ranks (a collective: every rank ends run() together).
  const std::uint64_t bytes = comm.sum(comm.bytes_sent() - bytes_at_start);
  if (step_number > steps_done_at_start)
    s.bytes_sent_per_step = static_cast<double>(bytes) / static_cast<double>(comm.size()) /
                            static_cast<double>(step_number - steps_done_at_start);
  s.batch = config.batch;
  s.micro_batch = config.micro_batch;
  s.rows_staged_ahead = staging.rows_staged_ahead() - rows_staged_ahead_at_start;
  s.parameters = model.layout().numel();
  s.weights_digest =
      weights_digest(weights.data(), weights.size(), bn_stats.running(), bn_stats.size());
  // The roofline compares a step in its steady state: the run's first step, which also creates
  // every primitive, is left out when there are others (it is still in samples/s).
  if (const std::uint64_t steps = step_number - steps_done_at_start; config.roofline && steps > 0) {
    const bool steady = steps > 1;
    s.roofline = measure_roofline(
        model, config, graph, optimizer.state_buffers(),
        steady ? (s.time.step - first_step_seconds) / static_cast<double>(steps - 1) : s.time.step);
    s.roofline.first_step_seconds = steady ? first_step_seconds : 0;
  }
  return s;
}

checkpoint::Checkpoint Trainer::checkpoint(std::string config_json) const {
  Impl& m = *impl_;  // (several ranks: gathers the owned optimizer state into the arrays)
  checkpoint::Checkpoint c;
  c.model = m.config.model;
  c.step = m.steps_done;
  c.updates = m.updates_done;
  c.skipped = m.skipped_total;
  c.optimizer = optim::to_string(m.config.optimizer.kind);
  c.seed = m.config.seed;
  c.batch = m.config.batch;
  c.micro_batch = m.config.micro_batch;
  c.train_count = m.data.train.count;
  c.drop_last = m.config.drop_last;
  c.input = {m.data.train.channels, m.data.train.rows, m.data.train.cols};  // the data's
  c.config_json = std::move(config_json);
  // In canonical (PyTorch's) order, so a checkpoint does not depend on how this build stores
  // linear weights.
  c.weights.resize(m.weights.size());
  m.model.to_canonical(m.weights.data(), c.weights.data());
  // Never save what cannot be trained on: an overflowing update shows up here at the latest.
  for (float w : c.weights)
    if (!std::isfinite(w))
      throw InternalError("step " + std::to_string(m.steps_done) +
                          ": the weights are not finite (the run diverged); not saving them");
  for (std::size_t i = 0; i < m.optimizer.state_buffers(); ++i) {
    m.gather_owned(m.state[i].data());  // several ranks: each owns its chunks' state
    c.state.emplace_back(m.state[i].size());
    m.model.to_canonical(m.state[i].data(), c.state.back().data());
  }
  c.running_stats.assign(m.bn_stats.running(), m.bn_stats.running() + m.bn_stats.size());
  return c;
}

void Trainer::restore(const checkpoint::Checkpoint& c, const std::string& name) {
  Impl& m = *impl_;
  check_resume(m.config, m.model, m.data, c, name);
  m.model.from_canonical(c.weights.data(), m.weights.data());
  for (std::size_t i = 0; i < c.state.size(); ++i)
    m.model.from_canonical(c.state[i].data(), m.state[i].data());
  std::copy(c.running_stats.begin(), c.running_stats.end(), m.bn_stats.running());
  m.copy_to_bf16();
  m.steps_done = c.step;
  m.updates_done = c.updates;
  m.skipped_total = c.skipped;
  m.skipped_in_a_row = 0;
}

std::uint64_t Trainer::steps_done() const { return impl_->steps_done; }

std::vector<TraceSpan> Trainer::trace() const { return impl_->tracer.spans(); }
std::vector<std::string> Trainer::trace_tracks() const { return impl_->tracer.tracks(); }
bool Trainer::trace_truncated() const { return impl_->tracer.truncated(); }
std::pair<double, double> Trainer::evaluate_test() { return impl_->evaluate_set(impl_->data.test); }

Trainer::Trainer(TrainConfig config, const data::Splits& data, dist::Comm* comm)
    : local_(comm ? nullptr : dist::local_comm()),
      impl_(std::make_unique<Impl>(std::move(config), data, comm ? *comm : *local_)) {}
Trainer::~Trainer() = default;
Summary Trainer::run(Observer& observer) { return impl_->run(observer); }
const TrainConfig& Trainer::config() const { return impl_->config; }
const nn::Model& Trainer::model() const { return impl_->model; }
const float* Trainer::weights() const { return impl_->weights.data(); }
const float* Trainer::running_stats() const { return impl_->bn_stats.running(); }

std::string weights_digest(const float* weights, std::size_t n, const float* stats,
                           std::size_t stats_n) {
  // One stream over both arrays: without statistics, the digest of the weights alone.
  XXH3_state_t* state = XXH3_createState();
  COHORT_CHECK(state != nullptr, "XXH3 state");
  XXH3_128bits_reset(state);
  XXH3_128bits_update(state, weights, n * sizeof(float));
  if (stats_n != 0) XXH3_128bits_update(state, stats, stats_n * sizeof(float));
  const XXH128_hash_t h = XXH3_128bits_digest(state);
  XXH3_freeState(state);
  char hex[33];
  std::snprintf(hex, sizeof hex, "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                static_cast<unsigned long long>(h.low64));
  return hex;
}

}  // namespace cohort::train
