// The training loop: epochs of steps; a step = replicas computing leaf gradients in a TBB arena,
// the reducer combining them and, at its root, applying SGD to the master weights.
#include "cohort/train/trainer.hpp"

#include <xxhash.h>
#include <omp.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>
#include <oneapi/tbb/task_scheduler_observer.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <thread>

#include "cohort/core/error.hpp"
#include "cohort/nn/loss.hpp"
#include "cohort/nn/net.hpp"
#include "cohort/reduce/reducer.hpp"
#include "cohort/tensor/buffer.hpp"

namespace cohort::train {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Every thread that enters the arena runs OpenMP (oneDNN's runtime) with one thread, before it
// runs any replica work: a call in main does not reach TBB's workers, and without it two workers'
// small layers run at 0.35x of one core (measured on the 2-core development machine).
class OmpSingleThread : public oneapi::tbb::task_scheduler_observer {
 public:
  explicit OmpSingleThread(oneapi::tbb::task_arena& arena)
      : oneapi::tbb::task_scheduler_observer(arena) {
    observe(true);
  }
  ~OmpSingleThread() override { observe(false); }
  void on_scheduler_entry(bool) override { omp_set_num_threads(1); }
};

// The reducer's chunk-parallel work on TBB: idle arena threads take chunks.
class TbbExecutor final : public reduce::Executor {
 public:
  void parallel_for(std::size_t n, reduce::FunctionRef<void(std::size_t)> body) override {
    oneapi::tbb::parallel_for(std::size_t{0}, n, [&](std::size_t i) { body(i); });
  }
};

// What one worker owns: its Net (primitives, activations, scratchpad) and batch staging.
struct Replica {
  nn::Net net;
  AlignedBuffer<float> x;          // (rows, features)
  std::vector<std::int32_t> y;     // (rows)
  double data_seconds = 0;
  double reduce_seconds = 0;
  Replica(const nn::Model& model, std::size_t rows)
      : net(model), x(rows * static_cast<std::size_t>(model.input_features())), y(rows) {}
};

}  // namespace

void validate(const TrainConfig& c, const nn::Model& model, const data::Splits& data) {
  auto bad = [](const std::string& flag, const std::string& expected, const std::string& found) {
    throw InputError(flag + ": expected " + expected + ", found " + found);
  };
  if (c.workers > 1024) bad("--workers", "1 .. 1024 (0: one per core)", std::to_string(c.workers));
  if (c.batch == 0 || c.batch > data.train.count)
    bad("--batch", "1 .. " + std::to_string(data.train.count) + " (the training set size)",
        std::to_string(c.batch));
  if (c.micro_batch > c.batch)
    bad("--micro-batch", "1 .. --batch (" + std::to_string(c.batch) + "), or 0 for the whole batch",
        std::to_string(c.micro_batch));
  if (c.epochs == 0 && c.steps == 0) bad("--epochs", "at least 1 (or --steps N)", "0");
  if (c.eval_batch == 0) bad("eval batch", "at least 1", "0");
  if (static_cast<std::size_t>(model.input_features()) != data.train.features())
    bad("--model", "an input size of " + std::to_string(data.train.features()) + " (" +
                       std::to_string(data.train.rows) + "x" + std::to_string(data.train.cols) +
                       " images)",
        std::to_string(model.input_features()) + " in '" + model.spec() + "'");
  if (static_cast<std::size_t>(model.num_classes()) != data.train.num_classes)
    bad("--model", "an output size of " + std::to_string(data.train.num_classes) + " (classes)",
        std::to_string(model.num_classes()) + " in '" + model.spec() + "'");
  reduce::parse_strategy(c.reducer);
  optim::validate(c.sgd);
}

struct Trainer::Impl {
  TrainConfig config;
  const data::Splits& data;
  nn::Model model;
  AlignedBuffer<float> weights, velocity;
  std::vector<AlignedBuffer<float>> leaf_grads;  // one per leaf of a full batch
  std::vector<double> leaf_loss;
  std::vector<std::unique_ptr<Replica>> replicas;
  oneapi::tbb::task_arena arena;
  OmpSingleThread omp_pin{arena};
  TbbExecutor executor;
  std::map<std::size_t, std::unique_ptr<reduce::Reducer>> reducers;  // by leaf count
  optim::Sgd sgd;
  TimeBreakdown time;

  Impl(TrainConfig c, const data::Splits& d)
      : config(std::move(c)),
        data(d),
        model(nn::Model::parse(config.model)),
        arena(static_cast<int>(resolve_workers(config.workers))),
        sgd(config.sgd) {
    validate(config, model, data);
    config.workers = resolve_workers(config.workers);
    if (config.micro_batch == 0) config.micro_batch = config.batch;
    omp_set_num_threads(1);  // this thread also runs replica work inside the arena
    weights = AlignedBuffer<float>(model.layout().total());
    model.init(weights.data(), config.seed);
    if (config.sgd.momentum != 0) velocity = AlignedBuffer<float>(model.layout().total());
    const std::size_t max_leaves = leaves_for(config.batch);
    for (std::size_t i = 0; i < max_leaves; ++i) leaf_grads.emplace_back(model.layout().total());
    leaf_loss.resize(max_leaves);
    const std::size_t rows = std::max(config.micro_batch, config.eval_batch);
    for (std::size_t w = 0; w < config.workers; ++w)
      replicas.push_back(std::make_unique<Replica>(model, rows));
  }

  static std::size_t resolve_workers(std::size_t w) {
    return w != 0 ? w : std::max(1u, std::thread::hardware_concurrency());
  }
  std::size_t leaves_for(std::size_t rows) const {
    return (rows + config.micro_batch - 1) / config.micro_batch;
  }

  reduce::Reducer& reducer_for(std::size_t leaves) {
    auto& slot = reducers[leaves];
    if (!slot) {
      // Arity 0: one flat root over all leaves (the last arrival sums them in one chunk-parallel
      // pass; docs/reduce_results.md measured binary trees at 0.31 of it for 2 MiB gradients).
      const std::size_t arity = config.tree_arity != 0
                                    ? config.tree_arity
                                    : std::clamp<std::size_t>(leaves, 2, reduce::kMaxArity);
      reduce::ReducerConfig rc{.n = model.layout().total(), .leaves = leaves,
                               .workers = config.workers, .arity = arity};
      slot = reduce::make_reducer(reduce::parse_strategy(config.reducer), rc, executor);
    }
    return *slot;
  }

  // One optimizer step on the samples `ids`; returns the mean loss.
  double step(std::span<const std::uint32_t> ids, std::uint64_t step_number) {
    const std::size_t rows = ids.size(), M = config.micro_batch, L = leaves_for(rows);
    const std::size_t workers = std::min(config.workers, L);
    reduce::Reducer& reducer = reducer_for(L);
    const float lr = config.sgd.lr;
    double optimizer_seconds = 0;  // written by root chunks; summed under the reducer's ordering
    std::vector<double> chunk_seconds(reducer.config().n / reducer.config().chunk + 1);
    // The mean is taken inside the optimizer's sweep (grad_scale), so a one-leaf root needs no
    // pass of its own: the reducer hands the leaf straight to this callback.
    const float inv_rows = 1.0f / static_cast<float>(rows);
    auto apply = [&](const float* grad_sum, std::size_t begin, std::size_t end) {
      auto t0 = Clock::now();
      sgd.apply(weights.data(), grad_sum, velocity.data(), begin, end, lr, inv_rows);
      chunk_seconds[begin / reducer.config().chunk] = seconds_since(t0);
    };
    reducer.begin_step(reduce::Sink::chunks(apply));
    try {
      arena.execute([&] {
        oneapi::tbb::parallel_for(
            std::size_t{0}, workers,
            [&](std::size_t w) {
              Replica& r = *replicas[w];
              for (std::size_t leaf = w * L / workers; leaf < (w + 1) * L / workers; ++leaf) {
                const std::size_t first = leaf * M, n = std::min(M, rows - first);
                auto t0 = Clock::now();
                data::assemble_batch(data.train, ids.subspan(first, n), r.x.data(), r.y.data());
                auto t1 = Clock::now();
                r.data_seconds += std::chrono::duration<double>(t1 - t0).count();
                float* grad = leaf_grads[leaf].data();
                leaf_loss[leaf] = r.net.forward_backward(weights.data(), r.x.data(), r.y.data(),
                                                         static_cast<std::int64_t>(n), grad);
                auto t2 = Clock::now();
                reducer.contribute(w, leaf, grad);
                r.reduce_seconds += seconds_since(t2);
              }
            },
            oneapi::tbb::simple_partitioner());
      });
    } catch (const InputError&) {
      reducer.reset();
      throw;
    } catch (const std::exception& e) {
      reducer.reset();
      throw InternalError("step " + std::to_string(step_number) + ": " + e.what());
    }
    COHORT_CHECK(reducer.step_done(), "every leaf was contributed but the step is not complete");
    for (auto& r : replicas) {  // collect per step, so evaluation's forward passes stay out
      time.matmul += r->net.times().matmul;
      time.eltwise += r->net.times().eltwise;
      time.loss += r->net.times().loss;
      r->net.reset_times();
    }
    for (double s : chunk_seconds) optimizer_seconds += s;
    time.optimizer += optimizer_seconds;
    double loss = 0;
    for (std::size_t leaf = 0; leaf < L; ++leaf) loss += leaf_loss[leaf];  // leaf order
    return loss / static_cast<double>(rows);
  }

  // Mean loss and accuracy over a whole split, in chunks spread over the replicas; per-chunk
  // results are summed in chunk order so the figures do not depend on W.
  std::pair<double, double> evaluate(const data::Dataset& set) {
    const std::size_t chunk = config.eval_batch, chunks = (set.count + chunk - 1) / chunk;
    std::vector<double> loss(chunks);
    std::vector<std::int64_t> correct(chunks);
    std::vector<std::uint32_t> ids(set.count);
    for (std::size_t i = 0; i < set.count; ++i) ids[i] = static_cast<std::uint32_t>(i);
    const std::size_t workers = std::min(config.workers, chunks);
    arena.execute([&] {
      oneapi::tbb::parallel_for(
          std::size_t{0}, workers,
          [&](std::size_t w) {
            Replica& r = *replicas[w];
            for (std::size_t c = w; c < chunks; c += workers) {
              const std::size_t first = c * chunk, n = std::min(chunk, set.count - first);
              data::assemble_batch(set, std::span(ids).subspan(first, n), r.x.data(), r.y.data());
              const float* logits =
                  r.net.forward(weights.data(), r.x.data(), static_cast<std::int64_t>(n));
              const auto N = static_cast<std::int64_t>(n);
              loss[c] = nn::softmax_cross_entropy(logits, r.y.data(), N, model.num_classes(),
                                                  nullptr);
              correct[c] = nn::count_correct(logits, r.y.data(), N, model.num_classes());
            }
          },
          oneapi::tbb::simple_partitioner());
    });
    for (auto& r : replicas) r->net.reset_times();  // inference is not training time
    double total_loss = 0, total_correct = 0;
    for (std::size_t c = 0; c < chunks; ++c) {
      total_loss += loss[c];
      total_correct += static_cast<double>(correct[c]);
    }
    return {total_loss / static_cast<double>(set.count),
            total_correct / static_cast<double>(set.count)};
  }

  Summary run(Observer& observer) {
    data::Sampler sampler(data.train.count, config.seed);
    const std::size_t B = config.batch;
    const std::size_t steps_per_epoch =
        config.drop_last ? data.train.count / B : (data.train.count + B - 1) / B;
    const std::uint64_t total_steps =
        config.steps != 0 ? config.steps : steps_per_epoch * config.epochs;
    Summary s;
    std::uint64_t step_number = 0;
    for (std::size_t epoch = 0; step_number < total_steps; ++epoch) {
      const auto order = sampler.epoch_order(epoch);
      double epoch_loss = 0, epoch_seconds = 0;
      std::size_t epoch_samples = 0;
      for (std::size_t b = 0; b < steps_per_epoch && step_number < total_steps; ++b) {
        const std::size_t first = b * B, rows = std::min(B, order.size() - first);
        auto t0 = Clock::now();
        double loss = step(std::span(order).subspan(first, rows), step_number + 1);
        double dt = seconds_since(t0);
        ++step_number;
        epoch_seconds += dt;
        time.step += dt;
        epoch_loss += loss * static_cast<double>(rows);
        epoch_samples += rows;
        observer.on_step({step_number, epoch, b + 1, steps_per_epoch, loss, rows, time.step});
      }
      auto [test_loss, test_accuracy] = evaluate(data.test);
      s.train_loss = epoch_loss / static_cast<double>(epoch_samples);
      s.test_loss = test_loss;
      s.test_accuracy = test_accuracy;
      s.epochs = static_cast<double>(epoch) +
                 static_cast<double>(epoch_samples) / static_cast<double>(data.train.count);
      observer.on_epoch({epoch, step_number, s.train_loss, test_loss, test_accuracy,
                         static_cast<double>(epoch_samples) / epoch_seconds, time.step});
      s.samples_per_second += static_cast<double>(epoch_samples);  // total, divided below
    }
    for (const auto& r : replicas) {
      time.data += r->data_seconds;
      time.reduce += r->reduce_seconds;
    }
    s.steps = step_number;
    s.samples_per_second /= time.step;
    s.workers = config.workers;
    s.batch = config.batch;
    s.micro_batch = config.micro_batch;
    s.parameters = model.layout().numel();
    s.weights_digest = weights_digest(weights.data(), weights.size());
    s.time = time;
    return s;
  }
};

Trainer::Trainer(TrainConfig config, const data::Splits& data)
    : impl_(std::make_unique<Impl>(std::move(config), data)) {}
Trainer::~Trainer() = default;
Summary Trainer::run(Observer& observer) { return impl_->run(observer); }
const TrainConfig& Trainer::config() const { return impl_->config; }
const nn::Model& Trainer::model() const { return impl_->model; }
const float* Trainer::weights() const { return impl_->weights.data(); }

std::string weights_digest(const float* weights, std::size_t n) {
  XXH128_hash_t h = XXH3_128bits(weights, n * sizeof(float));
  char hex[33];
  std::snprintf(hex, sizeof hex, "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                static_cast<unsigned long long>(h.low64));
  return hex;
}

}  // namespace cohort::train
