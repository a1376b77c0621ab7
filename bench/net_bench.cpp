// One nn::Net::forward_backward of a 128-row leaf on one thread, f32 against bf16, for the default
// MLP, the `cnn` preset and resnet20 (blocked layouts, 1x28x28 inputs); and one
// nn::GptNet::forward_backward of a leaf of windows for nanoGPT's CPU recipe (gpt:4-4-128-64, 6
// windows: half its batch of 12), a medium model (gpt:4-4-256-128, 16 windows) and its full
// recipe (gpt:6-6-384-256, 4 windows), vocabulary 65, counted in tokens/s. oneDNN runs on OpenMP
// here, so the process is pinned to one OpenMP thread, as a replica is in training. Counters:
// rows/s, and the Net's own phase split (Net::times()) in milliseconds per iteration: matmul,
// eltwise, loss, other. The bf16 cases run only where the CPU has native bf16 dot products
// (AVX512_BF16): emulated bf16 costs several times f32 and says nothing about the bf16 path.
// Also two of a bf16 plan's own loops alone (nn/gpt/gpt_kernels.hpp) on one leaf of those models,
// counted in rows/s: the causal softmax's forward on the attention scores, writing the bf16
// weights P V reads, its backward writing bf16 dS, and LayerNorm's forward (bf16 out) and backward
// (bf16 gradient in, the input gradient added to the stream's); and attention as cohort's AMX
// kernel (nn/gpt/gpt_attention.hpp), forward then backward, on the heads of one default leaf;
// and the head's loss with its gradient on 83 rows of GPT-2's vocabulary (one head chunk of
// gpt:124M), the language models' kernel against the generic one.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "cohort/nn/gpt/gpt.hpp"
#include "cohort/nn/gpt/gpt_attention.hpp"
#include "cohort/nn/gpt/gpt_kernels.hpp"
#include "cohort/nn/loss.hpp"
#include "cohort/nn/model.hpp"
#include "cohort/nn/net.hpp"
#include "cohort/nn/version.hpp"
#include "cohort/tensor/bf16.hpp"
#include "cohort/tensor/buffer.hpp"

namespace {

using cohort::AlignedBuffer;
using cohort::bf16;
using cohort::nn::Model;
using cohort::nn::Net;
using cohort::nn::Precision;
constexpr std::int64_t kRows = 128;

// A leaf's arrays: the model's initial weights, inputs in [0, 1) on a fixed pattern, labels
// cycling through the classes, and their bf16 copies for a bf16 Net.
struct Leaf {
  AlignedBuffer<float> params, x, grad, stats;
  AlignedBuffer<bf16> params16, x16;
  std::vector<std::int32_t> labels;

  explicit Leaf(const Model& m)
      : params(m.layout().total()),
        x(static_cast<std::size_t>(kRows * m.input_features())),
        grad(m.layout().total()),
        stats(m.stats_layout().total()),
        params16(params.size()),
        x16(x.size()) {
    m.init(params.data(), 7);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i * 37 % 101) / 101.0f;
    for (std::int64_t r = 0; r < kRows; ++r)
      labels.push_back(static_cast<std::int32_t>(r % m.num_classes()));
    cohort::to_bf16(params.data(), params16.data(), params.size());
    cohort::to_bf16(x.data(), x16.data(), x.size());
  }

  void step(Net& net, Precision p) {
    float* s = stats.size() ? stats.data() : nullptr;  // only models with bn layers have any
    if (p == Precision::kBf16)
      net.forward_backward(params16.data(), x16.data(), labels.data(), kRows, grad.data(), {}, {},
                           s);
    else
      net.forward_backward(params.data(), x.data(), labels.data(), kRows, grad.data(), {}, {}, s);
  }
};

void forward_backward(benchmark::State& state, const char* spec, Precision precision) {
  if (precision == Precision::kBf16 &&
      cohort::nn::bf16_support() != cohort::nn::Bf16Support::kNative) {
    const std::string why =
        "no native bf16 on this CPU (oneDNN dispatches " + cohort::nn::onednn_isa() + ")";
    state.SkipWithError(why.c_str());
    return;
  }
  omp_set_num_threads(1);
  const Model m = Model::parse(spec);
  Net net(m, true, precision);
  Leaf leaf(m);
  leaf.step(net, precision);  // creates the primitives
  net.reset_times();
  for (auto _ : state) {
    leaf.step(net, precision);
    benchmark::DoNotOptimize(leaf.grad.data());
  }
  const auto& t = net.times();
  using benchmark::Counter;
  state.counters["rows/s"] =
      Counter(static_cast<double>(state.iterations() * kRows), Counter::kIsRate);
  state.counters["matmul_ms"] = Counter(1e3 * t.matmul, Counter::kAvgIterations);
  state.counters["eltwise_ms"] = Counter(1e3 * t.eltwise, Counter::kAvgIterations);
  state.counters["loss_ms"] = Counter(1e3 * t.loss, Counter::kAvgIterations);
  state.counters["other_ms"] = Counter(1e3 * t.other, Counter::kAvgIterations);
  state.SetLabel(cohort::nn::onednn_isa());
}

BENCHMARK_CAPTURE(forward_backward, mlp_f32, "mlp:784-512-256-10", Precision::kF32)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(forward_backward, mlp_bf16, "mlp:784-512-256-10", Precision::kBf16)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(forward_backward, cnn_f32, "cnn", Precision::kF32)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(forward_backward, cnn_bf16, "cnn", Precision::kBf16)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(forward_backward, resnet20_f32, "resnet20", Precision::kF32)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(forward_backward, resnet20_bf16, "resnet20", Precision::kBf16)
    ->Unit(benchmark::kMillisecond);

void gpt_forward_backward(benchmark::State& state, const char* spec, std::int64_t windows,
                          Precision precision) {
  if (precision == Precision::kBf16 &&
      cohort::nn::bf16_support() != cohort::nn::Bf16Support::kNative) {
    state.SkipWithError("no native bf16 on this CPU");
    return;
  }
  omp_set_num_threads(1);
  const auto m = cohort::nn::GptModel::parse(spec, 65);
  cohort::nn::GptNet net(m, precision);
  AlignedBuffer<float> params(m.layout().total()), grad(m.layout().total());
  AlignedBuffer<bf16> params16(params.size());
  m.init(params.data(), 7);
  cohort::to_bf16(params.data(), params16.data(), params.size());
  const std::int64_t T = m.shape().block;
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(windows * (T + 1)));
  for (std::size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<std::int32_t>(i * 37 % 65);
  auto step = [&] {
    if (precision == Precision::kBf16)
      net.forward_backward(params16.data(), tokens.data(), windows, grad.data());
    else
      net.forward_backward(params.data(), tokens.data(), windows, grad.data());
  };
  step();  // creates the primitives
  net.reset_times();
  for (auto _ : state) {
    step();
    benchmark::DoNotOptimize(grad.data());
  }
  const auto& t = net.times();
  using benchmark::Counter;
  state.counters["tokens/s"] =
      Counter(static_cast<double>(state.iterations() * windows * T), Counter::kIsRate);
  state.counters["matmul_ms"] = Counter(1e3 * t.matmul, Counter::kAvgIterations);
  state.counters["eltwise_ms"] = Counter(1e3 * t.eltwise, Counter::kAvgIterations);
  state.counters["loss_ms"] = Counter(1e3 * t.loss, Counter::kAvgIterations);
  state.counters["other_ms"] = Counter(1e3 * t.other, Counter::kAvgIterations);
  state.SetLabel(cohort::nn::onednn_isa());
}

BENCHMARK_CAPTURE(gpt_forward_backward, cpu_recipe_f32, "gpt:4-4-128-64", 6, Precision::kF32)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(gpt_forward_backward, cpu_recipe_bf16, "gpt:4-4-128-64", 6, Precision::kBf16)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(gpt_forward_backward, medium_f32, "gpt:4-4-256-128", 16, Precision::kF32)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(gpt_forward_backward, medium_bf16, "gpt:4-4-256-128", 16, Precision::kBf16)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(gpt_forward_backward, full_recipe_f32, "gpt:6-6-384-256", 4, Precision::kF32)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(gpt_forward_backward, full_recipe_bf16, "gpt:6-6-384-256", 4, Precision::kBf16)
    ->Unit(benchmark::kMillisecond);

// causal_softmax_forward over `mats` (T, T) score matrices (a leaf's windows x heads), scores
// on a fixed pattern, no dropout mask.
void gpt_softmax_forward(benchmark::State& state, std::int64_t mats, std::int64_t T) {
  const auto n = static_cast<std::size_t>(mats * T * T);
  AlignedBuffer<float> s(n), p(n);
  AlignedBuffer<bf16> used(n);
  for (std::size_t i = 0; i < n; ++i) s[i] = static_cast<float>(i * 37 % 101) / 10.0f - 5.0f;
  const float scale = 1.0f / 8.0f;
  for (auto _ : state) {
    cohort::nn::causal_softmax_forward(s.data(), p.data(), nullptr, used.data(), mats, T, scale);
    benchmark::DoNotOptimize(used.data());
  }
  state.counters["rows/s"] = benchmark::Counter(static_cast<double>(state.iterations() * mats * T),
                                                benchmark::Counter::kIsRate);
}

// causal_softmax_backward over the same matrices, bf16 out: dS from P and dP.
void gpt_softmax_backward(benchmark::State& state, std::int64_t mats, std::int64_t T) {
  const auto n = static_cast<std::size_t>(mats * T * T);
  AlignedBuffer<float> s(n), p(n), dp(n);
  AlignedBuffer<bf16> ds(n);
  for (std::size_t i = 0; i < n; ++i) {
    s[i] = static_cast<float>(i * 37 % 101) / 10.0f - 5.0f;
    dp[i] = static_cast<float>(i * 53 % 97) / 97.0f - 0.5f;
  }
  const float scale = 1.0f / 8.0f;
  cohort::nn::causal_softmax_forward(s.data(), p.data(), mats, T, scale);
  for (auto _ : state) {
    cohort::nn::causal_softmax_backward(p.data(), dp.data(), nullptr, ds.data(), mats, T, scale);
    benchmark::DoNotOptimize(ds.data());
  }
  state.counters["rows/s"] = benchmark::Counter(static_cast<double>(state.iterations() * mats * T),
                                                benchmark::Counter::kIsRate);
}

BENCHMARK_CAPTURE(gpt_softmax_forward, cpu_recipe, 6 * 4, 64)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(gpt_softmax_forward, medium, 16 * 4, 128)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(gpt_softmax_forward, full_recipe, 4 * 6, 256)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(gpt_softmax_backward, cpu_recipe, 6 * 4, 64)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(gpt_softmax_backward, medium, 16 * 4, 128)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(gpt_softmax_backward, full_recipe, 4 * 6, 256)->Unit(benchmark::kMicrosecond);

// attention_kernel_forward then attention_kernel_backward with one engine on a leaf's heads (6, 8
// and 4 windows), random bf16 q, k, v and dy; skipped where the engine cannot run.
// gpt_attention_onednn: the same leaf's six products as oneDNN's matmuls alone
// (gpt_attention_onednn_seconds, the roofline's floor; no softmax), for scale.
void gpt_attention_kernel(benchmark::State& state, cohort::nn::AttentionEngine engine,
                          std::int64_t N, std::int64_t T, std::int64_t H, std::int64_t hs) {
  if (!cohort::nn::attention_kernel_usable(engine, T, hs)) {
    state.SkipWithError("the engine cannot run here (attention_kernel_usable)");
    return;
  }
  const cohort::nn::AttentionShape shape{N, T, H, hs};
  const auto rows = static_cast<std::size_t>(N * T), C = static_cast<std::size_t>(H * hs);
  std::vector<cohort::bf16> qkv(rows * 3 * C), dy(rows * C), y(rows * C), dqkv(rows * 3 * C);
  std::vector<float> stats(rows * static_cast<std::size_t>(H) * 2);
  for (std::size_t i = 0; i < qkv.size(); ++i)
    qkv[i] = cohort::to_bf16(static_cast<float>(i % 13) / 6.0f - 1.0f);
  for (std::size_t i = 0; i < dy.size(); ++i)
    dy[i] = cohort::to_bf16(static_cast<float>(i % 7) / 3.0f - 1.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (auto _ : state) {
    cohort::nn::attention_kernel_forward(engine, qkv.data(), nullptr, stats.data(), y.data(), shape,
                                         scale);
    cohort::nn::attention_kernel_backward(engine, qkv.data(), stats.data(), nullptr, dy.data(),
                                          dqkv.data(), shape, scale);
    benchmark::DoNotOptimize(dqkv.data());
  }
}
void gpt_attention_onednn(benchmark::State& state, const char* spec, std::int64_t N) {
  omp_set_num_threads(1);
  const auto model = cohort::nn::GptModel::parse(spec, 65);
  for (auto _ : state) {
    const double seconds =
        cohort::nn::gpt_attention_onednn_seconds(model, N) / model.shape().layers;
    state.SetIterationTime(seconds);
  }
}
#define COHORT_ATTENTION_BENCH(engine, name)                                                       \
  BENCHMARK_CAPTURE(gpt_attention_kernel, name##_cpu_recipe, cohort::nn::AttentionEngine::engine,  \
                    6, 64, 4, 32)                                                                  \
      ->Unit(benchmark::kMicrosecond);                                                             \
  BENCHMARK_CAPTURE(gpt_attention_kernel, name##_medium, cohort::nn::AttentionEngine::engine, 8,   \
                    128, 4, 64)                                                                    \
      ->Unit(benchmark::kMicrosecond);                                                             \
  BENCHMARK_CAPTURE(gpt_attention_kernel, name##_full_recipe, cohort::nn::AttentionEngine::engine, \
                    4, 256, 6, 64)                                                                 \
      ->Unit(benchmark::kMicrosecond)
COHORT_ATTENTION_BENCH(kAmx, amx);
COHORT_ATTENTION_BENCH(kAvx512Bf16, avx512_bf16);
BENCHMARK_CAPTURE(gpt_attention_onednn, cpu_recipe, "gpt:1-4-128-64", 6)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(gpt_attention_onednn, medium, "gpt:1-4-256-128", 8)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(gpt_attention_onednn, full_recipe, "gpt:1-6-384-256", 4)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// layer_norm_forward then layer_norm_backward over `rows` rows of C, inputs on a fixed pattern.
void gpt_layer_norm(benchmark::State& state, std::int64_t rows, std::int64_t C) {
  const auto n = static_cast<std::size_t>(rows * C);
  AlignedBuffer<float> x(n), dx(n), gamma(static_cast<std::size_t>(C)), dgamma(gamma.size()),
      mean(static_cast<std::size_t>(rows)), rstd(mean.size());
  AlignedBuffer<bf16> y(n), dy(n);
  for (std::size_t i = 0; i < n; ++i) {
    x[i] = static_cast<float>(i * 37 % 101) / 50.0f - 1.0f;
    dy[i] = cohort::to_bf16(static_cast<float>(i * 53 % 97) / 97.0f - 0.5f);
  }
  for (std::size_t j = 0; j < gamma.size(); ++j) gamma[j] = 1.0f + static_cast<float>(j % 7) / 7;
  for (auto _ : state) {
    cohort::nn::layer_norm_forward(x.data(), gamma.data(), nullptr, y.data(), mean.data(),
                                   rstd.data(), rows, C, 1e-5f);
    cohort::nn::layer_norm_backward(x.data(), gamma.data(), mean.data(), rstd.data(), dy.data(),
                                    dx.data(), true, dgamma.data(), nullptr, rows, C);
    benchmark::DoNotOptimize(dx.data());
  }
  state.counters["rows/s"] = benchmark::Counter(static_cast<double>(state.iterations() * rows),
                                                benchmark::Counter::kIsRate);
}

BENCHMARK_CAPTURE(gpt_layer_norm, cpu_recipe, 6 * 64, 128)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(gpt_layer_norm, medium, 16 * 128, 256)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(gpt_layer_norm, full_recipe, 4 * 256, 384)->Unit(benchmark::kMicrosecond);

// The head's loss and its gradient, written over the logits, on `rows` rows of GPT-2's padded
// vocabulary: token_cross_entropy (the language models' kernel) against the generic
// softmax_cross_entropy, one std::exp a column, with the padding zeroed after it as the head did.
void gpt_head_loss(benchmark::State& state, bool lanes, std::int64_t rows, std::int64_t V,
                   std::int64_t stride) {
  const auto n = static_cast<std::size_t>(rows * stride);
  AlignedBuffer<float> logits(n), z(n);
  std::vector<std::int32_t> labels(static_cast<std::size_t>(rows));
  for (std::size_t i = 0; i < n; ++i) logits[i] = static_cast<float>(i * 37 % 101) / 10.0f - 5.0f;
  for (std::size_t r = 0; r < labels.size(); ++r)
    labels[r] = static_cast<std::int32_t>(r * 7919 % static_cast<std::size_t>(V));
  for (auto _ : state) {
    state.PauseTiming();
    std::copy(logits.data(), logits.data() + n, z.data());
    state.ResumeTiming();
    if (lanes) {
      benchmark::DoNotOptimize(cohort::nn::token_cross_entropy(z.data(), labels.data(), rows, V,
                                                               stride, 1.0f, z.data()));
    } else {
      benchmark::DoNotOptimize(
          cohort::nn::softmax_cross_entropy(z.data(), labels.data(), rows, V, z.data(), stride));
      for (std::int64_t r = 0; r < rows; ++r)
        std::fill(z.data() + r * stride + V, z.data() + (r + 1) * stride, 0.0f);
    }
    benchmark::DoNotOptimize(z.data());
  }
  state.counters["rows/s"] = benchmark::Counter(static_cast<double>(state.iterations() * rows),
                                                benchmark::Counter::kIsRate);
}

BENCHMARK_CAPTURE(gpt_head_loss, gpt2_lanes, true, 83, 50257, 50304)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(gpt_head_loss, gpt2_generic, false, 83, 50257, 50304)
    ->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
