// The optimizer inside the training step: Adam and clipping reproducible across worker counts,
// clipping bounding the update exactly, schedules driving the step's rate, and non-finite
// gradients or losses stopping the run or skipping the step without touching the weights.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "cohort/checkpoint/checkpoint.hpp"
#include "cohort/core/error.hpp"
#include "cohort/train/trainer.hpp"
#include "train_test_util.hpp"

namespace cohort::train {
namespace optimizer_run_test {

using testing::fixture;
using testing::Recorder;

TrainConfig base_config() {
  TrainConfig c;
  c.model = "mlp:784-32-10";
  c.batch = 32;
  c.micro_batch = 8;
  c.workers = 1;
  c.seed = 11;
  c.steps = 12;
  c.weight_grads = TrainConfig::WeightGrads::kLeaf;
  c.schedule = {.kind = optim::ScheduleKind::kConstant, .warmup_steps = 0};  // a plain rate
  return c;
}

std::vector<float> weights_of(const Trainer& t) {
  return {t.weights(), t.weights() + t.model().layout().total()};
}

// Puts a NaN into leaf `leaf`'s gradient (element 5 of the first tensor: fc1.weight in
// base_config) at step `step`. With batch weight gradients a leaf's array holds no linear layer's
// gradient, so base_config computes them per leaf; the batch-mode tests below poison a
// convolution's gradient instead.
void poison(TrainConfig& c, std::uint64_t step, std::size_t leaf) {
  c.gradient_hook = [step, leaf](std::uint64_t s, std::size_t l, float* grad, std::size_t) {
    if (s == step && l == leaf) grad[5] = std::numeric_limits<float>::quiet_NaN();
  };
}

struct Variant {
  const char* name;
  void (*apply)(TrainConfig&);
};
const Variant kVariants[] = {
    {"adam", [](TrainConfig& c) { c.optimizer = {.kind = optim::Kind::kAdam, .lr = 1e-3f}; }},
    {"adamw_cosine_warmup",
     [](TrainConfig& c) {
       c.optimizer = {.kind = optim::Kind::kAdamW, .lr = 2e-3f, .weight_decay = 0.01f};
       c.schedule = {.kind = optim::ScheduleKind::kCosine, .warmup_steps = 3, .min_lr = 1e-4f};
     }},
    {"sgd_clip", [](TrainConfig& c) { c.clip_norm = 0.5f; }},
    {"sgd_skip_mode", [](TrainConfig& c) { c.on_nonfinite = TrainConfig::OnNonFinite::kSkip; }},
    {"adam_batch_weight_grads",
     [](TrainConfig& c) {
       c.optimizer = {.kind = optim::Kind::kAdam, .lr = 1e-3f};
       c.weight_grads = TrainConfig::WeightGrads::kBatch;
     }},
    {"sgd_clip_batch_weight_grads",
     [](TrainConfig& c) {
       c.clip_norm = 0.5f;
       c.weight_grads = TrainConfig::WeightGrads::kBatch;
     }},
};

void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }

class Optimizers : public ::testing::TestWithParam<Variant> {};

TEST_P(Optimizers, SameWeightsForAnyWorkerCountAndTheLossFalls) {
  std::printf("seed 11, %s\n", GetParam().name);
  std::string digest;
  std::vector<double> losses;
  for (std::size_t w : {1, 2, 3}) {
    TrainConfig c = base_config();
    GetParam().apply(c);
    c.workers = w;
    Recorder r;
    const Summary s = Trainer(c, fixture()).run(r);
    ASSERT_EQ(r.losses.size(), 12u) << "workers " << w;
    if (digest.empty()) {
      digest = s.weights_digest;
      losses = r.losses;
    }
    EXPECT_EQ(s.weights_digest, digest) << "workers " << w;
    EXPECT_EQ(r.losses, losses) << "workers " << w;
    EXPECT_EQ(s.updates, 12u);
  }
  double first = 0, last = 0;
  for (int i = 0; i < 3; ++i) first += losses[i];
  for (int i = 9; i < 12; ++i) last += losses[i];
  EXPECT_LT(last, first) << "the loss did not fall";
}

INSTANTIATE_TEST_SUITE_P(Train, Optimizers, ::testing::ValuesIn(kVariants),
                         [](const auto& test) { return std::string(test.param.name); });

// Plain SGD (no momentum, no decay) with a clip far below the gradient's norm moves the weights
// by exactly lr * clip in L2 norm; with a clip far above, by lr * the reported gradient norm.
TEST(Clipping, BoundsTheUpdateToLrTimesTheClip) {
  for (auto mode : {TrainConfig::WeightGrads::kLeaf, TrainConfig::WeightGrads::kBatch})
    for (float clip : {1e-3f, 1e6f}) {
      TrainConfig c = base_config();
      c.weight_grads = mode;
      c.optimizer = {.kind = optim::Kind::kSgd, .lr = 0.1f, .momentum = 0.0f};
      c.clip_norm = clip;
      c.steps = 1;
      c.workers = 2;
      Trainer t(c, fixture());
      const std::vector<float> before = weights_of(t);
      Recorder r;
      t.run(r);
      const std::vector<float> after = weights_of(t);
      double moved = 0;
      for (std::size_t i = 0; i < before.size(); ++i)
        moved += (double(after[i]) - before[i]) * (double(after[i]) - before[i]);
      moved = std::sqrt(moved);
      ASSERT_EQ(r.steps.size(), 1u);
      const double norm = r.steps[0].grad_norm;
      ASSERT_TRUE(std::isfinite(norm));
      if (clip < 1) {
        EXPECT_GT(norm, 100 * clip);
        EXPECT_NEAR(moved, 0.1 * clip, 0.1 * clip * 1e-3) << "norm " << norm;
      } else {
        EXPECT_NEAR(moved, 0.1 * norm, 0.1 * norm * 1e-3);
      }
    }
}

TEST(Schedule, EachStepUsesTheScheduledRateAndASkipDoesNotAdvanceIt) {
  TrainConfig c = base_config();
  c.optimizer.lr = 0.08f;
  c.schedule = {.kind = optim::ScheduleKind::kConstant, .warmup_steps = 4};
  c.on_nonfinite = TrainConfig::OnNonFinite::kSkip;
  c.steps = 6;
  poison(c, 2, 1);
  Recorder r;
  const Summary s = Trainer(c, fixture()).run(r);
  ASSERT_EQ(r.steps.size(), 6u);
  const float expected[] = {0.02f, 0.04f, 0.04f, 0.06f, 0.08f, 0.08f};
  for (int i = 0; i < 6; ++i) EXPECT_FLOAT_EQ(r.steps[i].lr, expected[i]) << "step " << i + 1;
  EXPECT_TRUE(r.steps[1].skipped);
  EXPECT_NE(r.steps[1].skip_reason.find("non-finite gradient in fc1.weight[5]"), std::string::npos)
      << r.steps[1].skip_reason;
  EXPECT_EQ(s.skipped, 1u);
  EXPECT_EQ(s.updates, 5u);
}

TEST(LinearScaling, ScalesTheBaseRateWithTheBatch) {
  TrainConfig c = base_config();
  c.optimizer.lr = 0.1f;
  c.schedule.scale_batch = 8;  // batch 32: 4x
  c.steps = 1;
  Recorder r;
  Trainer(c, fixture()).run(r);
  EXPECT_FLOAT_EQ(r.steps.at(0).lr, 0.4f);
}

// A skipped step leaves the weights exactly as the step before left them, for SGD with momentum
// and for Adam, whose bias correction must not count the skipped step either.
TEST(NonFinite, SkippedStepLeavesTheWeightsAndStateUntouched) {
  for (optim::Kind kind : {optim::Kind::kSgd, optim::Kind::kAdam}) {
    TrainConfig c = base_config();
    c.optimizer.kind = kind;
    c.optimizer.lr = kind == optim::Kind::kSgd ? 0.05f : 1e-3f;
    c.on_nonfinite = TrainConfig::OnNonFinite::kSkip;
    c.workers = 2;
    c.steps = 4;
    Recorder clean;
    Trainer a(c, fixture());
    a.run(clean);
    const checkpoint::Checkpoint at4 = a.checkpoint("{}");
    ASSERT_EQ(at4.weights.size(), a.model().layout().total());
    ASSERT_EQ(at4.state.size(), kind == optim::Kind::kSgd ? 1u : 2u);  // momentum; Adam's m, v
    poison(c, 5, 3);
    c.steps = 5;
    Trainer b(c, fixture());
    Recorder skipped;
    const Summary s = b.run(skipped);
    EXPECT_EQ(s.skipped, 1u) << optim::to_string(kind);
    EXPECT_EQ(s.updates, 4u);
    const checkpoint::Checkpoint at5 = b.checkpoint("{}");
    EXPECT_EQ(at5.weights, at4.weights) << optim::to_string(kind);
    EXPECT_EQ(at5.state, at4.state) << optim::to_string(kind);
    EXPECT_EQ(at5.step, 5u);
    EXPECT_EQ(at5.updates, 4u);
    EXPECT_EQ(at5.skipped, 1u);
  }
}

// Stopping (the default) names the step and the tensor; with the two-phase root (clipping on)
// nothing of the step was applied, so the weights are those of the step before.
TEST(NonFinite, StopNamesStepAndTensorAndKeepsTheWeightsWithClipping) {
  TrainConfig c = base_config();
  c.clip_norm = 10.0f;
  c.workers = 2;
  c.steps = 3;
  Trainer a(c, fixture());
  Recorder r;
  a.run(r);
  const std::vector<float> at3 = weights_of(a);
  poison(c, 4, 2);
  c.steps = 6;
  Trainer b(c, fixture());
  try {
    b.run(r);
    FAIL() << "a non-finite gradient did not stop the run";
  } catch (const InternalError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("step 4: non-finite gradient in fc1.weight[5]"), std::string::npos) << m;
  }
  EXPECT_EQ(weights_of(b), at3);
}

// Without clipping the root is the fused single pass: the run still stops naming the tensor,
// and no non-finite value reaches the weights.
TEST(NonFinite, FusedRootStopsAndWritesNoNonFiniteWeight) {
  TrainConfig c = base_config();
  c.workers = 2;
  poison(c, 2, 0);
  Trainer t(c, fixture());
  Recorder r;
  try {
    t.run(r);
    FAIL() << "a non-finite gradient did not stop the run";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("step 2: non-finite gradient in fc1.weight[5]"),
              std::string::npos)
        << e.what();
  }
  for (float w : weights_of(t)) ASSERT_TRUE(std::isfinite(w));
}

// Batch weight gradients: the root computes linear layers' gradients itself and sums the rest
// (here a convolution's) from the leaves; a non-finite element of either kind is caught there.
TrainConfig batch_cnn_config() {
  TrainConfig c = base_config();
  c.model = "conv(4,5)-relu-maxpool(2)-flatten-linear(10)";
  c.workers = 2;
  c.weight_grads = TrainConfig::WeightGrads::kBatch;
  return c;
}

TEST(NonFinite, BatchWeightGradsStopOnAConvolutionGradient) {
  TrainConfig c = batch_cnn_config();
  poison(c, 2, 1);
  Trainer t(c, fixture());
  ASSERT_EQ(t.config().weight_grads, TrainConfig::WeightGrads::kBatch);
  Recorder r;
  try {
    t.run(r);
    FAIL() << "a non-finite gradient did not stop the run";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("step 2: non-finite gradient in conv1.weight[5]"),
              std::string::npos)
        << e.what();
  }
  for (float w : weights_of(t)) ASSERT_TRUE(std::isfinite(w));
}

TEST(NonFinite, BatchWeightGradsSkipAndMatchTheCleanRunOtherwise) {
  // Skip mode (the two-phase root) with batch weight gradients: the poisoned step applies
  // nothing, so stopping a clean run before it gives the same weights.
  TrainConfig c = batch_cnn_config();
  c.on_nonfinite = TrainConfig::OnNonFinite::kSkip;
  c.steps = 3;
  TrainConfig clean = c;
  clean.steps = 2;
  poison(c, 3, 0);
  Trainer t(c, fixture()), u(clean, fixture());
  Recorder r, q;
  EXPECT_EQ(t.run(r).skipped, 1u);
  u.run(q);
  EXPECT_EQ(weights_of(t), weights_of(u));
}

TEST(NonFinite, TooManySkipsInARowStopTheRun) {
  TrainConfig c = base_config();
  c.optimizer.lr = 1e12f;  // diverges: every later loss is non-finite
  c.optimizer.momentum = 0;
  c.on_nonfinite = TrainConfig::OnNonFinite::kSkip;
  c.max_skips = 3;
  c.steps = 200;
  Trainer t(c, fixture());
  Recorder r;
  try {
    t.run(r);
    FAIL() << "a diverged run did not stop";
  } catch (const InternalError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("3 steps in a row skipped"), std::string::npos) << m;
    EXPECT_NE(m.find("non-finite loss"), std::string::npos) << m;
  }
  for (float w : weights_of(t)) ASSERT_TRUE(std::isfinite(w));
}

TEST(Resume, AdamWithASkipResumesBitwise) {
  TrainConfig c = base_config();
  c.optimizer = {.kind = optim::Kind::kAdam, .lr = 1e-3f};
  c.schedule = {.kind = optim::ScheduleKind::kCosine, .warmup_steps = 2};
  c.on_nonfinite = TrainConfig::OnNonFinite::kSkip;
  poison(c, 3, 1);
  c.workers = 2;
  Recorder whole;
  const Summary full = Trainer(c, fixture()).run(whole);
  // Interrupted after step 5 (as Ctrl-C does: the schedule's horizon stays the whole run's).
  struct StopAfter5 : Recorder {
    bool stop_requested() override { return steps.size() == 5; }
  } interrupted;
  Trainer a(c, fixture());
  EXPECT_TRUE(a.run(interrupted).stopped);
  Trainer b(c, fixture());
  b.restore(checkpoint::decode_checkpoint(checkpoint::encode_checkpoint(a.checkpoint("{}")), "m"),
            "m");
  Recorder rest;
  const Summary resumed = b.run(rest);
  EXPECT_EQ(resumed.weights_digest, full.weights_digest);
  EXPECT_EQ(resumed.skipped, 1u);
  EXPECT_EQ(resumed.updates, full.updates);
  TrainConfig sgd = c;
  sgd.optimizer = {};
  try {
    Trainer(sgd, fixture()).restore(a.checkpoint("{}"), "x.ckpt");
    FAIL() << "an Adam checkpoint was accepted by an SGD run";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--optimizer: this run has sgd, the checkpoint adam"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace optimizer_run_test
}  // namespace cohort::train
