// Google Benchmark suite of the reduce module: every strategy x gradient size (1 KiB .. 256 MiB)
// x threads (1, 2, and 4 = 2x the cores of the reference machine), beside two baselines measured
// the same way: the bandwidth ceiling (sum L buffers into one with the same thread team and the
// same kernel) and the synchronisation floor (an empty handoff). Not a correctness test
// (tests/reduce).
//
// One iteration = one full step: begin_step, every worker (a member of a persistent ThreadTeam
// built outside the timed loop) contributes its leaves and calls finish, the reduction completes.
// L = 2 x threads leaves of N floats (two micro-shards per worker); leaf l belongs to worker
// l % threads. Bytes counted per step, for every case and the baseline alike: L*N*4 read +
// N*4 written. stream_ratio = this case's bytes/s over the baseline's bytes/s, where the baseline
// (same size, same threads, same buffers) is measured right before the case's timed loop.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cohort/reduce/executor.hpp"
#include "cohort/reduce/kernels.hpp"
#include "cohort/reduce/reducer.hpp"
#include "cohort/tensor/buffer.hpp"

namespace {

using cohort::AlignedBuffer;
using namespace cohort::reduce;

ThreadTeam& team_of(std::size_t threads) {
  static std::map<std::size_t, std::unique_ptr<ThreadTeam>> teams;
  auto& team = teams[threads];
  if (!team) team = std::make_unique<ThreadTeam>(threads);
  return *team;
}

// The leaves and result of the current (n, L); reallocated when the case changes size, so at most
// one size is resident (256 MiB x 8 leaves is 2 GiB).
struct Buffers {
  std::size_t n = 0, leaves = 0;
  std::vector<AlignedBuffer<float>> leaf;
  std::vector<const float*> pointers;
  AlignedBuffer<float> result;
};
Buffers& buffers_for(std::size_t n, std::size_t leaves) {
  static Buffers b;
  if (b.n != n || b.leaves != leaves) {
    b = Buffers{};
    b.n = n;
    b.leaves = leaves;
    for (std::size_t l = 0; l < leaves; ++l) {
      b.leaf.emplace_back(n);
      float* p = b.leaf.back().data();
      for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<float>((i + l) % 1024) * 0.001f;
      b.pointers.push_back(p);
    }
    b.result = AlignedBuffer<float>(n);
  }
  return b;
}

double bytes_per_step(std::size_t n, std::size_t leaves) {
  return static_cast<double>(leaves * n * sizeof(float) + n * sizeof(float));
}

// The bandwidth ceiling: member m sums all L leaves over its static 1/T slice (cache-line
// aligned) into the result, with the reducers' kernel, left to right; the run's join is the
// barrier.
void baseline_step(ThreadTeam& team, Buffers& b) {
  const std::size_t threads = team.size();
  const std::size_t slice = ((b.n + threads - 1) / threads + 15) / 16 * 16;
  team.run([&](std::size_t m) {
    const std::size_t begin = std::min(b.n, m * slice);
    const std::size_t end = std::min(b.n, begin + slice);
    std::vector<const float*> src(b.leaves);
    if (begin == end) return;
    for (std::size_t l = 0; l < b.leaves; ++l) src[l] = b.pointers[l] + begin;
    sum_sources(b.result.data() + begin, src.data(), b.leaves, end - begin);
  });
}

template <typename Step>
double seconds_per_step(Step&& step, double min_seconds, int min_steps) {
  step();  // warm-up
  const auto start = std::chrono::steady_clock::now();
  int steps = 0;
  double elapsed = 0;
  do {
    step();
    ++steps;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  } while (steps < min_steps || elapsed < min_seconds);
  return elapsed / steps;
}

double measure_baseline_bps(ThreadTeam& team, Buffers& b) {
  const double s = seconds_per_step([&] { baseline_step(team, b); }, 0.03, 3);
  return bytes_per_step(b.n, b.leaves) / s;
}

void report(benchmark::State& state, std::size_t n, std::size_t leaves, double elapsed,
            double baseline_bps) {
  const double bytes = bytes_per_step(n, leaves) * static_cast<double>(state.iterations());
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes));
  state.counters["leaves"] = static_cast<double>(leaves);
  if (baseline_bps > 0 && elapsed > 0) {
    state.counters["stream_ratio"] = (bytes / elapsed) / baseline_bps;
    state.counters["baseline_GBps"] = baseline_bps * 1e-9;
  }
}

void BM_Reduce_Baseline(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0)) / sizeof(float);
  const auto threads = static_cast<std::size_t>(state.range(1));
  ThreadTeam& team = team_of(threads);
  Buffers& b = buffers_for(n, 2 * threads);
  const double baseline_bps = measure_baseline_bps(team, b);
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) baseline_step(team, b);
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  report(state, n, b.leaves, elapsed, baseline_bps);
}

// The synchronisation floor: each step every member signals; the last arriver completes the step.
void BM_Reduce_Handoff(benchmark::State& state) {
  const auto threads = static_cast<std::size_t>(state.range(1));
  ThreadTeam& team = team_of(threads);
  alignas(cohort::kCacheLine) std::atomic<std::uint32_t> pending{
      static_cast<std::uint32_t>(threads)};
  alignas(cohort::kCacheLine) std::atomic<std::uint64_t> completed{0};
  for (auto _ : state) {
    team.run([&](std::size_t) {
      // acq_rel: the last arriver must see every member's (empty) work, as a reducer's root does.
      if (pending.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        pending.store(static_cast<std::uint32_t>(threads), std::memory_order_relaxed);  // re-arm
        completed.fetch_add(1, std::memory_order_release);  // release: the step's completion
      }
    });
  }
  state.counters["steps"] = static_cast<double>(completed.load(std::memory_order_acquire));
}

struct Case {
  const char* name;
  Strategy strategy;
  bool binary;  // arity 2 instead of arity = L (one flat root)
};

void BM_Reduce_Strategy(benchmark::State& state, Case c) {
  const auto n = static_cast<std::size_t>(state.range(0)) / sizeof(float);
  const auto threads = static_cast<std::size_t>(state.range(1));
  ThreadTeam& team = team_of(threads);
  const std::size_t leaves = 2 * threads;
  Buffers& b = buffers_for(n, leaves);
  ReducerConfig config;
  config.n = n;
  config.leaves = leaves;
  config.workers = threads;
  config.arity = c.binary ? 2 : std::max<std::size_t>(2, leaves);
  auto reducer = make_reducer(c.strategy, config, team);
  auto step = [&] {
    reducer->begin_step(Sink::into(b.result.data()));
    team.run([&](std::size_t w) {
      for (std::size_t l = w; l < leaves; l += threads) reducer->contribute(w, l, b.pointers[l]);
      reducer->finish(w);
    });
    reducer->wait_step();
  };
  step();  // warm-up: first touch of the reducer's buffers
  const double baseline_bps = measure_baseline_bps(team, b);
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) step();
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  report(state, n, leaves, elapsed, baseline_bps);
}

constexpr std::int64_t kKiB = 1024, kMiB = 1024 * 1024;
constexpr std::int64_t kSizes[] = {kKiB,      16 * kKiB, 256 * kKiB, 2 * kMiB,
                                   16 * kMiB, 64 * kMiB, 256 * kMiB};
constexpr std::int64_t kThreads[] = {1, 2, 4};

const Case kCases[] = {
    {"BM_Reduce_Tree", Strategy::kTree, false},
    {"BM_Reduce_TreeBinary", Strategy::kTree, true},
    {"BM_Reduce_ChunkOwner", Strategy::kChunkOwner, false},
    {"BM_Reduce_ParameterServer", Strategy::kParameterServer, false},
    {"BM_Reduce_Atomic", Strategy::kAtomic, false},
    {"BM_Reduce_Mutex", Strategy::kMutex, false},
    {"BM_Reduce_Serial", Strategy::kSerial, false},
};

// Registered size-major so one set of leaves serves every case of a size.
const bool registered = [] {
  for (std::int64_t threads : kThreads) {
    benchmark::RegisterBenchmark("BM_Reduce_Handoff", BM_Reduce_Handoff)
        ->Args({0, threads})
        ->ArgNames({"bytes", "threads"})
        ->UseRealTime();
  }
  for (std::int64_t bytes : kSizes) {
    for (std::int64_t threads : kThreads) {
      benchmark::RegisterBenchmark("BM_Reduce_Baseline", BM_Reduce_Baseline)
          ->Args({bytes, threads})
          ->ArgNames({"bytes", "threads"})
          ->UseRealTime();
      for (const Case& c : kCases) {
        // CAS-per-float adds take seconds per step at 256 MiB; the trend is clear by 64 MiB.
        if (c.strategy == Strategy::kAtomic && bytes > 64 * kMiB) continue;
        benchmark::RegisterBenchmark(c.name, BM_Reduce_Strategy, c)
            ->Args({bytes, threads})
            ->ArgNames({"bytes", "threads"})
            ->UseRealTime();
      }
    }
  }
  return true;
}();

}  // namespace

BENCHMARK_MAIN();
