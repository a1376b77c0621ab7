// Stress: 10^4 tree steps (and 10^3 per other deterministic strategy) on an oversubscribed team
// (8 threads on 2 cores), random delays and arrival orders; workers rewrite their leaves every
// step, so a stale or unpublished read shows up as a mismatch. No hang, no mismatch.
#include <gtest/gtest.h>

#include "reduce_test_util.hpp"

namespace cohort::reduce {
namespace stress_test {

using testing::bitwise_equal;

void stress(Strategy strategy, int steps, std::size_t arity) {
  const std::uint64_t seed = 5000 + static_cast<std::uint64_t>(strategy);
  std::printf("seed=%llu strategy=%s steps=%d\n", static_cast<unsigned long long>(seed),
              std::string(to_string(strategy)).c_str(), steps);
  const std::size_t workers = 8;
  ReducerConfig config{.n = 67, .leaves = 13, .workers = workers, .arity = arity, .chunk = 16};
  ThreadTeam team(workers);
  auto reducer = make_reducer(strategy, config, team);
  testing::Leaves base(config.leaves, config.n, seed);
  std::vector<AlignedBuffer<float>> leaf(config.leaves);
  std::vector<const float*> pointers;
  for (auto& b : leaf) {
    b = AlignedBuffer<float>(config.n);
    pointers.push_back(b.data());
  }
  AlignedBuffer<float> want(config.n), got(config.n);
  std::mt19937_64 rng(seed);
  for (int step = 0; step < steps; ++step) {
    const float factor = static_cast<float>(step % 5 + 1);
    const auto plan = testing::assign_leaves(config.leaves, workers, rng);
    reducer->begin_step(Sink::into(got.data()));
    team.run([&](std::size_t w) {
      std::mt19937_64 delay(seed + static_cast<std::uint64_t>(step) * 131 + w);
      for (std::size_t l : plan[w]) {
        float* g = leaf[l].data();  // the worker produces the leaf right before contributing it
        for (std::size_t i = 0; i < config.n; ++i) g[i] = base.pointers[l][i] * factor;
        const auto r = delay() % 32;
        if (r == 0) std::this_thread::sleep_for(std::chrono::microseconds(delay() % 20));
        if (r < 8) std::this_thread::yield();
        reducer->contribute(w, l, g);
      }
      reducer->finish(w);
    });
    reducer->wait_step();
    reference_reduce(reducer->shape(), pointers, config.n, want.data());
    ASSERT_TRUE(bitwise_equal(want.data(), got.data(), config.n)) << "step " << step;
  }
}

TEST(Stress, TreeBinaryTenThousandSteps) { stress(Strategy::kTree, 10000, 2); }
TEST(Stress, TreeArity4) { stress(Strategy::kTree, 2000, 4); }
TEST(Stress, ChunkOwner) { stress(Strategy::kChunkOwner, 1000, 2); }
TEST(Stress, ParameterServer) { stress(Strategy::kParameterServer, 1000, 2); }
TEST(Stress, Serial) { stress(Strategy::kSerial, 1000, 2); }

}  // namespace stress_test
}  // namespace cohort::reduce
