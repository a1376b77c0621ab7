// Every strategy against the serial tree-order oracle: bitwise for the deterministic ones, within
// the float64 bound of reduce_test_util.hpp for all (atomic and mutex add in arrival order, so
// they are checked by tolerance only). W in {1,2,3,4,5,7,8,16} on this 2-core machine, L 1..33,
// sizes {0,1,15,16,17,63,64,65,4097, 2^20+3} (the big one with fewer combinations).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>

#include "cohort/core/error.hpp"
#include "cohort/reduce/kernels.hpp"
#include "reduce_test_util.hpp"

namespace cohort::reduce {
namespace reducer_test {

using testing::assign_leaves;
using testing::bitwise_equal;
using testing::Leaves;
using testing::run_step;
using testing::within_float64;

constexpr Strategy kAll[] = {Strategy::kTree,   Strategy::kChunkOwner, Strategy::kParameterServer,
                             Strategy::kAtomic, Strategy::kMutex,      Strategy::kSerial};

// Runs one step of `strategy` and checks it; the sink cycles through a result array, a chunk
// callback and a fused (sources) callback, and the scale between sum and mean.
void check_step(ThreadTeam& team, Strategy strategy, std::size_t workers, std::size_t leaves,
                std::size_t n, std::size_t arity, std::size_t chunk, std::uint64_t seed) {
  SCOPED_TRACE("strategy=" + std::string(to_string(strategy)) + " W=" + std::to_string(workers) +
               " L=" + std::to_string(leaves) + " n=" + std::to_string(n) +
               " arity=" + std::to_string(arity) + " seed=" + std::to_string(seed));
  ReducerConfig config;
  config.n = n;
  config.leaves = leaves;
  config.workers = workers;
  config.arity = arity;
  config.chunk = chunk;
  auto reducer = make_reducer(strategy, config, team);
  Leaves data(leaves, n, seed);
  std::mt19937_64 rng(seed);
  const float scale = (seed & 1) ? 1.0f / static_cast<float>(leaves) : 1.0f;
  AlignedBuffer<float> want(n);
  reference_reduce(reducer->shape(), data.pointers, n, want.data(), scale);

  AlignedBuffer<float> got(n);
  std::vector<int> coverage(n, 0);
  enum class Mode { kArray, kChunks, kFused };
  const Mode mode = static_cast<Mode>((seed >> 1) % 3);
  // Every strategy calls back on the chunk grid (the trainer keeps per-chunk state by index).
  auto on_grid = [&](std::size_t begin, std::size_t end) {
    EXPECT_EQ(begin % chunk, 0u) << "chunk [" << begin << ", " << end << ")";
    EXPECT_EQ(end, std::min(n, begin + chunk)) << "chunk [" << begin << ", " << end << ")";
  };
  auto callback = [&](const float* sum, std::size_t begin, std::size_t end) {
    on_grid(begin, end);
    for (std::size_t i = begin; i < end; ++i) {
      got[i] = sum[i];
      ++coverage[i];  // chunks are disjoint: distinct elements, no race
    }
  };
  // The fused callee sums the sources left to right itself and applies the mean, as the
  // trainer's optimizer does.
  auto fused = [&](const float* const* sources, std::size_t k, std::size_t begin, std::size_t end) {
    ASSERT_GE(k, 1u);
    on_grid(begin, end);
    std::vector<const float*> at(k);
    for (std::size_t j = 0; j < k; ++j) at[j] = sources[j] + begin;
    sum_sources(got.data() + begin, at.data(), k, end - begin, scale);
    for (std::size_t i = begin; i < end; ++i) ++coverage[i];
  };
  const Sink sink = mode == Mode::kArray    ? Sink::into(got.data(), scale)
                    : mode == Mode::kChunks ? Sink::chunks(callback, scale)
                                            : Sink::fused(fused);
  const auto plan = assign_leaves(leaves, workers, rng);
  const int completions = run_step(team, *reducer, data.pointers, plan, sink);
  ASSERT_TRUE(reducer->step_done());
  ASSERT_EQ(completions, strategy == Strategy::kParameterServer ? 0 : 1);
  if (mode != Mode::kArray) {
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(coverage[i], 1) << "element " << i;
  }
  if (mode == Mode::kChunks) {
    ASSERT_TRUE(bitwise_equal(reducer->sum(), got.data(), n));
  }
  if (is_deterministic(strategy)) {
    ASSERT_TRUE(bitwise_equal(want.data(), got.data(), n));
  }
  ASSERT_TRUE(within_float64(data.pointers, n, got.data(), scale));
}

class StrategyByWorkers : public ::testing::TestWithParam<std::tuple<Strategy, std::size_t>> {};

TEST_P(StrategyByWorkers, SmallSizesAllLeafCounts) {
  const auto [strategy, workers] = GetParam();
  const std::uint64_t seed = 1000 + workers;
  std::printf("seed=%llu\n", static_cast<unsigned long long>(seed));
  ThreadTeam team(workers);
  std::uint64_t step = 0;
  for (std::size_t leaves = 1; leaves <= 33; ++leaves) {
    for (std::size_t n : {0, 1, 15, 16, 17, 63, 64, 65}) {
      const std::size_t arity = (leaves + n) % 3 == 0 ? 5 : 2;
      check_step(team, strategy, workers, leaves, n, arity, 16, seed * 100000 + step++);
      if (HasFatalFailure()) return;
    }
  }
}

TEST_P(StrategyByWorkers, Size4097) {
  const auto [strategy, workers] = GetParam();
  const std::uint64_t seed = 2000 + workers;
  std::printf("seed=%llu\n", static_cast<unsigned long long>(seed));
  ThreadTeam team(workers);
  std::uint64_t step = 0;
  for (std::size_t leaves : {1, 2, 3, 7, 16, 33}) {
    for (std::size_t arity : {2, 4}) {
      check_step(team, strategy, workers, leaves, 4097, arity, 1024, seed * 100000 + step++);
      if (HasFatalFailure()) return;
    }
  }
}

std::string param_name(const ::testing::TestParamInfo<std::tuple<Strategy, std::size_t>>& info) {
  return std::string(to_string(std::get<0>(info.param))) + "_W" +
         std::to_string(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(Reduce, StrategyByWorkers,
                         ::testing::Combine(::testing::ValuesIn(kAll),
                                            ::testing::Values(1, 2, 3, 4, 5, 7, 8, 16)),
                         param_name);

class StrategyBig : public ::testing::TestWithParam<Strategy> {};

// 2^20 + 3 floats (4 MiB + 12 bytes): chunks through the executor with an uneven last chunk.
TEST_P(StrategyBig, OneMebiPlusThree) {
  const Strategy strategy = GetParam();
  const std::uint64_t seed = 3000;
  std::printf("seed=%llu\n", static_cast<unsigned long long>(seed));
  const std::size_t n = (std::size_t{1} << 20) + 3;
  std::uint64_t step = 0;
  const bool cheap = is_deterministic(strategy);  // atomic/mutex are slow under TSan: fewer runs
  for (std::size_t workers : {std::size_t{3}, std::size_t{16}}) {
    if (!cheap && workers == 16) continue;
    ThreadTeam team(workers);
    for (std::size_t leaves : {std::size_t{3}, std::size_t{9}}) {
      if (!cheap && leaves == 9) continue;
      check_step(team, strategy, workers, leaves, n, leaves == 9 ? 4 : 2, 16384,
                 seed * 100 + step++);
      if (HasFatalFailure()) return;
    }
  }
}

std::string strategy_name(const ::testing::TestParamInfo<Strategy>& param) {
  return std::string(to_string(param.param));
}

INSTANTIATE_TEST_SUITE_P(Reduce, StrategyBig, ::testing::ValuesIn(kAll), strategy_name);

// Fewer threads than workers: one thread plays all W workers in a random order. Nothing blocks
// (chunk-owner's finish only waits for leaves, and all were contributed first).
TEST(Reducer, OneThreadDrivesSixteenWorkers) {
  const std::uint64_t seed = 4000;
  std::printf("seed=%llu\n", static_cast<unsigned long long>(seed));
  InlineExecutor inline_executor;
  for (Strategy strategy : kAll) {
    ReducerConfig config{.n = 1000, .leaves = 21, .workers = 16, .arity = 3, .chunk = 64};
    auto reducer = make_reducer(strategy, config, inline_executor);
    Leaves data(config.leaves, config.n, seed);
    AlignedBuffer<float> want(config.n), got(config.n);
    reference_reduce(reducer->shape(), data.pointers, config.n, want.data());
    std::mt19937_64 rng(seed);
    for (int step = 0; step < 5; ++step) {
      reducer->begin_step(Sink::into(got.data()));
      const auto plan = assign_leaves(config.leaves, config.workers, rng);
      for (std::size_t w = 0; w < config.workers; ++w) {
        for (std::size_t leaf : plan[w]) reducer->contribute(w, leaf, data.pointers[leaf]);
      }
      for (std::size_t w = 0; w < config.workers; ++w) reducer->finish(w);
      reducer->wait_step();
      if (is_deterministic(strategy)) {
        ASSERT_TRUE(bitwise_equal(want.data(), got.data(), config.n)) << to_string(strategy);
      }
      ASSERT_TRUE(within_float64(data.pointers, config.n, got.data(), 1.0f));
    }
  }
}

// The tree's step completes in exactly the call that delivers the last leaf.
TEST(Reducer, TreeCompletesOnTheLastContribution) {
  InlineExecutor ex;
  ReducerConfig config{.n = 40, .leaves = 6, .workers = 2, .arity = 2, .chunk = 16};
  auto tree = make_reducer(Strategy::kTree, config, ex);
  Leaves data(6, 40, 7);
  AlignedBuffer<float> got(40);
  tree->begin_step(Sink::into(got.data()));
  for (std::size_t leaf : {5, 0, 3, 1, 4})
    EXPECT_FALSE(tree->contribute(leaf % 2, leaf, data.pointers[leaf]));
  EXPECT_FALSE(tree->step_done());
  EXPECT_TRUE(tree->contribute(0, 2, data.pointers[2]));
  EXPECT_TRUE(tree->step_done());
}

// reset() abandons a half-done step; the next full step is still exact.
TEST(Reducer, ResetAfterAbandonedStep) {
  InlineExecutor ex;
  for (Strategy strategy : kAll) {
    if (strategy == Strategy::kParameterServer) continue;  // its server would finish the step
    ReducerConfig config{.n = 100, .leaves = 7, .workers = 3, .arity = 2, .chunk = 32};
    auto reducer = make_reducer(strategy, config, ex);
    Leaves data(7, 100, 9);
    AlignedBuffer<float> want(100), got(100);
    reference_reduce(reducer->shape(), data.pointers, 100, want.data());
    reducer->begin_step(Sink::into(got.data()));
    for (std::size_t leaf : {0, 1, 2, 3}) reducer->contribute(0, leaf, data.pointers[leaf]);
    reducer->reset();
    reducer->begin_step(Sink::into(got.data()));
    for (std::size_t leaf = 0; leaf < 7; ++leaf) reducer->contribute(1, leaf, data.pointers[leaf]);
    for (std::size_t w = 0; w < 3; ++w) reducer->finish(w);
    ASSERT_TRUE(reducer->step_done()) << to_string(strategy);
    if (is_deterministic(strategy)) {
      EXPECT_TRUE(bitwise_equal(want.data(), got.data(), 100)) << to_string(strategy);
    }
    EXPECT_TRUE(within_float64(data.pointers, 100, got.data(), 1.0f)) << to_string(strategy);
  }
}

// A worker that fails before contributing its leaves: abort_step releases every finish() that
// waits for them (chunk-owner blocks there), nothing completes, and after reset() the next step
// is exact. Two threads: worker 0 contributes half the leaves and waits in finish; worker 1 fails.
TEST(Reducer, AbortReleasesWaitingWorkers) {
  for (Strategy strategy : kAll) {
    SCOPED_TRACE(std::string(to_string(strategy)));
    ThreadTeam team(2);
    ReducerConfig config{.n = 100, .leaves = 6, .workers = 2, .arity = 6, .chunk = 32};
    auto reducer = make_reducer(strategy, config, team);
    Leaves data(6, 100, 11);
    AlignedBuffer<float> want(100), got(100);
    reference_reduce(reducer->shape(), data.pointers, 100, want.data());
    std::atomic<int> completions{0};
    reducer->begin_step(Sink::into(got.data()));
    team.run([&](std::size_t w) {
      if (w == 0) {
        for (std::size_t leaf : {0, 1, 2})
          completions += reducer->contribute(0, leaf, data.pointers[leaf]);
        completions += reducer->finish(0);  // chunk-owner: waits here until the abort
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        reducer->abort_step();  // worker 1 failed: leaves 3..5 never come
      }
    });
    EXPECT_EQ(completions.load(), 0);
    EXPECT_FALSE(reducer->step_done());
    reducer->reset();
    const auto plan = std::vector<std::vector<std::size_t>>{{0, 2, 4}, {5, 3, 1}};
    run_step(team, *reducer, data.pointers, plan, Sink::into(got.data()));
    ASSERT_TRUE(reducer->step_done());
    EXPECT_TRUE(within_float64(data.pointers, 100, got.data(), 1.0f));
    if (is_deterministic(strategy)) {
      EXPECT_TRUE(bitwise_equal(want.data(), got.data(), 100));
    }
  }
}

// The root's callback throws: the exception surfaces once (from the contribute or finish call
// that ran it, or from wait_step for the parameter server, whose thread must not die), and after
// reset() the same reducer runs an exact step.
TEST(Reducer, ThrowingRootSurfacesOnceAndResets) {
  InlineExecutor ex;
  for (Strategy strategy : kAll) {
    SCOPED_TRACE(std::string(to_string(strategy)));
    ReducerConfig config{.n = 100, .leaves = 4, .workers = 1, .arity = 4, .chunk = 32};
    auto reducer = make_reducer(strategy, config, ex);
    Leaves data(4, 100, 13);
    AlignedBuffer<float> want(100), got(100);
    reference_reduce(reducer->shape(), data.pointers, 100, want.data());
    auto throwing = [](const float* const*, std::size_t, std::size_t begin, std::size_t) {
      if (begin == 32) throw std::runtime_error("root failed");
    };
    int thrown = 0;
    auto count = [&](auto&& call) {
      try {
        call();
      } catch (const std::runtime_error& e) {
        EXPECT_STREQ(e.what(), "root failed");
        ++thrown;
      }
    };
    reducer->begin_step(Sink::fused(throwing));
    for (std::size_t leaf = 0; leaf < 4; ++leaf)
      count([&] { reducer->contribute(0, leaf, data.pointers[leaf]); });
    if (thrown == 0) count([&] { reducer->finish(0); });
    if (thrown == 0) count([&] { reducer->wait_step(); });  // the step completed, or it threw
    EXPECT_EQ(thrown, 1);
    reducer->reset();
    reducer->begin_step(Sink::into(got.data()));
    for (std::size_t leaf = 0; leaf < 4; ++leaf) reducer->contribute(0, leaf, data.pointers[leaf]);
    reducer->finish(0);
    reducer->wait_step();
    EXPECT_TRUE(within_float64(data.pointers, 100, got.data(), 1.0f));
    if (is_deterministic(strategy)) {
      EXPECT_TRUE(bitwise_equal(want.data(), got.data(), 100));
    }
  }
}

TEST(Reducer, DoubleContributionIsCaught) {
  InlineExecutor ex;
  ReducerConfig config{.n = 8, .leaves = 4, .workers = 1, .arity = 2, .chunk = 16};
  auto tree = make_reducer(Strategy::kTree, config, ex);
  Leaves data(4, 8, 1);
  tree->begin_step(Sink::into(nullptr));
  tree->contribute(0, 0, data.pointers[0]);
  tree->contribute(0, 1, data.pointers[1]);
  EXPECT_THROW(tree->contribute(0, 1, data.pointers[1]), InternalError);
}

TEST(Reducer, ValidationNamesTheField) {
  InlineExecutor ex;
  auto expect_field = [&](ReducerConfig c, const char* field) {
    try {
      make_reducer(Strategy::kTree, c, ex);
      ADD_FAILURE() << "no error for " << field;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  expect_field({.n = 1, .leaves = 0}, "leaves");
  expect_field({.n = 1, .leaves = 1, .workers = 0}, "workers");
  expect_field({.n = 1, .leaves = 2, .workers = 1, .arity = 1}, "arity");
  expect_field({.n = 1, .leaves = 2, .workers = 1, .arity = 65}, "arity");
  expect_field({.n = 1, .leaves = 2, .workers = 1, .arity = 2, .chunk = 10}, "chunk");
  EXPECT_EQ(parse_strategy("chunk_owner"), Strategy::kChunkOwner);
  EXPECT_THROW(parse_strategy("ring"), InputError);
}

}  // namespace reducer_test
}  // namespace cohort::reduce
