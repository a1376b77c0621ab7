// --precision bf16 in the trainer: the promise is unchanged (the same bits for every worker
// count and every rank split), it trains like f32, checkpoints hold f32 master weights so a run
// resumes in either precision, and a CPU without native bf16 is refused unless emulation is asked.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "cohort/core/error.hpp"
#include "cohort/nn/version.hpp"
#include "cohort/train/trainer.hpp"
#include "thread_comm.hpp"
#include "train_test_util.hpp"

namespace cohort::train {
namespace precision_test {

using testing::fixture;
using testing::Recorder;

TrainConfig bf16_config(const std::string& model, std::size_t workers) {
  TrainConfig c;
  c.model = model;
  c.batch = 64;
  c.micro_batch = 8;
  c.workers = workers;
  c.steps = 10;
  c.seed = 21;
  c.optimizer.lr = 0.05f;
  c.schedule = {.kind = optim::ScheduleKind::kConstant, .warmup_steps = 0};  // a plain rate
  c.optimizer.momentum = 0.9f;
  c.precision = nn::Precision::kBf16;
  c.allow_emulated_bf16 = true;  // the bits are the same whether or not the CPU has it natively
  return c;
}

struct RunResult {
  Summary summary;
  std::vector<double> losses;
};

RunResult run(const TrainConfig& c, dist::Comm* comm = nullptr) {
  Trainer t(c, fixture(), comm);
  Recorder rec;
  RunResult r{t.run(rec), rec.losses};
  return r;
}

struct WorkerCase {
  std::string model;
  std::size_t workers;
  TrainConfig::WeightGrads weight_grads;
};
void PrintTo(const WorkerCase& k, std::ostream* os) { *os << k.model << " W" << k.workers; }

class Bf16Workers : public ::testing::TestWithParam<WorkerCase> {};

TEST_P(Bf16Workers, EqualTheOneWorkerRunBitForBit) {
  COHORT_SKIP_WITHOUT_BF16();
  const WorkerCase& k = GetParam();
  std::printf("seed 21, %s, %zu workers\n", k.model.c_str(), k.workers);
  TrainConfig one = bf16_config(k.model, 1), many = bf16_config(k.model, k.workers);
  one.weight_grads = many.weight_grads = k.weight_grads;
  const RunResult a = run(one), b = run(many);
  EXPECT_EQ(a.summary.weights_digest, b.summary.weights_digest);
  EXPECT_EQ(a.losses, b.losses);
  EXPECT_EQ(a.summary.test_accuracy, b.summary.test_accuracy);
  EXPECT_EQ(b.summary.precision, nn::Precision::kBf16);
}

std::string worker_case_name(const ::testing::TestParamInfo<WorkerCase>& info) {
  const WorkerCase& k = info.param;
  std::string model = k.model == "cnn" ? "cnn" : "mlp";
  return model + (k.weight_grads == TrainConfig::WeightGrads::kLeaf ? "_leaf" : "_batch") + "_W" +
         std::to_string(k.workers);
}

INSTANTIATE_TEST_SUITE_P(
    Precision, Bf16Workers,
    ::testing::Values(WorkerCase{"mlp:784-64-32-10", 2, TrainConfig::WeightGrads::kBatch},
                      WorkerCase{"mlp:784-64-32-10", 3, TrainConfig::WeightGrads::kBatch},
                      WorkerCase{"mlp:784-64-32-10", 3, TrainConfig::WeightGrads::kLeaf},
                      WorkerCase{"cnn", 2, TrainConfig::WeightGrads::kBatch},
                      WorkerCase{"cnn", 3, TrainConfig::WeightGrads::kLeaf}),
    worker_case_name);

// A batch of 61 rows in leaves of 8: the last leaf has 5 rows, so its last output-gradient row
// pairs with a zero (batch weight gradients on row pairs, nn/batch_grad.hpp). 2 workers and 2
// ranks (sending whole pairs) give the one worker's bits.
TEST(Bf16RowPairs, AnOddLastLeafGivesTheSameBitsOnAnyWorkersAndRanks) {
  COHORT_SKIP_WITHOUT_BF16();
  auto config = [](std::size_t workers) {
    TrainConfig c = bf16_config("mlp:784-64-32-10", workers);
    c.batch = 61;
    return c;
  };
  std::printf("seed 21, batch 61, micro-batch 8\n");
  const RunResult one = run(config(1)), two = run(config(2));
  EXPECT_EQ(two.summary.weights_digest, one.summary.weights_digest);
  EXPECT_EQ(two.losses, one.losses);
  testing::ThreadWorld world(2);
  std::vector<RunResult> got(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      testing::ThreadComm comm(world, r);
      got[static_cast<std::size_t>(r)] = run(config(1), &comm);
    });
  for (auto& t : threads) t.join();
  for (const RunResult& g : got) EXPECT_EQ(g.summary.weights_digest, one.summary.weights_digest);
}

// Several ranks (in-process, tests/train/thread_comm.hpp) in bf16: the received weights get their
// bf16 copy too, so every rank computes with the one process's weights.
TEST(Bf16Ranks, TwoAndThreeRanksEqualOneProcessBitForBit) {
  COHORT_SKIP_WITHOUT_BF16();
  for (const std::string model : {"mlp:784-64-32-10", "cnn"}) {
    const RunResult one = run(bf16_config(model, 1));
    for (int ranks : {2, 3}) {
      SCOPED_TRACE(model + ", " + std::to_string(ranks) + " ranks");
      testing::ThreadWorld world(ranks);
      std::vector<RunResult> got(static_cast<std::size_t>(ranks));
      std::vector<std::thread> threads;
      for (int r = 0; r < ranks; ++r)
        threads.emplace_back([&, r] {
          testing::ThreadComm comm(world, r);
          got[static_cast<std::size_t>(r)] = run(bf16_config(model, 1), &comm);
        });
      for (auto& t : threads) t.join();
      for (const RunResult& g : got) {
        EXPECT_EQ(g.summary.weights_digest, one.summary.weights_digest);
        EXPECT_EQ(g.losses, one.losses);
      }
    }
  }
}

// bf16 trains like f32: over 60 steps of the fixture the losses stay close (bf16 rounds the
// activations to 8 bits of mantissa; the weights and their updates stay f32).
TEST(Bf16Training, FollowsTheF32LossCurve) {
  COHORT_SKIP_WITHOUT_BF16();
  TrainConfig f32 = bf16_config("mlp:784-64-10", 1);
  f32.steps = 60;
  f32.precision = nn::Precision::kF32;
  TrainConfig b16 = f32;
  b16.precision = nn::Precision::kBf16;
  const RunResult a = run(f32), b = run(b16);
  ASSERT_EQ(a.losses.size(), b.losses.size());
  EXPECT_NE(a.summary.weights_digest, b.summary.weights_digest);  // it is not f32
  for (std::size_t i = 0; i < a.losses.size(); ++i)
    EXPECT_NEAR(b.losses[i], a.losses[i], 0.05 * a.losses[i]) << "step " << i + 1;
  EXPECT_LT(b.losses.back(), 0.6 * b.losses.front());
  EXPECT_NEAR(b.summary.test_accuracy, a.summary.test_accuracy, 0.05);
}

// Checkpoints hold the f32 master weights only: f32 -> bf16 -> f32 resumes, and the bf16 leg
// starts from exactly the f32 leg's weights.
TEST(Bf16Resume, F32ThenBf16ThenF32) {
  COHORT_SKIP_WITHOUT_BF16();
  TrainConfig c = bf16_config("mlp:784-64-10", 2);
  c.precision = nn::Precision::kF32;
  c.steps = 4;
  Trainer first(c, fixture());
  Recorder r1;
  first.run(r1);
  const checkpoint::Checkpoint a = first.checkpoint("{}");

  TrainConfig b16 = c;
  b16.precision = nn::Precision::kBf16;
  b16.steps = 8;
  Trainer second(b16, fixture());
  second.restore(a, "a.ckpt");
  EXPECT_EQ(weights_digest(second.weights(), second.model().layout().total()),
            weights_digest(first.weights(), first.model().layout().total()));
  Recorder r2;
  second.run(r2);
  ASSERT_EQ(r2.losses.size(), 4u);  // steps 5..8
  const checkpoint::Checkpoint b = second.checkpoint("{}");

  TrainConfig back = c;
  back.steps = 12;
  Trainer third(back, fixture());
  third.restore(b, "b.ckpt");
  Recorder r3;
  const Summary s = third.run(r3);
  ASSERT_EQ(r3.losses.size(), 4u);
  EXPECT_EQ(s.steps, 12u);
  for (double l : r3.losses) EXPECT_TRUE(std::isfinite(l));
  EXPECT_LT(r3.losses.back(), r1.losses.front());
}

// The refusal follows what oneDNN can do (injected): native runs; emulated only when asked;
// none (no AVX-512: oneDNN cannot create a bf16 primitive) never, and the message says why.
TEST(Bf16Refusal, ACpuWithoutNativeBf16IsRefusedUnlessEmulationIsAsked) {
  using nn::Bf16Support;
  TrainConfig c = bf16_config("mlp:784-64-10", 1);
  c.allow_emulated_bf16 = false;
  c.bf16_support = [] { return Bf16Support::kEmulated; };
  const nn::Model model = nn::Model::parse(c.model, input_shape(fixture().train));
  try {
    validate(c, model, fixture());
    FAIL() << "bf16 without AVX512_BF16 was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--precision bf16"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("AVX512_BF16"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--allow-emulated-bf16"), std::string::npos) << e.what();
  }
  c.allow_emulated_bf16 = true;
  EXPECT_NO_THROW(validate(c, model, fixture()));
  c.allow_emulated_bf16 = false;
  c.bf16_support = [] { return Bf16Support::kNative; };
  EXPECT_NO_THROW(validate(c, model, fixture()));
  c.precision = nn::Precision::kF32;
  c.bf16_support = [] { return Bf16Support::kNone; };
  EXPECT_NO_THROW(validate(c, model, fixture()));  // f32 needs no bf16
}

TEST(Bf16Refusal, NoBf16KernelsAreRefusedEvenWithEmulationAsked) {
  TrainConfig c = bf16_config("mlp:784-64-10", 1);
  c.bf16_support = [] { return nn::Bf16Support::kNone; };
  const nn::Model model = nn::Model::parse(c.model, input_shape(fixture().train));
  for (bool allow : {true, false}) {
    c.allow_emulated_bf16 = allow;
    try {
      validate(c, model, fixture());
      FAIL() << "bf16 without oneDNN bf16 kernels was accepted, --allow-emulated-bf16 " << allow;
    } catch (const InputError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("--precision bf16"), std::string::npos) << what;
      EXPECT_NE(what.find("AVX-512"), std::string::npos) << what;
      EXPECT_NE(what.find(nn::onednn_isa()), std::string::npos) << what;
      EXPECT_NE(what.find("--precision f32"), std::string::npos) << what;
    }
  }
}

// The probe agrees with what the Trainer can build: where it says bf16 runs, a bf16 step runs;
// where it says none, the Trainer refuses bf16 before building anything.
TEST(Bf16Refusal, TheProbeAgreesWithTheTrainer) {
  TrainConfig c = bf16_config("mlp:784-64-10", 1);
  c.steps = 1;
  std::printf("oneDNN dispatches %s, bf16 %s\n", nn::onednn_isa().c_str(),
              std::string(name_of(nn::kBf16SupportNames, nn::bf16_support())).c_str());
  if (nn::bf16_support() == nn::Bf16Support::kNone) {
    EXPECT_THROW(Trainer(c, fixture()), InputError);
  } else {
    EXPECT_EQ(run(c).losses.size(), 1u);
  }
}

}  // namespace precision_test
}  // namespace cohort::train
