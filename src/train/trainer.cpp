// The training loop: epochs of steps (a step = replicas computing leaf gradients in the step
// graph, the reducer combining them and, at its root, applying the optimizer to the master
// weights: step.cpp), evaluation after each epoch, checkpoints. The pieces live beside this file:
// root (include/cohort/train/root.hpp), batch weight gradients, staging, the step graph and
// replicas, evaluation, time accounting, tracing, validation; the trainer's state in
// trainer_impl.hpp.
#include "cohort/train/trainer.hpp"

#include <sys/resource.h>
#include <xxhash.h>

#include "trainer_impl.hpp"

namespace cohort::train {

namespace {
nn::Model parse_model(const std::string& spec, const data::Splits& d) {
  return nn::Model::parse(spec, input_shape(d.train),
                          static_cast<std::int64_t>(d.train.num_classes));
}

TrainConfig checked(TrainConfig c, const nn::Model& model, const data::Splits& data,
                    std::size_t ranks) {
  validate(c, model, data, ranks);
  return resolve_defaults(std::move(c), model);
}
}  // namespace

Trainer::Impl::Impl(TrainConfig c, const data::Splits& d, dist::Comm& world)
    : data(d),
      comm(world),
      model(parse_model(c.model, d)),
      config(checked(std::move(c), model, d, static_cast<std::size_t>(world.size()))),
      features(static_cast<std::size_t>(model.input_features())),
      optimizer(config.optimizer),
      weights(model.layout().total()),
      weights16(bf16_run() ? weights.size() : 0),
      bn_stats(model, leaves_for(config.batch)),
      batch_grads(config.weight_grads == TrainConfig::WeightGrads::kBatch
                      ? std::make_unique<BatchGrads>(model, config.batch, config.precision,
                                                     config.micro_batch)
                      : nullptr),
      augmenter(config.augment.empty()
                    ? std::nullopt
                    : std::make_optional<data::Augmenter>(data::parse_augment(config.augment),
                                                          data.train, config.seed)),
      // Rows in bf16 where the kind's are (a language model's are token ids: f32).
      staging(data.train, augmenter ? &*augmenter : nullptr, config.batch, config.micro_batch,
              bf16_run() && model.kind().bf16_rows()),
      tracer(config.workers, config.trace),
      root(optimizer, weights.data(), bf16_run() ? weights16.data() : nullptr, make_state(0),
           make_state(1), model.layout().total(), kRootChunk,
           config.clip_norm > 0 || config.on_nonfinite == TrainConfig::OnNonFinite::kSkip
               ? Root::Mode::kTwoPhase
               : Root::Mode::kFused,
           batch_grads.get(), config.trace ? &tracer : nullptr),
      graph(config.workers, model, config.eval_batch, config.blocked_layouts, config.precision),
      base_lr(optim::scaled_base_lr(config.schedule, config.optimizer.lr, config.batch)) {
  if (bf16_run()) {
    // The root writes the bf16 weights chunk by chunk; the replicas' copies of them in oneDNN's
    // layouts follow each chunk from its cache (nn::Net::keep_weight_copies).
    graph.keep_weight_copies(weights16.data());
    root.on_bf16_written([this](std::size_t b, std::size_t e) { graph.weights_written(b, e); });
  }
  model.init(weights.data(), config.seed);
  copy_to_bf16();
  if (config.no_decay_norm_bias && config.optimizer.weight_decay > 0)
    root.set_no_decay(model.norm_and_bias_ranges());
  const std::size_t max_leaves = leaves_for(config.batch);
  if (chains_leaves())
    chain = std::make_unique<LeafChain>(model.layout().total(),
                                        std::min(max_leaves, config.workers + 1));
  else
    for (std::size_t i = 0; i < max_leaves; ++i) leaf_grads.emplace_back(model.layout().total());
  leaf_loss.resize(max_leaves);
  if (comm.size() > 1)
    exchange = std::make_unique<ShardedStep>(
        comm, root, model.layout().total(), leaf_grads, leaf_loss, weights.data(),
        bf16_run() ? weights16.data() : nullptr, batch_grads.get(), config.micro_batch,
        config.trace ? &tracer : nullptr);
  else
    exchange = std::make_unique<LocalExchange>(config.reducer, model.layout().total(),
                                               config.workers, root, graph.executor(), chain.get());
}

std::vector<float*> Trainer::Impl::idle_leaf_buffers() {
  std::vector<float*> out;
  if (chain)
    for (std::size_t i = 0; i < chain->buffers(); ++i) out.push_back(chain->buffer(i));
  for (auto& g : leaf_grads) out.push_back(g.data());
  return out;
}

MemoryBreakdown Trainer::Impl::memory_breakdown() {
  MemoryBreakdown m;
  m.weights = weights.size() * sizeof(float) + weights16.size() * sizeof(bf16);
  m.optimizer_state = (state[0].size() + state[1].size()) * sizeof(float);
  m.gradients = idle_leaf_buffers().size() * model.layout().total() * sizeof(float);
  for (std::size_t w = 0; w < graph.workers(); ++w) {
    const nn::PlanMemory p = graph.replica(w).net.memory();
    m.plans += p.total;
    m.logits += p.logits;
    m.weight_copies += p.weight_copies;
  }
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) == 0)
    m.peak_rss = static_cast<std::size_t>(usage.ru_maxrss) * 1024;
  return m;
}

bool Trainer::Impl::chains_leaves() const {
  return train::chains_leaves(config, model.layout().total(),
                              static_cast<std::size_t>(comm.size()));
}

std::pair<double, double> Trainer::Impl::evaluate_set(const data::Dataset& set) {
  const std::size_t chunks = eval_chunks(set, config.eval_batch);
  const auto ranks = static_cast<std::size_t>(comm.size());
  const dist::Range mine = dist::even_part(chunks, ranks, static_cast<std::size_t>(comm.rank()));
  EvalParts parts;
  evaluate_chunks(graph, set, replica_weights(), config.eval_batch, mine.begin, mine.end, parts,
                  augmenter ? &*augmenter : nullptr);
  std::vector<std::size_t> bytes(ranks);
  for (std::size_t r = 0; r < ranks; ++r)
    bytes[r] = dist::even_part(chunks, ranks, r).size() * sizeof(double);
  comm.allgatherv(parts.loss.data(), bytes);
  comm.allgatherv(parts.correct.data(), bytes);
  return eval_totals(parts, set.count);
}

void Trainer::Impl::gather_owned(float* array) {
  const auto ranks = static_cast<std::size_t>(comm.size());
  const std::size_t n = model.layout().total(), chunk = root.chunk();
  std::vector<std::size_t> bytes(ranks);
  for (std::size_t r = 0; r < ranks; ++r) {
    const dist::Range c = dist::even_part(root.chunks(), ranks, r);
    bytes[r] = (std::min(n, c.end * chunk) - std::min(n, c.begin * chunk)) * sizeof(float);
  }
  comm.allgatherv(array, bytes);
}

// Epochs of steps from the current step (0, or a checkpoint's) to --steps or --epochs; evaluation
// after each epoch; observers between steps.
Summary Trainer::Impl::run(Observer& observer) {
  check_training_memory(config, model);
  run_observer = &observer;
  const std::uint64_t bytes_at_start = comm.bytes_sent();
  // Text: each row of each batch a keyed draw of a window (nanoGPT's sampling); otherwise a
  // shuffle per epoch.
  const data::Sampler sampler =
      data.train.text() ? data::Sampler::draws(data.train.count, config.seed, config.batch)
                        : data::Sampler(data.train.count, config.seed);
  const std::size_t B = config.batch;
  const std::size_t steps_per_epoch =
      config.drop_last ? data.train.count / B : (data.train.count + B - 1) / B;
  total_steps = config.steps != 0 ? config.steps : steps_per_epoch * config.epochs;
  Summary s;
  double first_step_seconds = 0;
  TimeBreakdown first_step_time;  // the time table after the first step
  std::uint64_t step_number = steps_done;
  const std::uint64_t steps_done_at_start = steps_done;
  const std::uint64_t rows_staged_ahead_at_start = staging.rows_staged_ahead();
  std::size_t first_b = static_cast<std::size_t>(step_number % steps_per_epoch);
  bool stopped = false;
  // This epoch's batches, and the next epoch's once its first step is the next step (its
  // leaves may be staged ahead; moved into `order`, its ids stay where they were). Text draws
  // are made a batch at a time: an epoch of a corpus has a window per token.
  data::EpochBatches order, next_order;
  for (std::size_t epoch = static_cast<std::size_t>(step_number / steps_per_epoch);
       step_number < total_steps && !stopped; ++epoch) {
    order = next_order.empty() ? data::EpochBatches(sampler, epoch, B) : std::move(next_order);
    next_order = {};
    double epoch_loss = 0, epoch_seconds = 0;
    std::size_t epoch_samples = 0, epoch_loss_samples = 0;  // the latter: applied steps only
    for (std::size_t b = first_b; b < steps_per_epoch && step_number < total_steps; ++b) {
      const auto ids = order.batch(b);
      plan.number = step_number + 1;
      Staging::Step next;  // the step after this one, if the run goes on
      if (step_number + 1 < total_steps) {
        if (b + 1 < steps_per_epoch) {
          next = {plan.number + 1, epoch, order.batch(b + 1)};
        } else {
          if (next_order.empty()) next_order = data::EpochBatches(sampler, epoch + 1, B);
          next = {plan.number + 1, epoch + 1, next_order.batch(0)};
        }
      }
      const auto t0 = Clock::now();
      const StepOutcome o = step({plan.number, epoch, ids}, next);
      const double dt = seconds_since(t0);
      tracer.end_step(t0, plan.workers);
      end_step_accounts(dt);
      if (step_number == steps_done_at_start) {  // it builds the primitives
        first_step_seconds = dt;
        first_step_time = time.total();
      }
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
      if (exchange->stop_agreed(observer.stop_requested())) {
        stopped = true;
        break;
      }
      // --eval-every, except where the epoch's (or the run's) end evaluates anyway.
      if (config.eval_every != 0 && step_number % config.eval_every == 0 &&
          b + 1 < steps_per_epoch && step_number < total_steps) {
        const auto t_eval = Clock::now();
        const auto [loss, accuracy] = evaluate_set(data.test);
        if (tracer.on())
          tracer.record("evaluate", tracer.controller_track(), nullptr, 0, t_eval, Clock::now());
        observer.on_eval({step_number, loss, accuracy, time.total().step});
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
    // A stop asked for during the epoch's last step or its evaluation (an observer's on_epoch)
    // ends the run here rather than after the next epoch's first step.
    if (!stopped && step_number < total_steps && exchange->stop_agreed(observer.stop_requested()))
      stopped = true;
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
  s.tokens_per_sample = static_cast<std::size_t>(model.kind().window());
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
  // Several ranks: the job's replicas share the leaves, and rank 0 (which reports) measures
  // while the others wait in the collective after it, so no rank computes during the floor.
  if (const std::uint64_t steps = step_number - steps_done_at_start; config.roofline && steps > 0) {
    const bool steady = steps > 1;
    const std::uint64_t job_replicas = comm.sum(config.workers);
    if (comm.rank() == 0) {
      const TimeBreakdown& t = s.time;
      const TimeBreakdown before = steady ? first_step_time : TimeBreakdown{};
      const double n = static_cast<double>(steady ? steps - 1 : steps);
      const double root_gemms = t.weight_grad - before.weight_grad;
      const RunWork work{
          (t.matmul + t.attention - before.matmul - before.attention - root_gemms) / n,
          root_gemms / n, (t.reduce - before.reduce) / n};
      s.roofline = measure_roofline(
          model, config, graph, optimizer.state_buffers(), (t.step - before.step) / n, work,
          static_cast<std::size_t>(job_replicas), static_cast<std::size_t>(comm.size()),
          chain ? 1 : leaves_for(config.batch), idle_leaf_buffers(),
          {weights.data(), weights.size()});
      s.roofline.first_step_seconds = steady ? first_step_seconds : 0;
    }
    comm.sum(0);
  }
  s.memory = memory_breakdown();  // after the roofline's measurement, whose buffers count too
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
  if (m.model.kind().window() > 0) {  // a language model: its vocabulary
    c.vocab = m.data.train.num_classes;
    c.characters = m.data.characters;
  }
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

void Trainer::start_from(const float* params, const float* stats) {
  Impl& m = *impl_;
  COHORT_CHECK(m.steps_done == 0, "start_from before the first step");
  m.model.from_canonical(params, m.weights.data());
  if (stats != nullptr)
    std::copy(stats, stats + m.model.stats_layout().total(), m.bn_stats.running());
  m.copy_to_bf16();
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
