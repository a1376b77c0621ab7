// Google Benchmark suite of the reduce module: every strategy, and a ring all-reduce over threads
// as PyTorch DDP, Horovod and gloo run it, x gradient size x threads, beside two baselines measured
// the same way: the bandwidth ceiling (sum L buffers into one with the same thread team and the
// same kernel) and the synchronisation floor (an empty handoff). Every case's sum is checked
// against a float64 serial sum after its timing: a wrong sum marks the case with an error and
// the binary exits 1. bench/run_reduce_bench.py runs it (and reduce_mpi_bench under mpirun).
//
// One iteration = one full step: begin_step, every worker (a member of a persistent ThreadTeam
// built outside the timed loop) contributes its leaves and calls finish, the reduction completes.
// L = 2 x threads leaves of N floats (two micro-shards per worker); leaf l belongs to worker
// l % threads. Bytes counted per step, for every case and the baseline alike: L*N*4 read +
// N*4 written. stream_ratio = this case's bytes/s over the baseline's bytes/s, where the baseline
// (same size, same threads, same buffers) is measured right before the case's timed loop.
// algbw_GBps = N*4 / step time and busbw_GBps = algbw x 2 (T-1) / T, as NCCL's tests count an
// all-reduce among T participants.
//
// Flags of its own, before Google Benchmark's: --reduce_sizes=BYTES,... (default: powers of two
// from 1 KiB to 256 MiB) and --reduce_threads=T,... (default 1,2,4).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <thread>
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
            double baseline_bps, std::size_t threads) {
  const double bytes = bytes_per_step(n, leaves) * static_cast<double>(state.iterations());
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes));
  state.counters["leaves"] = static_cast<double>(leaves);
  if (elapsed > 0) {
    const double step = elapsed / static_cast<double>(state.iterations());
    const double algbw = static_cast<double>(n * sizeof(float)) / step;
    const auto t = static_cast<double>(threads);
    state.counters["algbw_GBps"] = algbw * 1e-9;
    state.counters["busbw_GBps"] = algbw * 2 * (t - 1) / t * 1e-9;
  }
  if (baseline_bps > 0 && elapsed > 0) {
    state.counters["stream_ratio"] = (bytes / elapsed) / baseline_bps;
    state.counters["baseline_GBps"] = baseline_bps * 1e-9;
  }
}

// A case's timing: one warm-up step (the first touch of its buffers), the baseline measured right
// before the timed loop, the loop, and the counters.
template <typename Step>
void time_steps(benchmark::State& state, ThreadTeam& team, Buffers& b, Step&& step) {
  step();
  const double baseline_bps = measure_baseline_bps(team, b);
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) step();
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  report(state, b.n, b.leaves, elapsed, baseline_bps, team.size());
}

// Set when any case's sum is wrong: main exits 1.
bool g_wrong_sum = false;

// Whether `got` (N floats) is the sum of the leaves within float32 rounding, against a float64
// serial sum; if not, marks the case with an error naming `what` and the first wrong element.
bool check_sum(benchmark::State& state, const Buffers& b, const float* got,
               const std::string& what) {
  for (std::size_t i = 0; i < b.n; ++i) {
    double sum = 0, magnitude = 0;
    for (std::size_t l = 0; l < b.leaves; ++l) {
      sum += b.pointers[l][i];
      magnitude += std::fabs(b.pointers[l][i]);
    }
    const double tolerance = 1e-6 * static_cast<double>(b.leaves) * magnitude + 1e-30;
    if (!(std::fabs(static_cast<double>(got[i]) - sum) <= tolerance)) {
      g_wrong_sum = true;
      state.SkipWithError(("wrong sum in " + what + " at element " + std::to_string(i) + ": " +
                           std::to_string(got[i]) + ", float64 sum " + std::to_string(sum))
                              .c_str());
      return false;
    }
  }
  return true;
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
  report(state, n, b.leaves, elapsed, baseline_bps, threads);
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
  time_steps(state, team, b, step);
  check_sum(state, b, b.result.data(), "the result");
}

// A ring all-reduce over the team's threads, as DDP, Horovod and gloo run one between processes:
// each worker sums its own leaves into a private buffer, then T-1 reduce-scatter steps (worker w
// adds chunk (w-1-s) mod T of its left neighbour's buffer into its own) and T-1 all-gather steps
// (it copies chunk (w-s) mod T, now whole, from its left neighbour), a barrier after each step.
// Every private buffer then holds the sum; its bits depend on T (the order of the ring's adds).
class SpinBarrier {
 public:
  explicit SpinBarrier(std::size_t n) : n_(n) {}
  void arrive_and_wait() {
    const std::uint64_t phase = phase_.load(std::memory_order_acquire);
    if (count_.fetch_add(1, std::memory_order_acq_rel) + 1 == n_) {
      count_.store(0, std::memory_order_relaxed);
      phase_.store(phase + 1, std::memory_order_release);
      return;
    }
    for (int spins = 0; phase_.load(std::memory_order_acquire) == phase; ++spins)
      if (spins > 64) std::this_thread::yield();  // more threads than cores: let the last run
  }

 private:
  std::size_t n_;
  alignas(cohort::kCacheLine) std::atomic<std::size_t> count_{0};
  alignas(cohort::kCacheLine) std::atomic<std::uint64_t> phase_{0};
};

void BM_Reduce_Ring(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0)) / sizeof(float);
  const auto threads = static_cast<std::size_t>(state.range(1));
  ThreadTeam& team = team_of(threads);
  const std::size_t leaves = 2 * threads;
  Buffers& b = buffers_for(n, leaves);
  std::vector<AlignedBuffer<float>> own;
  for (std::size_t w = 0; w < threads; ++w) own.emplace_back(n);
  const std::size_t chunk = ((n + threads - 1) / threads + 15) / 16 * 16;
  auto range = [&](std::size_t c) {
    const std::size_t begin = std::min(n, c * chunk);
    return std::pair{begin, std::min(n, begin + chunk)};
  };
  SpinBarrier barrier(threads);
  auto step = [&] {
    team.run([&](std::size_t w) {
      std::vector<const float*> mine;
      for (std::size_t l = w; l < leaves; l += threads) mine.push_back(b.pointers[l]);
      sum_sources(own[w].data(), mine.data(), mine.size(), n);
      const std::size_t left = (w + threads - 1) % threads;
      for (std::size_t s = 0; s + 1 < threads; ++s) {
        barrier.arrive_and_wait();
        const auto [begin, end] = range((w + 2 * threads - 1 - s) % threads);
        if (begin < end) accumulate(own[w].data() + begin, own[left].data() + begin, end - begin);
      }
      for (std::size_t s = 0; s + 1 < threads; ++s) {
        barrier.arrive_and_wait();
        const auto [begin, end] = range((w + threads - s) % threads);
        if (begin < end)
          std::copy(own[left].data() + begin, own[left].data() + end, own[w].data() + begin);
      }
    });
  };
  time_steps(state, team, b, step);
  for (std::size_t w = 0; w < threads; ++w)
    if (!check_sum(state, b, own[w].data(), "worker " + std::to_string(w) + "'s buffer")) break;
}

constexpr std::int64_t kKiB = 1024, kMiB = 1024 * 1024;

// A comma-separated list of positive integers, or exit 2 naming the flag.
std::vector<std::int64_t> parse_list(const std::string& flag, const std::string& text) {
  std::vector<std::int64_t> values;
  std::size_t at = 0;
  while (at <= text.size()) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v <= 0) {
      std::fprintf(stderr,
                   "reduce_bench: %s: expected positive integers separated by commas, "
                   "found '%s'\n",
                   flag.c_str(), text.c_str());
      std::exit(2);
    }
    values.push_back(v);
    at = comma + 1;
  }
  return values;
}

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
void register_all(const std::vector<std::int64_t>& sizes,
                  const std::vector<std::int64_t>& threads_list) {
  for (std::int64_t threads : threads_list) {
    benchmark::RegisterBenchmark("BM_Reduce_Handoff", BM_Reduce_Handoff)
        ->Args({0, threads})
        ->ArgNames({"bytes", "threads"})
        ->UseRealTime();
  }
  for (std::int64_t bytes : sizes) {
    for (std::int64_t threads : threads_list) {
      benchmark::RegisterBenchmark("BM_Reduce_Baseline", BM_Reduce_Baseline)
          ->Args({bytes, threads})
          ->ArgNames({"bytes", "threads"})
          ->UseRealTime();
      for (const Case& c : kCases)
        benchmark::RegisterBenchmark(c.name, BM_Reduce_Strategy, c)
            ->Args({bytes, threads})
            ->ArgNames({"bytes", "threads"})
            ->UseRealTime();
      benchmark::RegisterBenchmark("BM_Reduce_Ring", BM_Reduce_Ring)
          ->Args({bytes, threads})
          ->ArgNames({"bytes", "threads"})
          ->UseRealTime();
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::int64_t> sizes, threads{1, 2, 4};
  for (std::int64_t bytes = kKiB; bytes <= 256 * kMiB; bytes *= 2) sizes.push_back(bytes);
  std::vector<char*> rest{argv[0]};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--reduce_sizes=", 0) == 0)
      sizes = parse_list("--reduce_sizes", arg.substr(15));
    else if (arg.rfind("--reduce_threads=", 0) == 0)
      threads = parse_list("--reduce_threads", arg.substr(17));
    else
      rest.push_back(argv[i]);
  }
  for (std::int64_t& bytes : sizes) bytes = bytes / 4 * 4;  // whole floats
  register_all(sizes, threads);
  int count = static_cast<int>(rest.size());
  benchmark::Initialize(&count, rest.data());
  if (benchmark::ReportUnrecognizedArguments(count, rest.data())) return 2;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return g_wrong_sum ? 1 : 0;
}
