// Every reducer strategy in the trainer, in every root mode (fused or two-phase, batch or leaf
// weight gradients): the deterministic strategies give the combining tree's one-worker weights
// bit for bit for every worker count; atomic and mutex (arrival order) train to the same losses
// within rounding; a failing replica never deadlocks a strategy that waits (chunk-owner) and
// leaves the weights as before the step. Seed 21, printed.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <stdexcept>
#include <string>
#include <tuple>

#include "cohort/core/error.hpp"
#include "cohort/train/trainer.hpp"
#include "train_test_util.hpp"

namespace cohort::train {
namespace strategy_test {

using reduce::Strategy;
using testing::fixture;
using testing::Recorder;
using WeightGrads = TrainConfig::WeightGrads;

constexpr std::uint64_t kSeed = 21;
constexpr Strategy kAll[] = {Strategy::kTree,   Strategy::kChunkOwner, Strategy::kParameterServer,
                             Strategy::kAtomic, Strategy::kMutex,      Strategy::kSerial};
constexpr std::size_t kSteps = 12;

enum class RootMode { kFused, kTwoPhase };

// 8 leaves of 8 rows per step: enough leaves that arrival order changes a float sum.
TrainConfig strategy_config(Strategy strategy, RootMode root, WeightGrads grads,
                            std::size_t workers) {
  TrainConfig c;
  c.model = "mlp:784-48-10";
  c.batch = 64;
  c.micro_batch = 8;
  c.steps = kSteps;
  c.seed = kSeed;
  c.workers = workers;
  c.reducer = strategy;
  c.weight_grads = grads;
  c.optimizer.lr = 0.05f;
  c.schedule = {.kind = optim::ScheduleKind::kConstant, .warmup_steps = 0};  // a plain rate
  if (root == RootMode::kTwoPhase) c.clip_norm = 0.5f;  // small enough to clip some steps
  return c;
}

using Case = std::tuple<Strategy, RootMode, WeightGrads>;

class Strategies : public ::testing::TestWithParam<Case> {};

TEST_P(Strategies, TrainAndKeepTheReproducibilityPromise) {
  const auto [strategy, root, grads] = GetParam();
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  Recorder tree_rec;
  const Summary tree =
      Trainer(strategy_config(Strategy::kTree, root, grads, 1), fixture()).run(tree_rec);
  ASSERT_EQ(tree_rec.losses.size(), kSteps);
  // It learns (more slowly when clipped to a norm of 0.5).
  EXPECT_LT(tree_rec.losses.back(),
            (root == RootMode::kFused ? 0.8 : 0.9) * tree_rec.losses.front());
  for (std::size_t workers : {1, 2, 3}) {
    SCOPED_TRACE("workers " + std::to_string(workers));
    Recorder rec;
    const Summary s = Trainer(strategy_config(strategy, root, grads, workers), fixture()).run(rec);
    ASSERT_EQ(rec.losses.size(), kSteps);
    if (reduce::is_deterministic(strategy)) {
      EXPECT_EQ(s.weights_digest, tree.weights_digest);
      EXPECT_EQ(rec.losses, tree_rec.losses);
    } else {
      for (std::size_t i = 0; i < kSteps; ++i)
        EXPECT_NEAR(rec.losses[i], tree_rec.losses[i], 1e-3 * tree_rec.losses[i]) << "step " << i;
    }
    if (root == RootMode::kTwoPhase) {
      for (const StepEvent& e : rec.steps) EXPECT_TRUE(std::isfinite(e.grad_norm));
    }
  }
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const auto [strategy, root, grads] = info.param;
  return std::string(reduce::to_string(strategy)) +
         (root == RootMode::kFused ? "_fused_" : "_twophase_") +
         std::string(name_of(TrainConfig::kWeightGradsNames, grads));
}

INSTANTIATE_TEST_SUITE_P(
    Trainer, Strategies,
    ::testing::Combine(::testing::ValuesIn(kAll),
                       ::testing::Values(RootMode::kFused, RootMode::kTwoPhase),
                       ::testing::Values(WeightGrads::kBatch, WeightGrads::kLeaf)),
    case_name);

// The two-phase root with a clip that never binds applies exactly what the fused root applies.
TEST(TwoPhaseRoot, WithAnUnlimitedClipEqualsTheFusedRootBitForBit) {
  for (WeightGrads grads : {WeightGrads::kBatch, WeightGrads::kLeaf}) {
    SCOPED_TRACE(std::string(name_of(TrainConfig::kWeightGradsNames, grads)));
    Recorder fused_rec, two_rec;
    const Summary fused =
        Trainer(strategy_config(Strategy::kTree, RootMode::kFused, grads, 2), fixture())
            .run(fused_rec);
    TrainConfig c = strategy_config(Strategy::kTree, RootMode::kTwoPhase, grads, 2);
    c.clip_norm = 1e30f;
    const Summary two = Trainer(c, fixture()).run(two_rec);
    ASSERT_EQ(fused_rec.losses.size(), kSteps);
    ASSERT_EQ(two_rec.losses.size(), kSteps);
    EXPECT_EQ(two.weights_digest, fused.weights_digest);
    EXPECT_EQ(two_rec.losses, fused_rec.losses);
  }
}

class FailingReplica : public ::testing::TestWithParam<Strategy> {};

// A replica throws in step 3: the step surfaces once, the weights are those after step 2, and the
// same trainer runs again — for every strategy (chunk-owner's waiting finish must be released).
TEST_P(FailingReplica, LeavesTheWeightsAsBeforeTheStepAndTheTrainerRunsAgain) {
  TrainConfig c = strategy_config(GetParam(), RootMode::kFused, WeightGrads::kBatch, 2);
  c.steps = 2;
  Recorder clean;
  const std::string after_two = Trainer(c, fixture()).run(clean).weights_digest;
  c.steps = 4;
  std::atomic<int> thrown{0};
  c.leaf_hook = [&](std::uint64_t step, std::size_t leaf) {
    if (step == 3 && leaf == 6 && thrown.fetch_add(1) == 0) throw std::runtime_error("injected");
  };
  Trainer t(c, fixture());
  Recorder rec;
  try {
    t.run(rec);
    FAIL() << "the injected failure did not surface";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("step 3: injected"), std::string::npos) << e.what();
  }
  EXPECT_EQ(thrown.load(), 1);
  ASSERT_EQ(rec.losses.size(), 2u);
  EXPECT_EQ(weights_digest(t.weights(), t.model().layout().total()), after_two);
  Recorder again;
  const Summary s = t.run(again);
  EXPECT_EQ(s.steps, 4u);
  ASSERT_EQ(again.losses.size(), 2u);
  EXPECT_TRUE(std::isfinite(again.losses.back()));
}

std::string strategy_name(const ::testing::TestParamInfo<Strategy>& info) {
  return std::string(reduce::to_string(info.param));
}

INSTANTIATE_TEST_SUITE_P(Trainer, FailingReplica, ::testing::ValuesIn(kAll), strategy_name);

}  // namespace strategy_test
}  // namespace cohort::train
