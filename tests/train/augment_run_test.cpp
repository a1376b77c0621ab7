// --augment in the trainer: the augmented images are keyed by (seed, epoch, sample), so a run
// gives the same weights for every worker count and rank split, a resumed run is bit for bit the
// uninterrupted one, and every operation changes what is learned; evaluation rows get the
// normalization only; tabular data and bad specs are refused naming --augment.
#include <gtest/gtest.h>

#include <cstdio>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cohort/checkpoint/checkpoint.hpp"
#include "cohort/core/error.hpp"
#include "cohort/data/augment.hpp"
#include "cohort/nn/net.hpp"
#include "cohort/train/trainer.hpp"
#include "thread_comm.hpp"
#include "train_test_util.hpp"

namespace cohort::train {
namespace augment_run_test {

using checkpoint::decode_checkpoint;
using checkpoint::encode_checkpoint;
using testing::fixture;
using testing::Recorder;

constexpr const char* kAll = "crop:4,flip,erase:0.5,normalize";

TrainConfig augment_config(const std::string& model, const std::string& augment,
                           std::size_t workers) {
  TrainConfig c;
  c.model = model;
  c.augment = augment;
  c.batch = 64;
  c.micro_batch = 16;
  c.workers = workers;
  c.seed = 3;
  c.steps = 20;  // 2.5 epochs of the fixture's 512 images: epochs 0, 1 and 2 draw
  return c;
}

struct RunResult {
  Summary summary;
  std::vector<double> losses;
};

RunResult run_one(const TrainConfig& c, dist::Comm* comm = nullptr) {
  Trainer t(c, fixture(), comm);
  Recorder rec;
  RunResult r{t.run(rec), rec.losses};
  return r;
}

struct Case {
  const char* name;  // the test's parameter name
  const char* model;
  std::size_t workers;
};

void PrintTo(const Case& k, std::ostream* os) { *os << k.model << ", " << k.workers << " workers"; }

class AugmentWorkers : public ::testing::TestWithParam<Case> {};

TEST_P(AugmentWorkers, GiveTheOneWorkerWeightsAndLosses) {
  const Case& k = GetParam();
  std::printf("seed 3, --augment %s, %s\n", kAll, k.model);
  const RunResult one = run_one(augment_config(k.model, kAll, 1));
  const RunResult many = run_one(augment_config(k.model, kAll, k.workers));
  EXPECT_EQ(many.summary.weights_digest, one.summary.weights_digest);
  EXPECT_EQ(many.losses, one.losses);
  EXPECT_EQ(many.summary.test_loss, one.summary.test_loss);
}

INSTANTIATE_TEST_SUITE_P(AugmentRun, AugmentWorkers,
                         ::testing::Values(Case{"MlpW2", "mlp:784-512-256-10", 2},
                                           Case{"MlpW3", "mlp:784-512-256-10", 3},
                                           Case{"CnnW3", "cnn", 3}),
                         [](const ::testing::TestParamInfo<Case>& p) {
                           return std::string(p.param.name);
                         });

// Two ranks: each assembles its own leaves, and (batch weight gradients) the other rank's rows
// too, in 32-row pieces between message progress calls; the images are the same.
TEST(AugmentRun, TwoRanksGiveTheOneProcessWeights) {
  const TrainConfig c = augment_config("mlp:784-512-256-10", kAll, 1);
  const RunResult one = run_one(c);
  testing::ThreadWorld world(2);
  std::vector<RunResult> out(2);
  std::vector<std::exception_ptr> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      try {
        testing::ThreadComm comm(world, r);
        out[static_cast<std::size_t>(r)] = run_one(c, &comm);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  for (const RunResult& r : out) {
    EXPECT_EQ(r.summary.weights_digest, one.summary.weights_digest);
    EXPECT_EQ(r.losses, one.losses);
  }
}

// A run resumed mid-epoch redraws the images of the steps it continues with: epoch and sample
// come from the step, never from the position since the resume.
TEST(AugmentRun, ResumedMidEpochIsBitwiseTheUninterruptedRun) {
  std::printf("seed 3, --augment %s\n", kAll);
  const RunResult whole = run_one(augment_config("mlp:784-512-256-10", kAll, 2));
  TrainConfig first_half = augment_config("mlp:784-512-256-10", kAll, 1);
  first_half.steps = 11;  // epoch 1, step 3 of 8
  Trainer b(first_half, fixture());
  Recorder first;
  b.run(first);
  const auto bytes = encode_checkpoint(b.checkpoint("{}"));
  Trainer c(augment_config("mlp:784-512-256-10", kAll, 3), fixture());
  c.restore(decode_checkpoint(bytes, "mem"), "mem");
  Recorder second;
  const Summary resumed = c.run(second);
  EXPECT_EQ(resumed.steps, 20u);
  EXPECT_EQ(resumed.weights_digest, whole.summary.weights_digest);
  first.losses.insert(first.losses.end(), second.losses.begin(), second.losses.end());
  EXPECT_EQ(first.losses, whole.losses);
}

// Each operation alone, and all of them, train to other weights than no augmentation (and than
// each other): none of them is silently dropped on the way to the staged batch.
TEST(AugmentRun, EveryOperationChangesTheWeights) {
  std::set<std::string> digests;
  const std::vector<std::string> specs{"", "crop:4", "flip", "erase:0.5", "normalize", kAll};
  for (const std::string& spec : specs) {
    TrainConfig c = augment_config("mlp:784-512-256-10", spec, 2);
    c.steps = 4;
    const std::string digest = run_one(c).summary.weights_digest;
    EXPECT_TRUE(digests.insert(digest).second) << "'" << spec << "' gave a digest seen before";
  }
}

// Evaluation rows get normalize and nothing random: the same weights evaluate alike with and
// without crop, flip and erase, and differently with normalize.
TEST(AugmentRun, EvaluationAppliesNormalizeOnly) {
  TrainConfig c = augment_config("mlp:784-512-256-10", "", 2);
  c.steps = 8;
  Trainer trained(c, fixture());
  Recorder rec;
  trained.run(rec);
  const auto bytes = encode_checkpoint(trained.checkpoint("{}"));
  auto evaluated = [&](const std::string& augment) {
    TrainConfig e = c;
    e.augment = augment;
    Trainer t(e, fixture());
    t.restore(decode_checkpoint(bytes, "mem"), "mem");
    return t.evaluate_test();
  };
  const auto plain = evaluated("");
  EXPECT_EQ(evaluated("crop:4,flip,erase:1"), plain);
  EXPECT_NE(evaluated("normalize").first, plain.first);
  EXPECT_EQ(evaluated("normalize"), evaluated("crop:2,normalize,flip"));
}

TEST(AugmentRun, BadSpecAndTabularDataAreRefusedNamingTheFlag) {
  try {
    Trainer t(augment_config("mlp:784-512-256-10", "crop:x", 1), fixture());
    FAIL() << "crop:x accepted";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("--augment: expected crop:P", 0), 0u) << e.what();
  }
  data::Splits tabular = fixture();
  for (data::Dataset* set : {&tabular.train, &tabular.test}) {
    set->tabular = true;
    set->rows = 1;
    set->cols = 784;
  }
  EXPECT_NO_THROW(Trainer(augment_config("mlp:784-10", "", 1), tabular));
  try {
    Trainer t(augment_config("mlp:784-10", "flip", 1), tabular);
    FAIL() << "flip accepted on tabular data";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("--augment: expected no augmentation on tabular data", 0),
              0u)
        << e.what();
  }
}

}  // namespace augment_run_test
}  // namespace cohort::train

namespace cohort::train {
namespace augment_run_test {

// The trainer keys the draws by the step's epoch: the loss of the first step of epoch 1 equals a
// Net's loss on the rows an Augmenter assembles for epoch 1 (from the weights after epoch 0), and
// not on those it assembles for epoch 0 (which a trainer that passed a constant epoch would use).
TEST(AugmentEpoch, TheSecondEpochsFirstStepReadsEpochOnesImages) {
  TrainConfig c = augment_config("mlp:784-32-10", "crop:4,flip,erase:0.5", 1);
  c.micro_batch = c.batch;  // one leaf: the step's loss is that leaf's
  const std::size_t per_epoch = fixture().train.count / c.batch;
  c.steps = per_epoch;
  Trainer first(c, fixture());
  Recorder before;
  first.run(before);
  const auto saved = decode_checkpoint(encode_checkpoint(first.checkpoint("{}")), "mem");
  c.steps = per_epoch + 1;
  Trainer second(c, fixture());
  second.restore(saved, "mem");
  Recorder after;
  second.run(after);
  ASSERT_EQ(after.losses.size(), 1u);

  const nn::Model& model = first.model();
  std::vector<float> weights(first.weights(), first.weights() + model.layout().total());
  const std::vector<std::uint32_t> order =
      data::Sampler(fixture().train.count, c.seed).epoch_order(1);
  const auto ids = std::span(order).first(c.batch);
  const data::Augmenter augmenter(data::parse_augment(c.augment), fixture().train, c.seed);
  nn::Net net(model);
  std::vector<float> grad(model.layout().total());
  std::vector<float> x(c.batch * static_cast<std::size_t>(model.input_features()));
  std::vector<std::int32_t> y(c.batch);
  auto loss_of_epoch = [&](std::uint64_t epoch) {
    augmenter.assemble(fixture().train, ids, epoch, /*train=*/true, x.data(), y.data());
    return net.forward_backward(weights.data(), x.data(), y.data(),
                                static_cast<std::int64_t>(c.batch), grad.data()) /
           static_cast<double>(c.batch);
  };
  EXPECT_EQ(after.losses[0], loss_of_epoch(1));
  EXPECT_NE(after.losses[0], loss_of_epoch(0));
}

}  // namespace augment_run_test
}  // namespace cohort::train
