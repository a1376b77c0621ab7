// The step's roofline; see roofline.hpp.
#include "roofline.hpp"

#include <algorithm>
#include <chrono>
#include <limits>
#include <map>
#include <tuple>

#include "batch_grads.hpp"
#include "cohort/core/best_of.hpp"
#include "cohort/nn/batch_grad.hpp"
#include "cohort/nn/linear_floor.hpp"
#include "cohort/nn/net.hpp"
#include "cohort/tensor/buffer.hpp"
#include "time_account.hpp"

namespace cohort::train {

namespace {

// Seconds of oneDNN matmul work (inner products and convolutions, forward, backward-data and
// -weights) in one leaf of M rows, on `net` (replica 0's Net: the run's own primitives, its
// plan built by the run; not another Net, since a language model's leaf plan holds hundreds of
// megabytes of activations), on this thread alone: at their own rate, without a second replica
// competing for the core's caches or the memory bus. With batch weight gradients the linear
// layers' weight gradients are left to the root (timed separately below), as in the run. The
// weights and gradient live in two `scratch` arrays where there are two, and a bf16 run's copy
// of the weights in a third where there is one.
double leaf_matmul_seconds(const nn::Model& model, const TrainConfig& c, nn::Net& net,
                           std::span<float* const> scratch) {
  const auto M = static_cast<std::int64_t>(c.micro_batch);
  const std::size_t features = static_cast<std::size_t>(model.input_features());
  const bool b16 = c.precision == nn::Precision::kBf16;
  const std::size_t n = model.layout().total();
  const bool spare = scratch.size() >= 2;
  AlignedBuffer<float> own_params(spare ? 0 : n), own_grad(spare ? 0 : n);
  float* const params = spare ? scratch[0] : own_params.data();
  float* const grad = spare ? scratch[1] : own_grad.data();
  model.init(params, c.seed);
  const bool spare16 = b16 && scratch.size() >= 3;
  AlignedBuffer<bf16> own16(b16 && !spare16 ? n : 0);
  bf16* const params16 = spare16 ? reinterpret_cast<bf16*>(scratch[2]) : own16.data();
  if (b16) to_bf16(params, params16, n);
  AlignedBuffer<float> x(c.micro_batch * features);
  const bool tokens = model.kind().window() > 0;  // a language model's rows: token ids
  for (std::size_t i = 0; i < x.size(); ++i)
    x[i] = tokens ? static_cast<float>(i % static_cast<std::size_t>(model.num_classes()))
                  : static_cast<float>(i % 255) / 255.0f;
  const bool rows16 = b16 && model.kind().bf16_rows();
  AlignedBuffer<bf16> x16(rows16 ? x.size() : 0);
  to_bf16(x.data(), x16.data(), x16.size());
  std::vector<std::int32_t> y(c.micro_batch);
  for (std::size_t i = 0; i < y.size(); ++i)
    y[i] = static_cast<std::int32_t>(i) % model.num_classes();
  // Rows for batch weight gradients (the Net writes them instead of linear weight gradients).
  std::vector<AlignedBuffer<std::uint8_t>> row_store;
  std::vector<nn::LinearRows> rows;
  if (c.weight_grads == TrainConfig::WeightGrads::kBatch)
    for (const nn::LayerSpec& l : model.layers())
      if (l.kind == nn::LayerSpec::Kind::kLinear) {
        const std::size_t value = b16 ? 2 : 4;
        row_store.emplace_back(c.micro_batch * static_cast<std::size_t>(l.in.numel()) * value);
        void* xr = row_store.back().data();
        row_store.emplace_back(c.micro_batch * static_cast<std::size_t>(l.out.C) * value);
        rows.push_back({&l == &model.layers().front() ? nullptr : xr, row_store.back().data(),
                        BatchGrads::row_pairs_for(c.precision, c.micro_batch)});  // as the run's
      }
  AlignedBuffer<float> stats(model.stats_layout().total());  // bn: the leaf's batch statistics
  float* batch_stats = stats.size() ? stats.data() : nullptr;
  return best_of([&] {
    net.reset_times();
    if (rows16)
      net.forward_backward(params16, x16.data(), y.data(), M, grad, {}, rows, batch_stats);
    else if (b16)
      net.forward_backward(params16, x.data(), y.data(), M, grad, {}, rows, batch_stats);
    else
      net.forward_backward(params, x.data(), y.data(), M, grad, {}, rows, batch_stats);
    return net.times().matmul;
  });
}

// Seconds of the root's batch weight-gradient GEMMs of one step (every linear layer's whole
// dW = X^T dY over the batch), on this thread, at oneDNN's rate (the definition of the
// floor), also where the run computes them on cohort's own row-pair kernel (bf16).
double batch_gemm_seconds(const nn::Model& model, const TrainConfig& c) {
  if (c.weight_grads != TrainConfig::WeightGrads::kBatch) return 0;
  const auto B = static_cast<std::int64_t>(c.batch);
  const bool b16 = c.precision == nn::Precision::kBf16;
  double total = 0;
  for (const nn::LayerSpec& l : model.layers()) {
    if (l.kind != nn::LayerSpec::Kind::kLinear) continue;
    const std::int64_t in = l.in.numel(), out = l.out.C;
    const auto xs = static_cast<std::size_t>(B * in), ys = static_cast<std::size_t>(B * out);
    AlignedBuffer<float> x(b16 ? 0 : xs), dy(b16 ? 0 : ys), dw(static_cast<std::size_t>(in * out));
    AlignedBuffer<bf16> x16(b16 ? xs : 0), dy16(b16 ? ys : 0);
    total += best_of([&] {
      const auto t0 = Clock::now();
      if (b16)
        nn::linear_weight_grad(x16.data(), dy16.data(), B, in, out, 0, in, dw.data());
      else
        nn::linear_weight_grad(x.data(), dy.data(), B, in, out, 0, in, dw.data());
      return seconds_since(t0);
    });
  }
  return total;
}

// Bytes the root moves per full-batch step: the weights and each state array read and written,
// the bf16 copy written, the root's sources read where they are summed (the leaves' gradients, or
// a LeafChain's one sum), and the rows read where batch weight gradients are computed.
double root_bytes(const nn::Model& model, const TrainConfig& c, std::size_t state_arrays,
                  std::size_t root_sources) {
  const double n = static_cast<double>(model.layout().total());
  const bool b16 = c.precision == nn::Precision::kBf16;
  double bytes = n * 4 * 2 * static_cast<double>(1 + state_arrays) + (b16 ? n * 2 : 0);
  const auto sources = static_cast<double>(root_sources);
  const double B = static_cast<double>(c.batch), value = b16 ? 2 : 4;
  double from_rows = 0;
  for (const nn::LayerSpec& l : model.layers()) {
    if (l.kind != nn::LayerSpec::Kind::kLinear ||
        c.weight_grads != TrainConfig::WeightGrads::kBatch)
      continue;
    const double in = static_cast<double>(l.in.numel()), out = static_cast<double>(l.out.C);
    from_rows += in * out + out;
    bytes += B * (in + out) * value;
  }
  return bytes + (n - from_rows) * 4 * sources;
}

// One chunk of the sweep: read src[begin, end) (16 independent sums: a vector add per 16
// floats, not a chain of dependent adds), then read-modify-write each array over [begin, end) of
// its own range. Raw pointers and local bounds: with the bounds behind references (std::min of a
// captured size) GCC could not prove the stores leave them alone and left the read-modify-write
// scalar, one float per iteration — a floor several times above the root's own sweep of the same
// bytes (docs/decisions.md, "The roofline's sweep vectorized").
void sweep_chunk(const float* __restrict src, std::size_t src_begin, std::size_t src_end,
                 float* const* rw, std::size_t arrays, std::size_t begin, std::size_t end) {
  constexpr std::size_t kLanes = 16;
  float lanes[kLanes] = {};
  std::size_t i = src_begin;
  for (; i + kLanes <= src_end; i += kLanes)
    for (std::size_t j = 0; j < kLanes; ++j) lanes[j] += src[i + j];
  float acc = 0;
  for (float v : lanes) acc += v;
  for (std::size_t k = 0; k < arrays; ++k) {
    float* __restrict a = rw[k];
    for (std::size_t e = begin; e < end; ++e) a[e] = a[e] * 0.5f + acc;
  }
}

// The best of ten sweeps that read `read` and read-modify-write `rw` bytes, chunk-parallel on
// the executor (the root's threads), in the root's 64 KiB chunks. Arrays of n floats come from
// `scratch` while it lasts. The source is read only: where it is longer than n and `readable`
// (the run's weights, never written) holds at least kWrapBytes, far more than any cache, it is
// `readable`, read again from its start past its end (a stream from memory all the same), so a
// large model's floor takes no memory of its own; else a scratch array if it fits in one.
double sweep_seconds(double read_bytes, std::size_t rw_arrays, std::size_t n,
                     reduce::Executor& executor, std::span<float* const> scratch,
                     std::span<const float> readable) {
  constexpr std::size_t kChunk = 16384;
  constexpr std::size_t kWrapBytes = std::size_t{256} << 20;
  const std::size_t read_floats = static_cast<std::size_t>(read_bytes / 4);
  std::vector<AlignedBuffer<float>> own;
  std::size_t spare = 0;
  auto array = [&](std::size_t floats) {
    if (floats <= n && spare < scratch.size()) return scratch[spare++];
    return own.emplace_back(std::max<std::size_t>(floats, 1)).data();
  };
  std::size_t src_floats = std::max<std::size_t>(read_floats, 1);  // src[0, src_floats), again
  const float* src = nullptr;
  if (read_floats > n && readable.size() * sizeof(float) >= kWrapBytes) {
    src = readable.data();
    src_floats = readable.size() / kChunk * kChunk;
  } else {
    src = array(read_floats);
  }
  std::vector<float*> rw_data;
  for (std::size_t i = 0; i < rw_arrays; ++i) rw_data.push_back(array(n));
  const std::size_t chunks = (std::max(read_floats, n) + kChunk - 1) / kChunk;
  double best = std::numeric_limits<double>::infinity();
  for (int rep = 0; rep < 11; ++rep) {
    const auto t0 = Clock::now();
    executor.parallel_for(chunks, [&](std::size_t c) {
      const std::size_t first = c * kChunk;
      const std::size_t count =
          std::min(read_floats, first + kChunk) - std::min(read_floats, first);
      sweep_chunk(src + (first % src_floats), 0, count, rw_data.data(), rw_data.size(),
                  std::min(n, first), std::min(n, first + kChunk));
    });
    if (rep > 0) best = std::min(best, seconds_since(t0));  // the first warms the pages
  }
  return best;
}

}  // namespace

FloorPlan plan_floor(const nn::Model& model, const TrainConfig& config, std::size_t state_arrays,
                     std::size_t job_replicas, std::size_t ranks, std::size_t root_sources) {
  FloorPlan f;
  f.leaves = config.batch / config.micro_batch;
  f.replicas = std::max<std::size_t>(1, std::min(job_replicas, f.leaves));
  f.root_threads = std::max<std::size_t>(1, job_replicas);
  f.workers = std::max<std::size_t>(1, config.workers);
  f.ranks = std::max<std::size_t>(1, ranks);
  f.root_bytes = root_bytes(model, config, state_arrays, root_sources);
  const std::size_t n = model.layout().total();
  // The weights and each state array are read and written in place; the rest is read.
  const double rw_bytes = static_cast<double>(n) * 8 * static_cast<double>(1 + state_arrays);
  // Several ranks: each root sweeps its share of the chunks (the exchange is not in the floor).
  const auto share = static_cast<double>(std::max<std::size_t>(1, ranks));
  f.sweep_read_bytes = std::max(0.0, f.root_bytes - rw_bytes) / share;
  f.sweep_arrays = 1 + state_arrays;
  f.sweep_floats = static_cast<std::size_t>(static_cast<double>(n) / share);
  return f;
}

Roofline roofline_of(const FloorPlan& f, double leaf_gemm_seconds, double root_gemm_seconds,
                     double sweep_seconds, double step_seconds, const RunWork& run) {
  Roofline r;
  r.leaf_gemm_seconds = leaf_gemm_seconds;
  r.root_gemm_seconds = root_gemm_seconds;
  r.leaves = f.leaves;
  r.replicas = f.replicas;
  r.root_threads = f.root_threads;
  // The leaves' GEMMs spread over the replicas with leaves, the root's chunks over every worker
  // (at batch 32 the MLP has one leaf, and both workers run the root's chunks).
  const auto replicas = static_cast<double>(f.replicas);
  const auto root_threads = static_cast<double>(f.root_threads);
  r.gemm_alone_seconds = static_cast<double>(f.leaves) * leaf_gemm_seconds / replicas +
                         root_gemm_seconds / root_threads;
  r.root_bytes = f.root_bytes;
  r.sweep_seconds = sweep_seconds;
  if (f.ranks == 1) {  // (one process: its workers are the job's)
    r.run_gemm_seconds = run.leaf_gemm_seconds / replicas + run.root_gemm_seconds / root_threads;
    r.run_root_seconds = run.reduce_seconds / static_cast<double>(f.workers);
  }
  auto capped = [](double alone, double own) { return own > 0 ? std::min(alone, own) : alone; };
  r.gemm_seconds = capped(r.gemm_alone_seconds, r.run_gemm_seconds);
  r.root_seconds = capped(r.sweep_seconds, r.run_root_seconds);
  r.floor_seconds = r.gemm_seconds + r.root_seconds;
  r.step_seconds = step_seconds;
  r.fraction = step_seconds > 0 ? r.floor_seconds / step_seconds : 0;
  return r;
}

Roofline measure_roofline(const nn::Model& model, const TrainConfig& config, StepGraph& graph,
                          std::size_t state_arrays, double step_seconds, const RunWork& run,
                          std::size_t job_replicas, std::size_t ranks, std::size_t root_sources,
                          std::span<float* const> scratch, std::span<const float> readable) {
  const FloorPlan f = plan_floor(model, config, state_arrays, job_replicas, ranks, root_sources);
  double leaf = 0, root_gemms = 0;
  nn::LinearTotals linear;
  graph.for_each_replica(1, [&](std::size_t) {  // a replica's thread: OpenMP pinned to one
    const auto rows = static_cast<std::int64_t>(config.micro_batch);
    leaf = leaf_matmul_seconds(model, config, graph.replica(0).net, scratch);
    // Products a kind computes on cohort's own kernels: at oneDNN's rate all the same.
    leaf += model.kind().own_kernel_floor_seconds(rows, config.precision);
    // Inner products on the weight layout oneDNN would choose, where it is the faster.
    linear = nn::linear_totals(
        nn::time_linear_layouts(model, config.precision, rows,
                                config.weight_grads == TrainConfig::WeightGrads::kLeaf),
        nn::plans_choose_layout(config.precision, config.blocked_layouts));
    root_gemms = batch_gemm_seconds(model, config);
  });
  const double sweep = sweep_seconds(f.sweep_read_bytes, f.sweep_arrays, f.sweep_floats,
                                     graph.executor(), scratch, readable);
  // The leaf's other GEMMs (its own time less its inner products' alone, on the layouts its plans
  // give them), and its inner products at their best: where timing noise puts the inner products
  // alone above the leaf's whole, the floor keeps their best rather than going below it.
  Roofline r = roofline_of(f, std::max(0.0, leaf - linear.run_seconds) + linear.best_seconds,
                           root_gemms, sweep, step_seconds, run);
  r.linear_layout_seconds = linear.run_seconds - linear.best_seconds;
  return r;
}

}  // namespace cohort::train
