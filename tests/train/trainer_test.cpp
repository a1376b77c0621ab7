// Trainer end to end on the Fashion-MNIST fixture: it learns, it is reproducible from the seed,
// and its result does not depend on the number of workers.
#include "cohort/train/trainer.hpp"

#include <gtest/gtest.h>

#include "cohort/core/error.hpp"

namespace cohort::train {
namespace {

const data::Splits& fixture() {
  static const data::Splits splits = data::load_image_folder(COHORT_FIXTURE_DIR);
  return splits;
}

class Recorder : public Observer {
 public:
  void on_step(const StepEvent& e) override { losses.push_back(e.loss); }
  void on_epoch(const EpochResult& r) override { epochs.push_back(r); }
  std::vector<double> losses;
  std::vector<EpochResult> epochs;
};

TrainConfig small_config() {
  TrainConfig c;
  c.model = "mlp:784-64-10";
  c.batch = 32;
  c.micro_batch = 8;
  c.workers = 1;
  c.epochs = 2;
  c.seed = 5;
  c.sgd.lr = 0.05f;
  return c;
}

TEST(Trainer, LossFallsOverAFewHundredSteps) {
  TrainConfig c = small_config();
  c.steps = 320;  // 20 epochs of the 512-image fixture (16 full batches each)
  std::printf("seed %llu\n", static_cast<unsigned long long>(c.seed));
  Trainer t(c, fixture());
  Recorder rec;
  Summary s = t.run(rec);
  ASSERT_EQ(rec.losses.size(), 320u);
  ASSERT_EQ(s.steps, 320u);
  double first = 0, last = 0;
  for (int i = 0; i < 16; ++i) {
    first += rec.losses[i] / 16;
    last += rec.losses[rec.losses.size() - 1 - i] / 16;
  }
  EXPECT_GT(first, 1.5);          // ~ln(10) at initialisation
  EXPECT_LT(last, 0.25 * first);  // it learns the training set
  EXPECT_GT(s.test_accuracy, 0.65);  // and generalises (256 held-out images)
  EXPECT_EQ(rec.epochs.size(), 20u);
}

TEST(Trainer, SameSeedSameDigestOtherSeedOtherDigest) {
  TrainConfig c = small_config();
  Recorder r1, r2, r3;
  Summary a = Trainer(c, fixture()).run(r1);
  Summary b = Trainer(c, fixture()).run(r2);
  c.seed = 6;
  Summary d = Trainer(c, fixture()).run(r3);
  EXPECT_EQ(a.weights_digest, b.weights_digest);
  EXPECT_EQ(r1.losses, r2.losses);
  EXPECT_NE(a.weights_digest, d.weights_digest);
  EXPECT_EQ(a.weights_digest.size(), 32u);
}

class WorkerCount : public ::testing::TestWithParam<std::size_t> {};

TEST_P(WorkerCount, WeightsAndLossesEqualTheOneWorkerRunBitForBit) {
  TrainConfig c = small_config();
  c.batch = 40;  // 512 = 12 * 40 + 32: the last batch of an epoch is partial (4 leaves)
  c.drop_last = false;
  Recorder one, many;
  Summary reference = Trainer(c, fixture()).run(one);
  c.workers = GetParam();
  Summary s = Trainer(c, fixture()).run(many);
  EXPECT_EQ(s.workers, GetParam());
  EXPECT_EQ(s.weights_digest, reference.weights_digest);
  EXPECT_EQ(many.losses, one.losses);
  EXPECT_EQ(s.test_accuracy, reference.test_accuracy);
}

INSTANTIATE_TEST_SUITE_P(Workers, WorkerCount, ::testing::Values(2, 3, 4, 5, 8));

TEST(Trainer, MicroBatchChangesTheSumOrderButNotTheMath) {
  // Different leaf sizes sum in different orders: results differ in the last bits only.
  TrainConfig c = small_config();
  c.steps = 5;
  Recorder r1, r2;
  Trainer a(c, fixture());
  a.run(r1);
  c.micro_batch = 32;
  Trainer b(c, fixture());
  b.run(r2);
  for (std::size_t i = 0; i < r1.losses.size(); ++i) EXPECT_NEAR(r1.losses[i], r2.losses[i], 1e-4);
}

TEST(Trainer, BadConfigsAreRefusedBeforeWork) {
  auto message_of = [](TrainConfig c) {
    try {
      Trainer t(c, fixture());
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  TrainConfig c = small_config();
  EXPECT_EQ(message_of(c), "accepted");
  c.batch = 0;
  EXPECT_NE(message_of(c).find("--batch"), std::string::npos);
  c = small_config();
  c.batch = 100000;
  EXPECT_NE(message_of(c).find("found 100000"), std::string::npos);
  c = small_config();
  c.micro_batch = 64;
  EXPECT_NE(message_of(c).find("--micro-batch"), std::string::npos);
  c = small_config();
  c.model = "mlp:100-10";
  EXPECT_NE(message_of(c).find("input size of 784"), std::string::npos);
  c = small_config();
  c.model = "mlp:784-7";
  EXPECT_NE(message_of(c).find("output size of 10"), std::string::npos);
  c = small_config();
  c.workers = 5000;
  EXPECT_NE(message_of(c).find("--workers"), std::string::npos);
  c = small_config();
  c.reducer = "magic";
  EXPECT_NE(message_of(c).find("magic"), std::string::npos);
  c = small_config();
  c.sgd.lr = -1;
  EXPECT_NE(message_of(c).find("lr"), std::string::npos);
}

}  // namespace
}  // namespace cohort::train
