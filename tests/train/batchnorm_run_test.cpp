// Batch normalization in the trainer: ghost statistics per leaf keep the promise (resnet20 with
// augmentation gets the same weights and running statistics for 1, 2, 3 and 8 workers, and a
// run resumed mid-epoch is the uninterrupted one), the running statistics are folded in leaf
// order from each leaf's own statistics, a bn model's default micro-batch does not come from the
// machine, and --no-decay-norm-bias exempts exactly the bn and bias ranges from weight decay.
#include <gtest/gtest.h>

#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "cohort/checkpoint/checkpoint.hpp"
#include "cohort/nn/net.hpp"
#include "cohort/train/trainer.hpp"
#include "train_test_util.hpp"

namespace cohort::train {
namespace batchnorm_run_test {

using testing::fixture;
using testing::Recorder;
using testing::worker_name;

// A small residual network: bn after a convolution, an identity and a projection block, gap.
constexpr const char* kSmallResNet = "conv(8,3,1,1,nobias)-bn-relu-res(8)-res(16,2)-gap-linear(10)";

TrainConfig resnet_config(std::size_t workers) {
  TrainConfig c;
  c.model = "resnet20";
  c.augment = "crop:4,flip";
  c.batch = 32;
  c.micro_batch = 8;  // 4 leaves
  c.workers = workers;
  c.steps = 3;
  c.seed = 7;
  c.optimizer.lr = 0.1f;
  c.optimizer.momentum = 0.9f;
  c.optimizer.weight_decay = 5e-4f;
  c.eval_batch = 100;
  return c;
}

struct RunResult {
  Summary summary;
  std::vector<double> losses;
  std::vector<float> weights, stats;
};

RunResult run(const TrainConfig& c) {
  Trainer t(c, fixture());
  Recorder rec;
  RunResult r;
  r.summary = t.run(rec);
  r.losses = rec.losses;
  r.weights.assign(t.weights(), t.weights() + t.model().layout().total());
  r.stats.assign(t.running_stats(), t.running_stats() + t.model().stats_layout().total());
  return r;
}

class ResNet20Workers : public ::testing::TestWithParam<std::size_t> {};

TEST_P(ResNet20Workers, EqualTheOneWorkerRunWithRunningStatistics) {
  std::printf("seed 7, resnet20, crop:4,flip, batch 32, micro-batch 8, %zu workers\n", GetParam());
  static const RunResult one = run(resnet_config(1));
  const RunResult got = run(resnet_config(GetParam()));
  EXPECT_EQ(got.summary.weights_digest, one.summary.weights_digest);
  EXPECT_TRUE(got.weights == one.weights);
  EXPECT_TRUE(got.stats == one.stats);
  EXPECT_EQ(got.losses, one.losses);
  EXPECT_EQ(got.summary.test_loss, one.summary.test_loss);
  EXPECT_EQ(got.summary.test_accuracy, one.summary.test_accuracy);
  // The statistics moved from their start (mean 0, variance 1) and the digest covers them.
  nn::Model model = nn::Model::parse("resnet20");
  std::vector<float> start(model.stats_layout().total());
  model.init_stats(start.data());
  EXPECT_FALSE(got.stats == start);
  EXPECT_NE(got.summary.weights_digest, weights_digest(got.weights.data(), got.weights.size()));
}

INSTANTIATE_TEST_SUITE_P(Workers, ResNet20Workers, ::testing::Values(1, 2, 3, 8), worker_name);

TEST(BatchNormResume, MidEpochIsBitwiseTheUninterruptedRun) {
  TrainConfig c = resnet_config(2);
  c.steps = 5;  // 16 steps per epoch of the fixture: the resume is mid-epoch
  const RunResult whole = run(c);
  TrainConfig first_part = resnet_config(1);
  first_part.steps = 2;
  Trainer a(first_part, fixture());
  Recorder first;
  a.run(first);
  const checkpoint::Checkpoint saved =
      checkpoint::decode_checkpoint(checkpoint::encode_checkpoint(a.checkpoint("{}")), "mem");
  ASSERT_EQ(saved.running_stats.size(), a.model().stats_layout().total());
  Trainer b(c, fixture());
  b.restore(saved, "mem");
  Recorder second;
  const Summary resumed = b.run(second);
  EXPECT_EQ(resumed.weights_digest, whole.summary.weights_digest);
  EXPECT_TRUE(
      std::vector<float>(b.running_stats(), b.running_stats() + b.model().stats_layout().total()) ==
      whole.stats);
  first.losses.insert(first.losses.end(), second.losses.begin(), second.losses.end());
  EXPECT_EQ(first.losses, whole.losses);
}

// The trainer's running statistics after one step equal the fold, in leaf order, of each leaf's
// statistics computed here by a Net of its own on the leaf's rows: running = 0.9 running +
// 0.1 batch, the variance times m / (m - 1) for m values per channel.
TEST(BatchNormRunningStatistics, AreFoldedFromEachLeafInLeafOrder) {
  TrainConfig c;
  c.model = kSmallResNet;
  c.batch = 24;
  c.micro_batch = 10;  // leaves of 10, 10 and 4 rows
  c.workers = 2;
  c.steps = 1;
  c.seed = 5;
  c.drop_last = false;
  Trainer t(c, fixture());
  Recorder rec;
  t.run(rec);
  const nn::Model& model = t.model();
  const std::size_t S = model.stats_layout().total();

  std::vector<float> weights(model.layout().total());
  model.init(weights.data(), c.seed);  // the step's forward read the initial weights
  const std::vector<std::uint32_t> order =
      data::Sampler(fixture().train.count, c.seed).epoch_order(0);
  std::vector<float> expected(S);
  model.init_stats(expected.data());
  nn::Net net(model);
  std::vector<float> grad(model.layout().total()), batch(S);
  for (std::size_t first = 0; first < c.batch; first += c.micro_batch) {
    const std::size_t n = std::min(c.micro_batch, c.batch - first);
    std::vector<float> x(n * static_cast<std::size_t>(model.input_features()));
    std::vector<std::int32_t> y(n);
    data::assemble_batch(fixture().train, std::span(order).subspan(first, n), x.data(), y.data());
    net.forward_backward(weights.data(), x.data(), y.data(), static_cast<std::int64_t>(n),
                         grad.data(), {}, {}, batch.data());
    for (const nn::LayerSpec* l : model.batchnorm_layers()) {
      const double m = static_cast<double>(n) * static_cast<double>(l->in.H * l->in.W);
      for (std::int64_t ch = 0; ch < l->in.C; ++ch) {
        float& mean = expected[l->running_mean + ch];
        float& var = expected[l->running_var + ch];
        mean = 0.9f * mean + 0.1f * batch[l->running_mean + ch];
        var = 0.9f * var + 0.1f * (batch[l->running_var + ch] * static_cast<float>(m / (m - 1)));
      }
    }
  }
  for (std::size_t i = 0; i < S; ++i)
    ASSERT_EQ(t.running_stats()[i], expected[i]) << "running statistic " << i;
}

// With weight decay, --no-decay-norm-bias leaves the bn and bias ranges as a run without weight
// decay has them, and every other range as a run with weight decay has it (one SGD step).
TEST(NoDecayNormBias, ExemptsExactlyTheNormAndBiasRanges) {
  auto weights_after = [](float decay, bool exempt) {
    TrainConfig c;
    c.model = kSmallResNet;
    c.batch = 16;
    c.micro_batch = 8;
    c.workers = 1;
    c.steps = 1;
    c.seed = 9;
    c.optimizer.momentum = 0;
    c.optimizer.weight_decay = decay;
    c.no_decay_norm_bias = exempt;
    c.schedule.warmup_steps = 0;
    return run(c).weights;
  };
  const std::vector<float> none = weights_after(0, false), all = weights_after(0.5f, false),
                           exempt = weights_after(0.5f, true);
  const nn::Model model = nn::Model::parse(kSmallResNet);
  std::vector<bool> in_range(model.layout().total(), false);
  const auto ranges = model.norm_and_bias_ranges();
  ASSERT_FALSE(ranges.empty());
  for (auto [b, e] : ranges)
    for (std::size_t i = b; i < e; ++i) in_range[i] = true;
  std::size_t exempted = 0, decayed = 0;
  for (std::size_t i = 0; i < in_range.size(); ++i) {
    if (in_range[i]) {
      ASSERT_EQ(exempt[i], none[i]) << "element " << i << " (a bn or bias range)";
      exempted += all[i] != none[i];
    } else {
      ASSERT_EQ(exempt[i], all[i]) << "element " << i;
      decayed += all[i] != none[i];
    }
  }
  EXPECT_GT(exempted, 0u);  // the decay reaches those ranges without the flag
  EXPECT_GT(decayed, 0u);
}

}  // namespace batchnorm_run_test
}  // namespace cohort::train
