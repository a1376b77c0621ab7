// The training step's root on its own (train::Root, the trainer's own code), at the default MLP's
// size (535,818 parameters, two leaves): add the leaves block by block, check the block for
// non-finite values, apply the optimizer; against a baseline that moves the same bytes (reads four
// arrays, writes two) with no arithmetic. Their ratio says how close the root is to the memory
// floor; the absolute time against the step's says whether "root <= 3% of the step" is
// reachable at all. One thread; the argument is the MiB swept through the caches between iterations
// (untimed): 0 keeps the root's 12.9 MB warm, 8 and 16 are about what a training step's own compute
// touches on this model, 64 evicts everything (as a VM's busy neighbours can).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstddef>
#include <thread>
#include <vector>

#include "cohort/nn/batch_grad.hpp"
#include "cohort/optim/optimizer.hpp"
#include "cohort/tensor/bf16.hpp"
#include "cohort/tensor/buffer.hpp"
#include "cohort/train/root.hpp"

namespace {

using cohort::AlignedBuffer;
using cohort::train::Root;
constexpr std::size_t kParams = 535818;  // mlp:784-512-256-10
constexpr std::size_t kChunk = 16384;    // floats, the reducer's default chunk

struct Arrays {
  AlignedBuffer<float> w{kParams}, s0{kParams}, s1{kParams}, g0{kParams}, g1{kParams};
  std::vector<char> sweep;
  explicit Arrays(std::size_t sweep_mib) : sweep(sweep_mib << 20, 1) {
    for (std::size_t i = 0; i < kParams; ++i) {
      w[i] = 1.0f;
      g0[i] = 0.5f;
      g1[i] = 0.25f;
    }
  }
  void evict() {
    for (std::size_t i = 0; i < sweep.size(); i += 64) sweep[i] = static_cast<char>(sweep[i] + 1);
    benchmark::ClobberMemory();
  }
};

void root(benchmark::State& state, cohort::optim::Kind kind) {
  const bool cold = state.range(0) != 0;
  Arrays a(static_cast<std::size_t>(state.range(0)));
  cohort::optim::Optimizer opt({.kind = kind, .lr = 1e-6f});
  float* s1 = opt.state_buffers() > 1 ? a.s1.data() : nullptr;
  Root r(opt, a.w.data(), nullptr, a.s0.data(), s1, kParams, kChunk, Root::Mode::kFused);
  const float* leaves[2] = {a.g0.data(), a.g1.data()};
  for (auto _ : state) {
    if (cold) {
      state.PauseTiming();
      a.evict();
      state.ResumeTiming();
    }
    r.begin_step(opt.scalars(1e-6f, 1.0f / 256, 1));
    for (std::size_t b = 0; b < kParams; b += kChunk)
      r.fused_chunk(leaves, 2, b, std::min(kParams, b + kChunk));
    if (r.first_non_finite() != kParams) state.SkipWithError("non-finite");
    benchmark::DoNotOptimize(a.w.data());
  }
  const std::size_t arrays = 2 + 2 * (1 + opt.state_buffers());  // leaves + (w, state) r/w
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * arrays * kParams * 4));
}

// The root with batch weight gradients (--weight-grads batch): the gradient is produced chunk by
// chunk in a cache-resident buffer (here one chunk buffer, reused, as the root's per-thread one),
// so only the weights and the optimizer's state stream: the floor of that root, whatever the
// GEMMs cost. Root::apply_checked is the sweep the trainer runs on that buffer.
// Argument: MiB swept between iterations as above; -1 instead has another thread read all of
// the weights between iterations (untimed), as the other replica's forward pass does in training.
void apply_only(benchmark::State& state, cohort::optim::Kind kind) {
  const bool shared = state.range(0) < 0;
  if (shared) state.SetLabel("weights read by another thread");
  const bool cold = state.range(0) > 0;
  Arrays a(static_cast<std::size_t>(std::max<std::int64_t>(0, state.range(0))));
  cohort::optim::Optimizer opt({.kind = kind, .lr = 1e-6f});
  float* s1 = opt.state_buffers() > 1 ? a.s1.data() : nullptr;
  Root r(opt, a.w.data(), nullptr, a.s0.data(), s1, kParams, kChunk, Root::Mode::kFused);
  cohort::AlignedBuffer<float> chunk(kChunk);
  std::fill(chunk.data(), chunk.data() + kChunk, 0.5f);
  for (auto _ : state) {
    if (cold) {
      state.PauseTiming();
      a.evict();
      state.ResumeTiming();
    }
    if (shared) {
      state.PauseTiming();
      float total = 0;
      std::thread([&] {
        for (std::size_t i = 0; i < kParams; i += 16) total += a.w[i];
      }).join();
      benchmark::DoNotOptimize(total);
      state.ResumeTiming();
    }
    r.begin_step(opt.scalars(1e-6f, 1.0f / 256, 1));
    for (std::size_t b = 0; b < kParams; b += kChunk)
      if (!r.apply_checked(chunk.data(), b, std::min(kParams, b + kChunk)))
        state.SkipWithError("non-finite");
    benchmark::DoNotOptimize(a.w.data());
  }
  const std::size_t arrays = 2 * (1 + opt.state_buffers());  // (w, state) read and written
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * arrays * kParams * 4));
}

// The bf16 root of the default MLP's first layer (784 x 512, batch 256, the trainer's 256 KiB
// chunks): each chunk's weight gradient on the row-pair kernel, then the checked optimizer and the
// bf16 copy (Root::apply_checked) over it. `fused` hands the kernel's rows to the optimizer a tile
// at a time while the kernel prefetches the next tile's weights, state and copy (the trainer's
// fused root); otherwise the chunk's gradient is written whole, then applied. Argument: MiB swept
// between iterations, as above (64: the root's arrays come from memory, as in training here).
void batch_root(benchmark::State& state, bool fused) {
  if (!cohort::nn::row_pair_kernel()) {
    state.SkipWithError("no AVX512_BF16 row-pair kernel on this build or CPU");
    return;
  }
  constexpr std::int64_t kIn = 784, kOut = 512, kRows = 256;
  constexpr std::size_t kN = kIn * kOut, kRootChunk = 65536;
  const bool cold = state.range(0) != 0;
  Arrays a(static_cast<std::size_t>(state.range(0)));
  AlignedBuffer<cohort::bf16> w16(kN), x(kRows * kIn), dy(kRows * kOut);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = cohort::to_bf16(float(i % 17) / 17.0f - 0.5f);
  for (std::size_t i = 0; i < dy.size(); ++i) dy[i] = cohort::to_bf16(float(i % 13) / 13.0f - 0.5f);
  AlignedBuffer<float> buffer(kRootChunk);
  cohort::optim::Optimizer opt({.kind = cohort::optim::Kind::kSgd, .lr = 1e-6f});
  Root r(opt, a.w.data(), w16.data(), a.s0.data(), nullptr, kN, kRootChunk, Root::Mode::kFused);
  for (auto _ : state) {
    if (cold) {
      state.PauseTiming();
      a.evict();
      state.ResumeTiming();
    }
    r.begin_step(opt.scalars(1e-6f, 1.0f / kRows, 1));
    for (std::size_t b = 0; b < kN; b += kRootChunk) {
      const std::size_t e = std::min(kN, b + kRootChunk);
      const auto i0 = static_cast<std::int64_t>(b / kOut), i1 = static_cast<std::int64_t>(e / kOut);
      if (fused) {
        auto take = [&](std::int64_t i, std::int64_t j, const float* g) {
          return r.apply_checked(g, static_cast<std::size_t>(i) * kOut,
                                 static_cast<std::size_t>(j) * kOut);
        };
        const cohort::nn::RowConsumer rows{
            take,
            buffer.data(),
            {{{a.w.data(), kOut * 4}, {w16.data(), kOut * 2}, {a.s0.data(), kOut * 4}}}};
        cohort::nn::linear_weight_grad_pairs(x.data(), dy.data(), kRows, kIn, kOut, i0, i1, rows);
      } else {
        cohort::nn::linear_weight_grad_pairs(x.data(), dy.data(), kRows, kIn, kOut, i0, i1,
                                             buffer.data());
        r.apply_checked(buffer.data(), b, e);
      }
    }
    if (r.first_non_finite() != kN) state.SkipWithError("non-finite");
    benchmark::DoNotOptimize(a.w.data());
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * 2 * kRows * kN));
}

// The same bytes as the SGD root with trivial arithmetic: w and s0 read and written, g0 and g1
// read, one vectorised pass.
void stream(benchmark::State& state) {
  const bool cold = state.range(0) != 0;
  Arrays a(static_cast<std::size_t>(state.range(0)));
  for (auto _ : state) {
    if (cold) {
      state.PauseTiming();
      a.evict();
      state.ResumeTiming();
    }
    float* __restrict w = a.w.data();
    float* __restrict s = a.s0.data();
    const float* __restrict g0 = a.g0.data();
    const float* __restrict g1 = a.g1.data();
    for (std::size_t i = 0; i < kParams; ++i) {
      const float x = (w[i] + s[i]) + (g0[i] + g1[i]);
      w[i] = x;
      s[i] = x;
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * 6 * kParams * 4));
}

BENCHMARK_CAPTURE(root, sgd_momentum, cohort::optim::Kind::kSgd)->Arg(0)->Arg(8)->Arg(16)->Arg(64);
BENCHMARK_CAPTURE(root, adam, cohort::optim::Kind::kAdam)->Arg(0)->Arg(64);
BENCHMARK_CAPTURE(apply_only, sgd_momentum, cohort::optim::Kind::kSgd)
    ->Arg(0)
    ->Arg(8)
    ->Arg(64)
    ->Arg(-1);
BENCHMARK(stream)->Arg(0)->Arg(8)->Arg(16)->Arg(64);
BENCHMARK_CAPTURE(batch_root, fused, true)->Arg(0)->Arg(64);
BENCHMARK_CAPTURE(batch_root, chunk_then_apply, false)->Arg(0)->Arg(64);

}  // namespace

BENCHMARK_MAIN();
