// Trainer end to end on the Fashion-MNIST fixture: it learns, it is reproducible from the seed,
// and its result does not depend on the number of workers.
#include "cohort/train/trainer.hpp"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "cohort/core/error.hpp"
#include "cohort/nn/dropout.hpp"
#include "cohort/nn/model.hpp"
#include "train_test_util.hpp"

namespace cohort::train {
namespace trainer_test {

using testing::fixture;
using testing::Recorder;
using testing::worker_name;

TrainConfig small_config() {
  TrainConfig c;
  c.model = "mlp:784-64-10";
  c.batch = 32;
  c.micro_batch = 8;
  c.workers = 1;
  c.epochs = 2;
  c.seed = 5;
  c.optimizer.lr = 0.05f;
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
  EXPECT_GT(first, 1.5);             // ~ln(10) at initialisation
  EXPECT_LT(last, 0.25 * first);     // it learns the training set
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
  ASSERT_EQ(r1.losses.size(), 32u);  // 2 epochs of 16 batches
  ASSERT_EQ(r2.losses.size(), 32u);
  EXPECT_EQ(a.weights_digest, b.weights_digest);
  EXPECT_EQ(r1.losses, r2.losses);
  EXPECT_NE(a.weights_digest, d.weights_digest);
  EXPECT_EQ(a.weights_digest.size(), 32u);
}

class WorkerCount : public ::testing::TestWithParam<std::size_t> {};

constexpr TrainConfig::WeightGrads kModes[] = {TrainConfig::WeightGrads::kLeaf,
                                               TrainConfig::WeightGrads::kBatch};
const char* name(TrainConfig::WeightGrads m) {
  return m == TrainConfig::WeightGrads::kBatch ? "batch" : "leaf";
}

TEST_P(WorkerCount, WeightsAndLossesEqualTheOneWorkerRunBitForBit) {
  for (auto mode : kModes) {
    TrainConfig c = small_config();
    c.batch = 40;  // 512 = 12 * 40 + 32: the last batch of an epoch is partial (4 leaves)
    c.drop_last = false;
    c.weight_grads = mode;
    Recorder one, many;
    Summary reference = Trainer(c, fixture()).run(one);
    c.workers = GetParam();
    Summary s = Trainer(c, fixture()).run(many);
    ASSERT_EQ(one.losses.size(), 26u) << name(mode);  // 2 epochs of 13 batches
    ASSERT_EQ(many.losses.size(), 26u) << name(mode);
    EXPECT_EQ(s.workers, GetParam());
    EXPECT_EQ(s.weights_digest, reference.weights_digest) << name(mode);
    EXPECT_EQ(many.losses, one.losses) << name(mode);
    EXPECT_EQ(s.test_accuracy, reference.test_accuracy) << name(mode);
  }
}

INSTANTIATE_TEST_SUITE_P(Workers, WorkerCount, ::testing::Values(2, 3, 4, 5, 8), worker_name);

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
  ASSERT_EQ(r1.losses.size(), 5u);
  ASSERT_EQ(r2.losses.size(), 5u);
  for (std::size_t i = 0; i < r1.losses.size(); ++i)
    EXPECT_NEAR(r1.losses[i], r2.losses[i], 1e-4) << "step " << i + 1;
}

// The two places to compute linear layers' weight gradients sum the batch in different orders:
// the runs agree to rounding, not bit for bit.
TEST(Trainer, LeafAndBatchWeightGradientsAgreeToRounding) {
  TrainConfig c = small_config();
  c.steps = 5;
  c.weight_grads = TrainConfig::WeightGrads::kLeaf;
  Recorder leaf, batch;
  const Summary a = Trainer(c, fixture()).run(leaf);
  c.weight_grads = TrainConfig::WeightGrads::kBatch;
  const Summary b = Trainer(c, fixture()).run(batch);
  ASSERT_EQ(leaf.losses.size(), 5u);
  ASSERT_EQ(batch.losses.size(), 5u);
  for (std::size_t i = 0; i < leaf.losses.size(); ++i)
    EXPECT_NEAR(leaf.losses[i], batch.losses[i], 1e-4) << "step " << i + 1;
  EXPECT_NE(a.weights_digest, b.weights_digest);  // a different order, as documented
}

// Images with three channels (a (N, 3, H, W) .npy): the model's input is (C, H, W) from the data,
// so the first convolution has three input channels, and the run is reproducible across W.
TEST(Trainer, MultiChannelImagesTrainWithTheDatasChannels) {
  std::printf("seed 13\n");
  auto split = [](const char* name, std::size_t count, std::uint64_t seed) {
    data::Dataset d;
    d.name = name;
    d.count = count;
    d.channels = 3;
    d.rows = d.cols = 8;
    d.num_classes = 4;
    std::mt19937_64 rng(seed);
    d.images.resize(count * d.features());
    for (auto& p : d.images) p = static_cast<std::uint8_t>(rng() % 256);
    d.labels.resize(count);
    for (auto& l : d.labels) l = static_cast<std::uint32_t>(rng() % 4);
    return d;
  };
  const data::Splits data{split("train", 64, 13), split("test", 32, 14), {}};
  TrainConfig c;
  c.model = "conv(4,3)-relu-maxpool(2)-flatten-linear(4)";
  c.batch = 16;
  c.micro_batch = 4;
  c.steps = 8;
  c.seed = 13;
  c.workers = 1;
  Recorder one, two;
  Trainer t1(c, data);
  EXPECT_EQ(t1.model().layout().entries()[0].shape.str(), "(4, 3, 3, 3)");  // (OC, IC, KH, KW)
  const Summary a = t1.run(one);
  c.workers = 2;
  const Summary b = Trainer(c, data).run(two);
  ASSERT_EQ(one.losses.size(), 8u);
  ASSERT_EQ(two.losses.size(), 8u);
  EXPECT_EQ(one.losses, two.losses);
  EXPECT_EQ(a.weights_digest, b.weights_digest);
  for (double l : one.losses) EXPECT_TRUE(std::isfinite(l));
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
  c.optimizer.lr = -1;
  EXPECT_NE(message_of(c).find("lr"), std::string::npos);
}

TrainConfig engine_config(std::size_t workers,
                          TrainConfig::WeightGrads mode = TrainConfig::WeightGrads::kBatch) {
  TrainConfig c;  // the default MLP, batch 256, lr 0.05, momentum 0.9
  c.micro_batch = 32;
  c.weight_grads = mode;
  c.steps = 50;
  c.workers = workers;
  c.seed = 4;
  return c;
}

class EngineWorkers : public ::testing::TestWithParam<std::size_t> {};

TEST_P(EngineWorkers, DefaultMlpDigestAndLossesEqualOneWorker) {
  // Batch 256 in 8 leaves of 32, 50 steps: every worker count gives the 1-worker run's bits,
  // with weight gradients per leaf and over the batch.
  static std::map<TrainConfig::WeightGrads, std::pair<Summary, Recorder>> one;
  for (auto mode : kModes) {
    if (!one.count(mode)) {
      Recorder r;
      Summary s = Trainer(engine_config(1, mode), fixture()).run(r);
      one[mode] = {s, r};
    }
    std::printf("seed %llu, workers %zu, weight gradients %s\n", 4ull, GetParam(), name(mode));
    Recorder rec;
    Summary s = Trainer(engine_config(GetParam(), mode), fixture()).run(rec);
    EXPECT_EQ(s.steps, 50u);
    ASSERT_EQ(one[mode].second.losses.size(), 50u) << name(mode);
    ASSERT_EQ(rec.losses.size(), 50u) << name(mode);
    EXPECT_EQ(s.weights_digest, one[mode].first.weights_digest) << name(mode);
    EXPECT_EQ(rec.losses, one[mode].second.losses) << name(mode);
  }
}

INSTANTIATE_TEST_SUITE_P(Workers, EngineWorkers, ::testing::Values(1, 2, 3, 4, 8), worker_name);

TEST(Engine, ReplicaThreadsRunOpenMpWithOneThread) {
  TrainConfig c = engine_config(2);
  c.steps = 4;
  std::atomic<int> max_seen{0}, calls{0};
  c.leaf_hook = [&](std::uint64_t, std::size_t) {
    int t = omp_get_max_threads();
    int seen = max_seen.load(std::memory_order_relaxed);
    while (t > seen && !max_seen.compare_exchange_weak(seen, t, std::memory_order_relaxed)) {
    }
    calls.fetch_add(1, std::memory_order_relaxed);
  };
  // A thread that did not pin itself sees OpenMP's default (one thread per core, or
  // OMP_NUM_THREADS): so do the arena's workers and the fresh controller thread below. Where that
  // default is one thread, pinned and unpinned replicas look alike and the test cannot fail.
  int default_threads = 0;
  std::thread([&] { default_threads = omp_get_max_threads(); }).join();
  if (default_threads == 1) GTEST_SKIP() << "OpenMP's default here is one thread";
  std::thread([&] {
    Recorder rec;
    Trainer(c, fixture()).run(rec);
  }).join();
  EXPECT_EQ(calls.load(), 4 * 8);
  EXPECT_EQ(max_seen.load(), 1);
}

// A failing replica, for every reducer strategy: strategy_test.cpp (FailingReplica).

TEST(Engine, BadInputInAReplicaStaysBadInput) {
  TrainConfig c = engine_config(2);
  c.steps = 3;
  c.leaf_hook = [](std::uint64_t step, std::size_t) {
    if (step == 2) throw InputError("a corrupt sample");
  };
  Recorder rec;
  try {
    Trainer(c, fixture()).run(rec);
    FAIL() << "accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("step 2: a corrupt sample"), std::string::npos);
  }
}

TrainConfig cnn_config(std::size_t workers, const char* model) {
  TrainConfig c;
  c.model = model;
  c.batch = 64;
  c.micro_batch = 16;
  c.steps = 12;
  c.workers = workers;
  c.seed = 9;
  return c;
}

class CnnWorkers : public ::testing::TestWithParam<std::size_t> {};

TEST_P(CnnWorkers, DropoutCnnDigestEqualsOneWorker) {
  // Dropout after a convolution (a blocked layout) and after flatten: masks are keyed by
  // (seed, step, leaf), so every worker count draws the same ones.
  const char* model =
      "conv(8,5)-dropout(0.2)-relu-maxpool(2)-flatten-dropout(0.5)-linear(32)-relu-linear(10)";
  std::printf("seed 9, workers %zu, model %s\n", GetParam(), model);
  for (auto mode : kModes) {
    TrainConfig c1 = cnn_config(1, model), cw = cnn_config(GetParam(), model);
    c1.weight_grads = cw.weight_grads = mode;
    Recorder one, many;
    Summary reference = Trainer(c1, fixture()).run(one);
    Summary s = Trainer(cw, fixture()).run(many);
    ASSERT_EQ(one.losses.size(), 12u) << name(mode);
    ASSERT_EQ(many.losses.size(), 12u) << name(mode);
    EXPECT_EQ(s.weights_digest, reference.weights_digest) << name(mode);
    EXPECT_EQ(many.losses, one.losses) << name(mode);
  }
}

INSTANTIATE_TEST_SUITE_P(Workers, CnnWorkers, ::testing::Values(2, 3, 4), worker_name);

TEST(CnnWorkers, PresetDigestEqualsOneWorker) {
  Recorder one, two;
  Summary a = Trainer(cnn_config(1, "cnn"), fixture()).run(one);
  Summary b = Trainer(cnn_config(2, "cnn"), fixture()).run(two);
  ASSERT_EQ(one.losses.size(), 12u);
  ASSERT_EQ(two.losses.size(), 12u);
  EXPECT_EQ(a.weights_digest, b.weights_digest);
  EXPECT_EQ(one.losses, two.losses);
  EXPECT_LT(one.losses.back(), one.losses.front());
}

// The trainer keys each leaf's dropout by (seed, step, leaf), whichever worker computes it. With
// leaves of one row and per-leaf weight gradients, row i of fc2.weight's gradient (IC, OC) is
// h[i] * dy: zero exactly where the dropout before fc2 dropped unit i (fc1 has no ReLU after it,
// and dy = softmax - one-hot has no zero). So each leaf's gradient shows its mask, which must be
// nn::dropout_mask's for the leaf's key. (That masks differ from key to key is dropout_test's.)
TEST(Dropout, EachLeafOfEachStepDrawsTheMaskOfItsKey) {
  const char* spec = "conv(4,5)-relu-maxpool(2)-flatten-linear(16)-dropout(0.5)-linear(10)";
  const nn::Model model = nn::Model::parse(spec);
  constexpr std::size_t kDropout = 5, kUnits = 16, kClasses = 10;
  ASSERT_EQ(model.layers()[kDropout].kind, nn::LayerSpec::Kind::kDropout);
  const std::size_t fc2 = model.layout().at("fc2.weight").offset;  // (16, 10)
  for (std::size_t workers : {1, 3}) {
    TrainConfig c = cnn_config(workers, spec);
    c.batch = 8;
    c.micro_batch = 1;
    c.steps = 3;
    c.weight_grads = TrainConfig::WeightGrads::kLeaf;
    std::printf("seed %llu, workers %zu, model %s\n", static_cast<unsigned long long>(c.seed),
                workers, spec);
    std::mutex mutex;  // the hook runs on the replicas' threads
    std::map<std::pair<std::uint64_t, std::size_t>, std::vector<bool>> dropped;
    c.gradient_hook = [&](std::uint64_t step, std::size_t leaf, const float* grad, std::size_t) {
      std::vector<bool> zero_rows(kUnits);
      for (std::size_t i = 0; i < kUnits; ++i) {
        const float* row = grad + fc2 + i * kClasses;
        zero_rows[i] = std::all_of(row, row + kClasses, [](float g) { return g == 0.0f; });
      }
      std::lock_guard lock(mutex);
      dropped[{step, leaf}] = zero_rows;
    };
    Recorder r;
    Trainer(c, fixture()).run(r);
    ASSERT_EQ(dropped.size(), 3u * 8u);
    for (const auto& [at, zero_rows] : dropped) {
      const auto [step, leaf] = at;
      ASSERT_GE(step, 1u);
      ASSERT_LE(step, 3u);
      float mask[kUnits];
      nn::dropout_mask({c.seed, step, leaf}, kDropout, 0.5f, kUnits, mask);
      std::vector<bool> want(kUnits);
      for (std::size_t i = 0; i < kUnits; ++i) want[i] = mask[i] == 0.0f;
      EXPECT_EQ(zero_rows, want) << "workers " << workers << ", step " << step << ", leaf " << leaf;
    }
  }
}

TEST(Engine, NonFiniteLossStopsTheRunWithFiniteWeights) {
  TrainConfig c = small_config();
  c.optimizer.lr = 1e12f;  // diverges within a few steps
  c.optimizer.momentum = 0.0f;
  c.steps = 200;
  Trainer t(c, fixture());
  Recorder rec;
  try {
    t.run(rec);
    FAIL() << "a diverging run finished";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("non-finite loss"), std::string::npos) << e.what();
  }
  EXPECT_GE(rec.losses.size(), 1u);  // step 1's loss, before any update, is finite
  EXPECT_LT(rec.losses.size(), 200u);
  const std::size_t n = t.model().layout().total();
  for (std::size_t i = 0; i < n; ++i) ASSERT_TRUE(std::isfinite(t.weights()[i])) << i;
}

}  // namespace trainer_test
}  // namespace cohort::train
