// The step's roofline; see roofline.hpp.
#include "roofline.hpp"

#include <algorithm>
#include <chrono>
#include <limits>
#include <map>
#include <tuple>

#include "cohort/nn/calibrate.hpp"
#include "cohort/tensor/buffer.hpp"
#include "time_account.hpp"

namespace cohort::train {

namespace {

// The GEMM shapes (m, k, n) of one full-batch step, each with how many times it runs: per leaf,
// every linear and convolution layer's forward, backward-data and backward-weights (a
// convolution as its im2col GEMM); with batch weight gradients a linear layer's weight gradient
// is one GEMM over the whole batch at the root instead of one per leaf.
using Shape = std::tuple<std::int64_t, std::int64_t, std::int64_t>;

std::map<Shape, std::size_t> step_gemms(const nn::Model& model, const TrainConfig& c) {
  const auto M = static_cast<std::int64_t>(c.micro_batch);
  const std::size_t leaves = c.batch / c.micro_batch;  // full leaves (the roofline's step)
  const bool batch_linear = c.weight_grads == TrainConfig::WeightGrads::kBatch;
  std::map<Shape, std::size_t> gemms;
  for (const nn::LayerSpec& l : model.layers()) {
    if (l.kind == nn::LayerSpec::Kind::kLinear) {
      const std::int64_t in = l.in.numel(), out = l.out.C;
      gemms[{M, in, out}] += leaves;  // forward
      gemms[{M, out, in}] += leaves;  // backward-data
      if (batch_linear)
        gemms[{in, static_cast<std::int64_t>(c.batch), out}] += 1;
      else
        gemms[{in, M, out}] += leaves;
    } else if (l.kind == nn::LayerSpec::Kind::kConv) {
      const std::int64_t pixels = M * l.out.H * l.out.W, patch = l.in.C * l.kernel * l.kernel;
      gemms[{pixels, patch, l.out.C}] += leaves;
      gemms[{pixels, l.out.C, patch}] += leaves;
      gemms[{patch, pixels, l.out.C}] += leaves;
    }
  }
  return gemms;
}

// Bytes the root moves per full-batch step: the weights and each state array read and written,
// the bf16 copy written, the leaves' gradients read where they are summed, and the rows read
// where batch weight gradients are computed.
double root_bytes(const nn::Model& model, const TrainConfig& c, std::size_t state_arrays) {
  const double n = static_cast<double>(model.layout().total());
  const bool b16 = c.precision == nn::Precision::kBf16;
  double bytes = n * 4 * 2 * static_cast<double>(1 + state_arrays) + (b16 ? n * 2 : 0);
  const double leaves = static_cast<double>(c.batch / c.micro_batch);
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
  return bytes + (n - from_rows) * 4 * leaves;
}

// The best of three sweeps that read `read` and read-modify-write `rw` bytes, chunk-parallel on
// the executor (the root's threads), in the root's 64 KiB chunks.
double sweep_seconds(double read_bytes, std::size_t rw_arrays, std::size_t n,
                     reduce::Executor& executor) {
  const std::size_t read_floats = static_cast<std::size_t>(read_bytes / 4);
  AlignedBuffer<float> src(std::max<std::size_t>(read_floats, 1));
  std::vector<AlignedBuffer<float>> rw;
  for (std::size_t i = 0; i < rw_arrays; ++i) rw.emplace_back(n);
  constexpr std::size_t kChunk = 16384;
  const std::size_t chunks = (std::max(read_floats, n) + kChunk - 1) / kChunk;
  double best = std::numeric_limits<double>::infinity();
  for (int rep = 0; rep < 4; ++rep) {
    const auto t0 = Clock::now();
    executor.parallel_for(chunks, [&](std::size_t c) {
      // 16 independent sums: a vector add per 16 floats, not a chain of dependent adds.
      constexpr std::size_t kLanes = 16;
      float lanes[kLanes] = {};
      const std::size_t end = std::min(read_floats, (c + 1) * kChunk);
      std::size_t i = c * kChunk;
      for (; i + kLanes <= end; i += kLanes)
        for (std::size_t j = 0; j < kLanes; ++j) lanes[j] += src[i + j];
      float acc = 0;
      for (float v : lanes) acc += v;
      for (auto& a : rw)
        for (std::size_t e = c * kChunk; e < std::min(n, (c + 1) * kChunk); ++e)
          a[e] = a[e] * 0.5f + acc;
    });
    if (rep > 0) best = std::min(best, seconds_since(t0));  // the first warms the pages
  }
  return best;
}

}  // namespace

Roofline measure_roofline(const nn::Model& model, const TrainConfig& config, StepGraph& graph,
                          std::size_t state_arrays, double step_seconds) {
  Roofline r;
  r.step_seconds = step_seconds;
  double gemm = 0;
  graph.for_each_replica(1, [&](std::size_t) {  // a replica's thread: OpenMP pinned to one
    for (const auto& [shape, count] : step_gemms(model, config)) {
      const auto [m, k, n] = shape;
      gemm += static_cast<double>(count) * nn::gemm_seconds(m, k, n, config.precision);
    }
  });
  const std::size_t leaves = config.batch / config.micro_batch;
  r.gemm_seconds = gemm / static_cast<double>(std::max<std::size_t>(
                              1, std::min(config.workers, leaves)));
  r.root_bytes = root_bytes(model, config, state_arrays);
  const std::size_t n = model.layout().total();
  const double rw_bytes = static_cast<double>(n) * 8 * static_cast<double>(1 + state_arrays);
  r.root_seconds =
      sweep_seconds(std::max(0.0, r.root_bytes - rw_bytes), 1 + state_arrays, n, graph.executor());
  r.floor_seconds = r.gemm_seconds + r.root_seconds;
  r.fraction = step_seconds > 0 ? r.floor_seconds / step_seconds : 0;
  return r;
}

}  // namespace cohort::train
