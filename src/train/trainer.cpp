// The training loop: epochs of steps; a step = replicas computing leaf gradients in a TBB arena,
// the reducer combining them and, at its root, applying the optimizer to the master weights.
#include "cohort/train/trainer.hpp"

#include <omp.h>
#include <oneapi/tbb/flow_graph.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>
#include <oneapi/tbb/task_scheduler_observer.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <thread>
#include <tuple>

#include "cohort/core/error.hpp"
#include "cohort/nn/batch_grad.hpp"
#include "cohort/nn/loss.hpp"
#include "cohort/nn/net.hpp"
#include "cohort/optim/gradient.hpp"
#include "cohort/reduce/kernels.hpp"
#include "cohort/reduce/reducer.hpp"
#include "cohort/tensor/buffer.hpp"

namespace cohort::train {

namespace {

namespace flow = oneapi::tbb::flow;
// Floats per block of the fused root: the summed block (4 KiB) stays in L1 for the optimizer.
constexpr std::size_t kRootBlock = 1024;
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

// What one worker owns: its Net (primitives, activations, scratchpad), a staging buffer for
// evaluation, and its time accounts (written only by the thread running its node, read by the
// controller after wait_for_all, which orders them).
struct Replica {
  nn::Net net;
  AlignedBuffer<float> x;       // (eval rows, features)
  std::vector<std::int32_t> y;  // (eval rows)
  double data_seconds = 0;
  double reduce_seconds = 0;
  std::vector<nn::LinearRows> linear_rows;  // batch weight gradients: this leaf's rows
  Replica(const nn::Model& model, std::size_t rows, bool blocked_layouts)
      : net(model, blocked_layouts),
        x(rows * static_cast<std::size_t>(model.input_features())),
        y(rows) {}
};

// One global batch, assembled: x (B, features) as float, y (B).
struct Staging {
  AlignedBuffer<float> x;
  std::vector<std::int32_t> y;
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
    bad("--micro-batch", "1 .. --batch (" + std::to_string(c.batch) + "), or 0 for batch / cores",
        std::to_string(c.micro_batch));
  if (c.epochs == 0 && c.steps == 0) bad("--epochs", "at least 1 (or --steps N)", "0");
  if (c.eval_batch == 0) bad("eval batch", "at least 1", "0");
  if (static_cast<std::size_t>(model.input_features()) != data.train.features())
    bad("--model",
        "an input size of " + std::to_string(data.train.features()) + " (" +
            std::to_string(data.train.rows) + "x" + std::to_string(data.train.cols) + " images)",
        std::to_string(model.input_features()) + " in '" + model.spec() + "'");
  if (static_cast<std::size_t>(model.num_classes()) != data.train.num_classes)
    bad("--model", "an output size of " + std::to_string(data.train.num_classes) + " (classes)",
        std::to_string(model.num_classes()) + " in '" + model.spec() + "'");
  optim::validate(c.optimizer);
  optim::validate(c.schedule, optim::scaled_base_lr(c.schedule, c.optimizer.lr, c.batch));
  if (!(std::isfinite(c.clip_norm) && c.clip_norm >= 0))
    bad("--clip-norm", "a finite value >= 0 (0: off)", std::to_string(c.clip_norm));
  if (c.max_skips == 0) bad("--max-skips", "at least 1", "0");
}

namespace {
// What a step did, for the run loop and the observers.
struct StepOutcome {
  double loss = 0;  // mean over the batch
  float lr = 0;
  double grad_norm = std::numeric_limits<double>::quiet_NaN();
  bool skipped = false;
  std::string skip_reason;
};
}  // namespace

struct Trainer::Impl {
  // What the graph's nodes need to know about the step being run; written by the controller
  // before it puts the start message, read by the node bodies (try_put orders the two).
  struct StepPlan {
    std::uint64_t number = 0;                 // 1-based
    std::span<const std::uint32_t> ids;       // this step's samples
    std::size_t leaves = 0, workers = 0;      // workers: replicas with leaves this step
    int slot = 0;                             // staging buffer holding (or to hold) ids
    std::span<const std::uint32_t> next_ids;  // the next step's samples, to prefetch; may be empty
    reduce::Reducer* reducer = nullptr;
    // Next unclaimed leaf of this step (replicas claim leaves one by one).
    alignas(kCacheLine) std::atomic<std::size_t> next_leaf{0};
    double root_seconds = 0;      // written by the completing contribute's thread
    std::thread::id root_thread;  // likewise
  };

  TrainConfig config;
  const data::Splits& data;
  nn::Model model;
  const std::size_t features;
  AlignedBuffer<float> weights;
  AlignedBuffer<float> state[2];  // the optimizer's per-parameter arrays (momentum, moments)
  std::vector<AlignedBuffer<float>> leaf_grads;  // one per leaf of a full batch
  // Two-phase root (--clip-norm or --on-nonfinite skip): the summed gradient, checked and
  // measured before anything is applied. Empty in the fused one-pass root.
  AlignedBuffer<float> grad_sum;
  std::vector<double> leaf_loss;
  std::vector<std::unique_ptr<Replica>> replicas;
  Staging staging[2];
  double prefetch_seconds = 0;  // written by the prepare node
  double helper_seconds = 0;    // root chunks run by threads other than the completing one
  // Per reducer chunk of the fused root: optimizer seconds and the thread that ran it (disjoint
  // writers; read by the controller after the step).
  std::vector<double> chunk_seconds;
  std::vector<std::thread::id> chunk_thread;
  // Per reducer chunk: the first non-finite element of the summed gradient (n: none), and in the
  // two-phase root the chunk's sum of squares. Added in chunk order, so W does not matter.
  std::vector<std::size_t> chunk_bad;
  std::vector<double> chunk_sumsq;
  // Batch weight gradients (config.weight_grads == kBatch): per linear layer, the batch's input
  // rows x (B, IC; empty when the layer reads the staged batch itself) and output-gradient rows
  // dy (B, OC), written by the replicas at their leaves' rows; the ranges of the flat array they
  // produce, in array order; per arena slot a chunk-sized gradient buffer plus room for the
  // partial rows at a chunk's ends; per chunk the root's GEMM seconds.
  struct BatchLinear {
    std::int64_t in = 0, out = 0;
    bool reads_input = false;
    AlignedBuffer<float> x, dy;
  };
  struct BatchRange {
    std::size_t begin = 0, end = 0, linear = 0;
    bool bias = false;
  };
  std::vector<BatchLinear> batch_linear;
  std::vector<BatchRange> batch_ranges;
  std::vector<AlignedBuffer<float>> root_scratch;
  std::vector<double> chunk_gemm_seconds;
  oneapi::tbb::task_arena arena;
  OmpSingleThread omp_pin{arena};
  TbbExecutor executor;
  std::map<std::size_t, std::unique_ptr<reduce::Reducer>> reducers;  // by leaf count
  optim::Optimizer optimizer;
  const bool two_phase;    // clip or skip: check the whole summed gradient before applying
  const bool batch_grads;  // config.weight_grads == kBatch
  float base_lr;           // --lr after the linear scaling rule
  TimeBreakdown time;
  StepPlan plan;
  std::uint64_t steps_done = 0;    // training steps done (batches consumed)
  std::uint64_t updates_done = 0;  // optimizer updates applied to `weights`
  std::uint64_t skipped_total = 0, skipped_in_a_row = 0;
  std::uint64_t total_steps = 0;  // of the current run(): the schedule's horizon
  // Tracing (config.trace). Spans go to a buffer per arena slot (slots are unique among running
  // threads, so no locks); a slot also remembers which replica its thread ran in which step, so
  // root chunks land on that replica's track. Per track, the end of its latest span this step,
  // for the "wait" span (each track is written only by the thread that ran its replica).
  struct SlotTrace {
    std::vector<TraceSpan> spans;
    std::uint64_t step = 0;
    std::uint32_t replica = 0;
  };
  static constexpr std::size_t kMaxTraceSpans = std::size_t{1} << 21;
  const Clock::time_point trace_origin = Clock::now();
  std::vector<SlotTrace> trace_slots;  // arena slots, then one for the controller outside it
  std::vector<Clock::time_point> track_last_end;
  std::atomic<bool> trace_full{false};
  // The step's graph, built once inside the arena: start -> {prepare(t+1), replica 0..W-1 (t)}.
  std::unique_ptr<flow::graph> graph;
  std::unique_ptr<flow::broadcast_node<flow::continue_msg>> start;
  std::vector<std::unique_ptr<flow::continue_node<flow::continue_msg>>> nodes;

  Impl(TrainConfig c, const data::Splits& d)
      : config(std::move(c)),
        data(d),
        model(nn::Model::parse(config.model, {1, static_cast<std::int64_t>(d.train.rows),
                                              static_cast<std::int64_t>(d.train.cols)})),
        features(static_cast<std::size_t>(model.input_features())),
        arena(static_cast<int>(resolve_workers(config.workers))),
        optimizer(config.optimizer),
        two_phase(config.clip_norm > 0 || config.on_nonfinite == TrainConfig::OnNonFinite::kSkip),
        batch_grads(config.weight_grads == TrainConfig::WeightGrads::kBatch),
        base_lr(optim::scaled_base_lr(config.schedule, config.optimizer.lr, config.batch)) {
    validate(config, model, data);
    config.workers = resolve_workers(config.workers);
    // Default: one leaf per core of this machine, the fastest decomposition measured
    // (docs/architecture.md, "Micro-batch"). It depends on the machine, never on --workers.
    if (config.micro_batch == 0) {
      const std::size_t cores = std::max(1u, std::thread::hardware_concurrency());
      config.micro_batch = (config.batch + cores - 1) / cores;
    }
    omp_set_num_threads(1);  // this thread also runs replica work inside the arena
    weights = AlignedBuffer<float>(model.layout().total());
    model.init(weights.data(), config.seed);
    for (std::size_t i = 0; i < optimizer.state_buffers(); ++i)
      state[i] = AlignedBuffer<float>(model.layout().total());
    if (two_phase) grad_sum = AlignedBuffer<float>(model.layout().total());
    const std::size_t max_leaves = leaves_for(config.batch);
    for (std::size_t i = 0; i < max_leaves; ++i) leaf_grads.emplace_back(model.layout().total());
    leaf_loss.resize(max_leaves);
    for (auto& st : staging) {
      st.x = AlignedBuffer<float>(config.batch * features);
      st.y.resize(config.batch);
    }
    for (std::size_t w = 0; w < config.workers; ++w)
      replicas.push_back(
          std::make_unique<Replica>(model, config.eval_batch, config.blocked_layouts));
    if (config.trace) {
      trace_slots.resize(config.workers + 1);
      track_last_end.resize(config.workers + 1);
    }
    if (batch_grads) setup_batch_grads();
    arena.execute([&] { build_graph(); });  // the graph belongs to the arena it is built in
  }

  static std::size_t resolve_workers(std::size_t w) {
    return w != 0 ? w : std::max(1u, std::thread::hardware_concurrency());
  }
  void setup_batch_grads() {
    const auto& layers = model.layers();
    for (std::size_t i = 0; i < layers.size(); ++i) {
      const nn::LayerSpec& l = layers[i];
      if (l.kind != nn::LayerSpec::Kind::kLinear) continue;
      BatchLinear b;
      b.in = l.in.C;
      b.out = l.out.C;
      b.reads_input = i == 0;  // its input is the staged batch (a linear layer's is flat)
      if (!b.reads_input) b.x = AlignedBuffer<float>(config.batch * static_cast<std::size_t>(b.in));
      b.dy = AlignedBuffer<float>(config.batch * static_cast<std::size_t>(b.out));
      const auto in = static_cast<std::size_t>(b.in), out = static_cast<std::size_t>(b.out);
      batch_ranges.push_back({l.weight, l.weight + in * out, batch_linear.size(), false});
      batch_ranges.push_back({l.bias, l.bias + out, batch_linear.size(), true});
      batch_linear.push_back(std::move(b));
    }
    std::sort(batch_ranges.begin(), batch_ranges.end(),
              [](const BatchRange& a, const BatchRange& b) { return a.begin < b.begin; });
    for (auto& r : replicas) r->linear_rows.resize(batch_linear.size());
  }

  // Batch weight gradients: out[0, end - begin) = the batch's summed gradient of the flat range
  // [begin, end). Linear weights and biases come from the kept rows (one GEMM with K = rows per
  // overlapped weight; a chunk end inside a weight row computes the whole rows into `rows_tmp`
  // and copies its part); everything else (convolutions, padding) is the leaves' sum, left to
  // right, as in the leaf mode. Returns the seconds spent in GEMMs and column sums.
  double batch_gradient(const float* const* sources, std::size_t k, std::size_t begin,
                        std::size_t end, float* out, float* rows_tmp) const {
    const auto rows = static_cast<std::int64_t>(plan.ids.size());
    std::size_t pos = begin;
    auto leaf_sum = [&](std::size_t a, std::size_t b) {
      if (a >= b) return;
      const float* at[reduce::kMaxArity];
      for (std::size_t j = 0; j < k; ++j) at[j] = sources[j] + a;
      reduce::sum_sources(out + (a - begin), at, k, b - a);
    };
    double gemm_seconds = 0;
    for (const BatchRange& r : batch_ranges) {
      if (r.end <= begin) continue;
      if (r.begin >= end) break;
      const std::size_t a = std::max(r.begin, begin), b = std::min(r.end, end);
      leaf_sum(pos, a);
      pos = b;
      const BatchLinear& l = batch_linear[r.linear];
      const auto t0 = Clock::now();
      float* dst = out + (a - begin);
      const auto lo = static_cast<std::int64_t>(a - r.begin),
                 hi = static_cast<std::int64_t>(b - r.begin);
      if (r.bias) {
        nn::linear_bias_grad(l.dy.data(), rows, l.out, lo, hi, dst);
      } else {
        const float* x = l.reads_input ? staging[plan.slot].x.data() : l.x.data();
        const std::int64_t r0 = lo / l.out, r1 = (hi + l.out - 1) / l.out;
        const bool whole_rows = lo % l.out == 0 && hi % l.out == 0;
        nn::linear_weight_grad(x, l.dy.data(), rows, l.in, l.out, r0, r1,
                               whole_rows ? dst : rows_tmp);
        if (!whole_rows) std::memcpy(dst, rows_tmp + (lo - r0 * l.out), (b - a) * sizeof(float));
      }
      gemm_seconds += seconds_since(t0);
    }
    leaf_sum(pos, end);
    return gemm_seconds;
  }

  // This thread's root scratch (batch weight gradients): its arena slot's.
  float* root_buffer() {
    const int slot = oneapi::tbb::this_task_arena::current_thread_index();
    COHORT_CHECK(slot >= 0 && static_cast<std::size_t>(slot) < root_scratch.size(),
                 "root chunk outside the trainer's arena");
    return root_scratch[static_cast<std::size_t>(slot)].data();
  }

  std::size_t leaves_for(std::size_t rows) const {
    return (rows + config.micro_batch - 1) / config.micro_batch;
  }

  void build_graph() {
    graph = std::make_unique<flow::graph>();
    start = std::make_unique<flow::broadcast_node<flow::continue_msg>>(*graph);
    nodes.push_back(std::make_unique<flow::continue_node<flow::continue_msg>>(
        *graph, [this](const flow::continue_msg&) { prepare_next(); }));
    for (std::size_t w = 0; w < config.workers; ++w)
      nodes.push_back(std::make_unique<flow::continue_node<flow::continue_msg>>(
          *graph, [this, w](const flow::continue_msg&) { run_replica(w); }));
    for (auto& node : nodes) flow::make_edge(*start, *node);
  }

  reduce::Reducer& reducer_for(std::size_t leaves) {
    auto& slot = reducers[leaves];
    if (!slot) {
      // Arity 0: one flat root over all leaves (the last arrival sums them in one chunk-parallel
      // pass; docs/reduce_results.md measured binary trees at 0.31 of it for 2 MiB gradients).
      const std::size_t arity = std::clamp<std::size_t>(leaves, 2, reduce::kMaxArity);
      reduce::ReducerConfig rc{
          .n = model.layout().total(), .leaves = leaves, .workers = config.workers, .arity = arity};
      slot = reduce::make_reducer(config.reducer, rc, executor);
      chunk_seconds.resize(std::max(chunk_seconds.size(), rc.n / rc.chunk + 1));
      chunk_thread.resize(chunk_seconds.size());
      chunk_bad.resize(chunk_seconds.size(), rc.n);
      chunk_sumsq.resize(chunk_seconds.size());
      chunk_gemm_seconds.resize(chunk_seconds.size());
      if (batch_grads) {
        std::int64_t widest = 0;
        for (const auto& l : batch_linear) widest = std::max(widest, l.out);
        // A chunk's gradient, then the whole rows around a chunk end inside a weight row.
        const std::size_t need = 2 * rc.chunk + 2 * static_cast<std::size_t>(widest);
        if (root_scratch.empty() || root_scratch[0].size() < need) {
          root_scratch.clear();
          for (std::size_t i = 0; i < config.workers; ++i) root_scratch.emplace_back(need);
        }
      }
    }
    return *slot;
  }

  std::uint32_t helper_track() const { return static_cast<std::uint32_t>(config.workers); }
  std::uint32_t controller_track() const { return helper_track() + 1; }

  // The calling thread's trace buffer: its arena slot's, or the controller's outside the arena.
  SlotTrace& slot_trace() {
    const int slot = oneapi::tbb::this_task_arena::current_thread_index();
    const bool in_arena = slot >= 0 && static_cast<std::size_t>(slot) + 1 < trace_slots.size();
    return trace_slots[in_arena ? static_cast<std::size_t>(slot) : trace_slots.size() - 1];
  }

  // Records [begin, end) on `track` (a replica's, or the controller's); `index_name` ("leaf",
  // "chunk" or null) says what `index` counts. Callers check config.trace first, so an untraced
  // step reads no extra clocks.
  void span(const char* name, std::uint32_t track, const char* index_name, std::size_t index,
            Clock::time_point begin, Clock::time_point end) {
    SlotTrace& t = slot_trace();
    if (t.spans.size() >= kMaxTraceSpans / trace_slots.size()) {
      trace_full.store(true, std::memory_order_relaxed);  // read after the run
      return;
    }
    auto us = [&](Clock::time_point x) {
      return std::chrono::duration<double, std::micro>(x - trace_origin).count();
    };
    t.spans.push_back({name, track, plan.number, index_name, index, us(begin), us(end)});
    if (track < config.workers) track_last_end[track] = end;  // replica tracks only
  }

  // A root chunk's span, on the track of the replica this thread ran in this step (the helpers'
  // track if it ran none).
  void root_span(const char* name, std::size_t chunk_index, Clock::time_point begin) {
    if (!config.trace) return;
    const SlotTrace& t = slot_trace();
    const std::uint32_t track = t.step == plan.number ? t.replica : helper_track();
    span(name, track, "chunk", chunk_index, begin, Clock::now());
  }

  void assemble(std::span<const std::uint32_t> ids, int slot, std::size_t first_row) {
    data::assemble_batch(data.train, ids, staging[slot].x.data() + first_row * features,
                         staging[slot].y.data() + first_row);
  }

  // Graph node: assembles the next step's batch into the other staging buffer while this step's
  // replicas compute (prefetch on), so batch assembly leaves the replicas' path.
  void prepare_next() {
    if (!false || plan.next_ids.empty()) return;
    auto t0 = Clock::now();
    assemble(plan.next_ids, 1 - plan.slot, 0);
    prefetch_seconds += seconds_since(t0);
  }

  // Graph node: replica w claims leaves one at a time, computes each and contributes its
  // gradient. Claiming (instead of a fixed contiguous run per replica) balances a slow core: a
  // leaf's gradient does not depend on who computes it, so the result is the same either way.
  // The contribution that completes the tree runs the root: sum, mean and SGD on the master
  // weights, chunk-parallel. Nothing here waits for another node.
  void run_replica(std::size_t w) {
    if (w >= plan.workers) return;
    Replica& r = *replicas[w];
    const auto track = static_cast<std::uint32_t>(w);
    if (config.trace) {
      SlotTrace& t = slot_trace();
      t.step = plan.number;
      t.replica = track;
    }
    const std::size_t M = config.micro_batch, rows = plan.ids.size();
    while (true) {
      // relaxed: the counter only hands out distinct indices; the leaf's data (staging, plan)
      // was published to this node by the graph's start message.
      const std::size_t leaf = plan.next_leaf.fetch_add(1, std::memory_order_relaxed);
      if (leaf >= plan.leaves) break;
      const std::size_t first = leaf * M, n = std::min(M, rows - first);
      if (!false) {
        auto t0 = Clock::now();
        assemble(plan.ids.subspan(first, n), plan.slot, first);
        r.data_seconds += seconds_since(t0);
        if (config.trace) span("data", track, "leaf", leaf, t0, Clock::now());
      }
      const auto t_compute = config.trace ? Clock::now() : Clock::time_point{};
      if (config.leaf_hook) config.leaf_hook(plan.number, leaf);
      float* grad = leaf_grads[leaf].data();
      if (batch_grads)
        for (std::size_t o = 0; o < batch_linear.size(); ++o) {
          BatchLinear& l = batch_linear[o];
          r.linear_rows[o] = {
              l.reads_input ? nullptr : l.x.data() + first * static_cast<std::size_t>(l.in),
              l.dy.data() + first * static_cast<std::size_t>(l.out)};
        }
      leaf_loss[leaf] = r.net.forward_backward(
          weights.data(), staging[plan.slot].x.data() + first * features,
          staging[plan.slot].y.data() + first, static_cast<std::int64_t>(n), grad,
          nn::StreamKey{config.seed, plan.number, leaf},  // dropout: never keyed by worker
          batch_grads ? std::span<const nn::LinearRows>(r.linear_rows)
                      : std::span<const nn::LinearRows>());
      if (config.trace) {
        span("forward", track, "leaf", leaf, t_compute, r.net.backward_begin());
        span("backward", track, "leaf", leaf, r.net.backward_begin(), Clock::now());
      }
      if (config.gradient_hook)
        config.gradient_hook(plan.number, leaf, grad, model.layout().total());
      // A non-finite loss must never reach the weights. Stopping: fail the step before
      // contributing, so the root (the only writer) never runs and the weights stay those of the
      // last step. Skipping: the two-phase root sees the loss and applies nothing.
      if (!std::isfinite(leaf_loss[leaf]) && config.on_nonfinite == TrainConfig::OnNonFinite::kStop)
        throw InternalError("non-finite loss (" + std::to_string(leaf_loss[leaf]) + ") in leaf " +
                            std::to_string(leaf) + "; the weights are those after step " +
                            std::to_string(plan.number - 1));
      auto t1 = Clock::now();
      const bool completed = plan.reducer->contribute(w, leaf, grad);
      const double dt = seconds_since(t1);
      if (config.trace) span("combine", track, "leaf", leaf, t1, Clock::now());
      r.reduce_seconds += dt;
      if (completed) {
        plan.root_seconds = dt;
        plan.root_thread = std::this_thread::get_id();
      }
    }
  }

  // Where element i of the flat parameter array belongs, for messages: "fc1.weight[1234]".
  std::string tensor_of(std::size_t i) const {
    for (const auto& e : model.layout().entries())
      if (i >= e.offset && i < e.offset + e.shape.numel())
        return e.name + "[" + std::to_string(i - e.offset) + "]";
    return "padding[" + std::to_string(i) + "]";
  }

  // The first non-finite leaf loss or summed-gradient element of the step just run, or "".
  std::string non_finite_reason(std::size_t chunks) const {
    for (std::size_t leaf = 0; leaf < plan.leaves; ++leaf)
      if (!std::isfinite(leaf_loss[leaf]))
        return "non-finite loss (" + std::to_string(leaf_loss[leaf]) + ") in leaf " +
               std::to_string(leaf);
    for (std::size_t c = 0; c < chunks; ++c)
      if (chunk_bad[c] != model.layout().total())
        return "non-finite gradient in " + tensor_of(chunk_bad[c]);
    return "";
  }

  // One training step on plan.ids (already in staging[plan.slot] when prefetching).
  StepOutcome step() {
    const std::size_t rows = plan.ids.size();
    plan.leaves = leaves_for(rows);
    plan.workers = std::min(config.workers, plan.leaves);
    plan.next_leaf.store(0, std::memory_order_relaxed);  // ordered before the nodes by try_put
    plan.reducer = &reducer_for(plan.leaves);
    plan.root_seconds = 0;
    reduce::Reducer& reducer = *plan.reducer;
    const std::size_t chunk = reducer.config().chunk, n = model.layout().total();
    const std::size_t chunks = (n + chunk - 1) / chunk;
    StepOutcome out;
    out.lr = optim::lr_at(config.schedule, base_lr, updates_done, total_steps);
    const float inv_rows = 1.0f / static_cast<float>(rows);
    const optim::StepScalars scalars = optimizer.scalars(out.lr, inv_rows, updates_done + 1);
    float* s0 = state[0].size() ? state[0].data() : nullptr;
    float* s1 = state[1].size() ? state[1].data() : nullptr;
    auto off = [](float* p, std::size_t i) { return p ? p + i : nullptr; };
    // The fused root: for each chunk the reducer hands over the root's children (the leaves,
    // for a flat tree); they are added left to right block by block into an L1-sized buffer,
    // checked for non-finite values, and the optimizer applies the mean from there. One read of
    // each leaf, one read-modify-write of the weights and each state array, no N-sized sum; a
    // single leaf is used as is. A non-finite block is not applied and fails the step.
    // With batch weight gradients the chunk's whole gradient is first computed into this
    // thread's chunk buffer (L2) and read from there.
    auto fused = [&](const float* const* sources, std::size_t k, std::size_t begin,
                     std::size_t end) {
      auto t0 = Clock::now();
      alignas(kCacheLine) float block[kRootBlock];
      const float* at[reduce::kMaxArity];
      float* batch = nullptr;
      if (batch_grads) {
        batch = root_buffer();
        chunk_gemm_seconds[begin / chunk] =
            batch_gradient(sources, k, begin, end, batch, batch + chunk);
      }
      for (std::size_t b = begin; b < end; b += kRootBlock) {
        const std::size_t count = std::min(kRootBlock, end - b);
        const float* g = batch ? batch + (b - begin) : sources[0] + b;
        if (!batch && k > 1) {
          for (std::size_t j = 0; j < k; ++j) at[j] = sources[j] + b;
          reduce::sum_sources(block, at, k, count);
          g = block;
        }
        if (const std::size_t i = optim::first_non_finite(g, count); i != count) {
          chunk_bad[begin / chunk] = b + i;
          break;
        }
        optimizer.apply(scalars, weights.data() + b, g, off(s0, b), off(s1, b), count);
      }
      root_span("sum+optimizer", begin / chunk, t0);
      chunk_seconds[begin / chunk] = seconds_since(t0);
      chunk_thread[begin / chunk] = std::this_thread::get_id();
    };
    // The two-phase root, first phase: the sum (into grad_sum; a single leaf is read in place),
    // its first non-finite element and its sum of squares, per chunk. Nothing is applied yet.
    auto summed = [&](const float* const* sources, std::size_t k, std::size_t begin,
                      std::size_t end) {
      auto t0 = Clock::now();
      const float* g = sources[0] + begin;
      if (batch_grads) {
        g = grad_sum.data() + begin;
        chunk_gemm_seconds[begin / chunk] =
            batch_gradient(sources, k, begin, end, grad_sum.data() + begin, root_buffer() + chunk);
      } else if (k > 1) {
        const float* at[reduce::kMaxArity];
        for (std::size_t j = 0; j < k; ++j) at[j] = sources[j] + begin;
        reduce::sum_sources(grad_sum.data() + begin, at, k, end - begin);
        g = grad_sum.data() + begin;
      }
      const std::size_t bad = optim::first_non_finite(g, end - begin);
      if (bad != end - begin) chunk_bad[begin / chunk] = begin + bad;
      chunk_sumsq[begin / chunk] = optim::sum_squares(g, end - begin);
      root_span("sum", begin / chunk, t0);
      chunk_seconds[begin / chunk] = seconds_since(t0);
      chunk_thread[begin / chunk] = std::this_thread::get_id();
    };
    if (two_phase)
      reducer.begin_step(reduce::Sink::fused(summed));
    else
      reducer.begin_step(reduce::Sink::fused(fused));
    try {
      arena.execute([&] {
        start->try_put(flow::continue_msg());
        graph->wait_for_all();
      });
    } catch (...) {
      // A node threw: the graph cancelled the rest of the step and waited for running bodies.
      // The root never ran (it needs every leaf), so the master weights are as before the step.
      arena.execute([&] { graph->reset(); });
      reducer.reset();
      const std::string where = "step " + std::to_string(plan.number) + ": ";
      try {
        throw;
      } catch (const InputError& e) {
        throw InputError(where + e.what());
      } catch (const std::exception& e) {
        throw InternalError(where + e.what());
      }
    }
    COHORT_CHECK(reducer.step_done(), "every leaf was contributed but the step is not complete");
    // Root chunks that other threads took (stolen from the completing contribute) are reduce
    // work of those threads, not idle time.
    // Batch weight gradients: the root's GEMMs are compute (matmul), not reduction; the
    // completing contribute's share leaves `reduce` here (its contribute call is added to it).
    for (std::size_t c = 0; c < chunks; ++c) {
      const double gemm = chunk_gemm_seconds[c];
      time.optimizer += chunk_seconds[c] - gemm;
      time.weight_grad += gemm;
      time.matmul += gemm;
      time.compute += gemm;
      if (chunk_seconds[c] != 0 && chunk_thread[c] != plan.root_thread) {
        time.reduce += chunk_seconds[c] - gemm;
        helper_seconds += chunk_seconds[c];
      } else {
        time.reduce -= gemm;
      }
      chunk_seconds[c] = 0;
      chunk_gemm_seconds[c] = 0;
    }
    time.reduce_critical += plan.root_seconds;
    for (std::size_t leaf = 0; leaf < plan.leaves; ++leaf) out.loss += leaf_loss[leaf];
    out.loss /= static_cast<double>(rows);  // leaf order
    const std::string reason = non_finite_reason(chunks);
    std::fill(chunk_bad.begin(), chunk_bad.end(), n);
    if (!two_phase) {
      if (!reason.empty())
        throw InternalError("step " + std::to_string(plan.number) + ": " + reason +
                            "; the run stops (blocks with finite gradients were applied; "
                            "nothing is saved from this state)");
      return out;
    }
    if (!reason.empty()) {
      if (config.on_nonfinite == TrainConfig::OnNonFinite::kStop)
        throw InternalError("step " + std::to_string(plan.number) + ": " + reason +
                            "; the weights are those after step " +
                            std::to_string(plan.number - 1));
      out.skipped = true;
      out.skip_reason = reason;
      return out;
    }
    // Second phase: the norm of the mean gradient (chunk sums added in chunk order), the clip
    // factor, and the optimizer over every chunk, spread over the arena's threads.
    double sumsq = 0;
    for (std::size_t c = 0; c < chunks; ++c) sumsq += chunk_sumsq[c];
    out.grad_norm = std::sqrt(sumsq) * static_cast<double>(inv_rows);
    double clip = 1.0;
    if (config.clip_norm > 0)
      clip = std::min(1.0, static_cast<double>(config.clip_norm) / (out.grad_norm + 1e-6));
    const optim::StepScalars clipped =
        optimizer.scalars(out.lr, static_cast<float>(inv_rows * clip), updates_done + 1);
    const float* g = plan.leaves == 1 && !batch_grads ? leaf_grads[0].data() : grad_sum.data();
    auto t0 = Clock::now();
    arena.execute([&] {
      oneapi::tbb::parallel_for(std::size_t{0}, chunks, [&](std::size_t c) {
        const auto tc = Clock::now();
        const std::size_t begin = c * chunk, end = std::min(n, begin + chunk);
        optimizer.apply(clipped, weights.data() + begin, g + begin, off(s0, begin), off(s1, begin),
                        end - begin);
        root_span("optimizer", c, tc);
      });
    });
    const double apply_seconds = seconds_since(t0);
    time.optimizer += apply_seconds;
    time.reduce_critical += apply_seconds;
    return out;
  }

  // Collects the replicas' per-step accounts into `time`; the idle share is what is left of
  // workers x wall.
  void account(double wall) {
    double busy = prefetch_seconds + helper_seconds;
    helper_seconds = 0;
    time.data += prefetch_seconds;
    prefetch_seconds = 0;
    for (auto& r : replicas) {
      const nn::PhaseTimes& t = r->net.times();
      time.matmul += t.matmul;
      time.eltwise += t.eltwise;
      time.loss += t.loss;
      time.other += t.other;
      time.compute += t.total();
      time.data += r->data_seconds;
      time.reduce += r->reduce_seconds;
      busy += t.total() + r->data_seconds + r->reduce_seconds;
      r->net.reset_times();
      r->data_seconds = r->reduce_seconds = 0;
    }
    time.step += wall;
    time.idle += std::max(0.0, static_cast<double>(config.workers) * wall - busy);
  }

  // The step's "wait" spans (each replica track, from its last span to the step's end) and the
  // step itself on the controller's track.
  void trace_step_end(Clock::time_point step_begin) {
    const auto now = Clock::now();
    for (std::uint32_t track = 0; track < plan.workers; ++track)
      if (track_last_end[track] > step_begin)
        span("wait", track, nullptr, 0, track_last_end[track], now);
    span("step", controller_track(), nullptr, 0, step_begin, now);
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
              loss[c] =
                  nn::softmax_cross_entropy(logits, r.y.data(), N, model.num_classes(), nullptr);
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
    total_steps = config.steps != 0 ? config.steps : steps_per_epoch * config.epochs;
    auto batch_of = [&](const std::vector<std::uint32_t>& order, std::size_t b) {
      const std::size_t first = b * B;
      return std::span(order).subspan(first, std::min(B, order.size() - first));
    };
    Summary s;
    // Continue where the weights are: 0 for a new run, the checkpoint's step after restore().
    std::uint64_t step_number = steps_done;
    const std::uint64_t steps_done_at_start = steps_done;
    const std::size_t first_epoch = static_cast<std::size_t>(step_number / steps_per_epoch);
    std::size_t first_b = static_cast<std::size_t>(step_number % steps_per_epoch);
    std::vector<std::uint32_t> order = sampler.epoch_order(first_epoch), next_order;
    plan.slot = 0;
    if (false && step_number < total_steps) assemble(batch_of(order, first_b), 0, 0);
    bool stopped = false;
    for (std::size_t epoch = first_epoch; step_number < total_steps && !stopped; ++epoch) {
      double epoch_loss = 0, epoch_seconds = 0;
      std::size_t epoch_samples = 0, epoch_loss_samples = 0;  // the latter: applied steps only
      for (std::size_t b = first_b; b < steps_per_epoch && step_number < total_steps; ++b) {
        plan.number = step_number + 1;
        plan.ids = batch_of(order, b);
        plan.next_ids = {};
        if (plan.number < total_steps) {
          if (b + 1 < steps_per_epoch) {
            plan.next_ids = batch_of(order, b + 1);
          } else {
            next_order = sampler.epoch_order(epoch + 1);
            plan.next_ids = batch_of(next_order, 0);
          }
        }
        auto t0 = Clock::now();
        const StepOutcome o = step();
        double dt = seconds_since(t0);
        if (config.trace) trace_step_end(t0);
        account(dt);
        plan.slot = false ? 1 - plan.slot : plan.slot;
        ++step_number;
        steps_done = step_number;
        epoch_seconds += dt;
        epoch_samples += plan.ids.size();
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
          epoch_loss += o.loss * static_cast<double>(plan.ids.size());
          epoch_loss_samples += plan.ids.size();
        }
        observer.on_step({step_number, epoch, b + 1, steps_per_epoch, o.loss, plan.ids.size(),
                          time.step, o.lr, o.grad_norm, o.skipped, o.skip_reason, skipped_total,
                          total_steps});
        if (observer.stop_requested()) {  // between steps: the weights are a whole step's
          stopped = true;
          break;
        }
      }
      first_b = 0;
      if (epoch_samples == 0) break;
      const auto t_eval = Clock::now();
      auto [test_loss, test_accuracy] = evaluate(data.test);
      if (config.trace) span("evaluate", controller_track(), nullptr, 0, t_eval, Clock::now());
      s.train_loss = epoch_loss_samples ? epoch_loss / static_cast<double>(epoch_loss_samples)
                                        : std::numeric_limits<double>::quiet_NaN();
      s.test_loss = test_loss;
      s.test_accuracy = test_accuracy;
      s.epochs = static_cast<double>(epoch) +
                 static_cast<double>(epoch_samples) / static_cast<double>(data.train.count);
      observer.on_epoch({epoch, step_number, s.train_loss, test_loss, test_accuracy,
                         static_cast<double>(epoch_samples) / epoch_seconds, time.step});
      s.samples_per_second += static_cast<double>(epoch_samples);  // total, divided below
      order.swap(next_order);
    }
    if (step_number == steps_done_at_start) {  // nothing left to train (e.g. a finished resume)
      std::tie(s.test_loss, s.test_accuracy) = evaluate(data.test);
      s.epochs = static_cast<double>(step_number) / static_cast<double>(steps_per_epoch);
    }
    s.steps = step_number;
    s.updates = updates_done;
    s.skipped = skipped_total;
    s.stopped = stopped;
    s.samples_per_second = time.step > 0 ? s.samples_per_second / time.step : 0;
    s.workers = config.workers;
    s.batch = config.batch;
    s.micro_batch = config.micro_batch;
    s.parameters = model.layout().numel();
    s.weights_digest = weights_digest(weights.data(), weights.size());
    s.time = time;
    return s;
  }
};

checkpoint::Checkpoint Trainer::checkpoint(std::string config_json) const {
  const Impl& m = *impl_;
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
    c.state.emplace_back(m.state[i].size());
    m.model.to_canonical(m.state[i].data(), c.state.back().data());
  }
  return c;
}

void Trainer::restore(const checkpoint::Checkpoint& c, const std::string& name) {
  Impl& m = *impl_;
  auto mismatch = [&](const std::string& field, const std::string& ours,
                      const std::string& theirs) {
    throw InputError(name + ": " + field + ": this run has " + ours + ", the checkpoint " + theirs +
                     " (resume with the checkpoint's value, or start a new run)");
  };
  if (c.model != m.config.model)
    mismatch("--model", "'" + m.config.model + "'", "'" + c.model + "'");
  if (c.weights.size() != m.weights.size())
    mismatch("parameters", std::to_string(m.weights.size()) + " floats",
             std::to_string(c.weights.size()));
  if (c.seed != m.config.seed)
    mismatch("--seed", std::to_string(m.config.seed), std::to_string(c.seed));
  if (c.batch != m.config.batch)
    mismatch("--batch", std::to_string(m.config.batch), std::to_string(c.batch));
  if (c.micro_batch != m.config.micro_batch)
    mismatch("--micro-batch", std::to_string(m.config.micro_batch), std::to_string(c.micro_batch));
  if (c.drop_last != m.config.drop_last)
    mismatch("--keep-last", m.config.drop_last ? "off" : "on", c.drop_last ? "off" : "on");
  if (c.train_count != m.data.train.count)
    mismatch("training set size", std::to_string(m.data.train.count),
             std::to_string(c.train_count));
  if (c.optimizer != optim::to_string(m.config.optimizer.kind))
    mismatch("--optimizer", optim::to_string(m.config.optimizer.kind), c.optimizer);
  if (c.state.size() != m.optimizer.state_buffers())
    mismatch("optimizer state", std::to_string(m.optimizer.state_buffers()) + " arrays",
             std::to_string(c.state.size()) + " (SGD keeps one only with --momentum > 0)");
  m.model.from_canonical(c.weights.data(), m.weights.data());
  for (std::size_t i = 0; i < c.state.size(); ++i)
    m.model.from_canonical(c.state[i].data(), m.state[i].data());
  m.steps_done = c.step;
  m.updates_done = c.updates;
  m.skipped_total = c.skipped;
  m.skipped_in_a_row = 0;
}

std::uint64_t Trainer::steps_done() const { return impl_->steps_done; }

std::vector<TraceSpan> Trainer::trace() const {
  std::vector<TraceSpan> all;
  for (const auto& slot : impl_->trace_slots)
    all.insert(all.end(), slot.spans.begin(), slot.spans.end());
  // By track, then start; an enclosing span (longer) before the spans it contains.
  std::sort(all.begin(), all.end(), [](const TraceSpan& a, const TraceSpan& b) {
    return std::tie(a.track, a.begin_us, b.end_us) < std::tie(b.track, b.begin_us, a.end_us);
  });
  return all;
}

std::vector<std::string> Trainer::trace_tracks() const {
  std::vector<std::string> names;
  for (std::size_t w = 0; w < impl_->config.workers; ++w)
    names.push_back("replica " + std::to_string(w));
  names.push_back("root helpers");
  names.push_back("controller");
  return names;
}

bool Trainer::trace_truncated() const { return impl_->trace_full.load(std::memory_order_relaxed); }
std::pair<double, double> Trainer::evaluate_test() { return impl_->evaluate(impl_->data.test); }

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
