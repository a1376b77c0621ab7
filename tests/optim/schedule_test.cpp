// Learning-rate schedules against values computed by hand.
#include "cohort/optim/schedule.hpp"

#include <gtest/gtest.h>

#include <string>

#include "cohort/core/error.hpp"

namespace cohort::optim {
namespace schedule_test {

TEST(Schedule, ConstantIsTheBaseRate) {
  ScheduleConfig c{.kind = ScheduleKind::kConstant, .warmup_steps = 0};
  for (std::uint64_t u : {0, 1, 1000}) EXPECT_EQ(lr_at(c, 0.05f, u, 2000), 0.05f);
}

TEST(Schedule, WarmupRisesLinearlyThenHandsOver) {
  ScheduleConfig c{.kind = ScheduleKind::kConstant, .warmup_steps = 4};
  EXPECT_FLOAT_EQ(lr_at(c, 1.0f, 0, 100), 0.25f);
  EXPECT_FLOAT_EQ(lr_at(c, 1.0f, 1, 100), 0.5f);
  EXPECT_FLOAT_EQ(lr_at(c, 1.0f, 3, 100), 1.0f);
  EXPECT_FLOAT_EQ(lr_at(c, 1.0f, 4, 100), 1.0f);
}

TEST(Schedule, StepDecaysByGammaEveryInterval) {
  ScheduleConfig c{.kind = ScheduleKind::kStep, .warmup_steps = 0, .step_every = 10, .gamma = 0.5f};
  EXPECT_FLOAT_EQ(lr_at(c, 1.0f, 9, 100), 1.0f);
  EXPECT_FLOAT_EQ(lr_at(c, 1.0f, 10, 100), 0.5f);
  EXPECT_FLOAT_EQ(lr_at(c, 1.0f, 25, 100), 0.25f);
}

// Cosine over the 100 updates after a 10-update warmup, from 1 down to 0.1: halfway (update 60)
// the rate is (1 + 0.1) / 2; the last update (109) is just above 0.1; beyond the end it stays.
TEST(Schedule, CosineFallsFromBaseToMinAfterWarmup) {
  ScheduleConfig c{.kind = ScheduleKind::kCosine, .warmup_steps = 10, .min_lr = 0.1f};
  EXPECT_FLOAT_EQ(lr_at(c, 1.0f, 9, 110), 1.0f);  // the last warmup update
  EXPECT_FLOAT_EQ(lr_at(c, 1.0f, 10, 110), 1.0f);
  EXPECT_FLOAT_EQ(lr_at(c, 1.0f, 60, 110), 0.55f);
  const float last = lr_at(c, 1.0f, 109, 110);
  EXPECT_GT(last, 0.1f);
  EXPECT_LT(last, 0.1003f);
  EXPECT_FLOAT_EQ(lr_at(c, 1.0f, 500, 110), 0.1f);
  for (std::uint64_t u = 10; u < 110; ++u)
    EXPECT_LE(lr_at(c, 1.0f, u + 1, 110), lr_at(c, 1.0f, u, 110)) << u;
}

TEST(Schedule, LinearScalingRuleScalesWithTheBatch) {
  ScheduleConfig c{.scale_batch = 256};
  EXPECT_FLOAT_EQ(scaled_base_lr(c, 0.1f, 1024), 0.4f);
  EXPECT_FLOAT_EQ(scaled_base_lr(c, 0.1f, 64), 0.025f);
  EXPECT_FLOAT_EQ(scaled_base_lr(ScheduleConfig{}, 0.1f, 1024), 0.1f);  // off by default
}

TEST(Schedule, NamesParseAndBadValuesAreRefusedNamingTheFlag) {
  for (auto k : {ScheduleKind::kConstant, ScheduleKind::kStep, ScheduleKind::kCosine})
    EXPECT_EQ(parse_schedule(to_string(k)), k);
  EXPECT_THROW(parse_schedule("linear"), InputError);
  auto refused = [](const ScheduleConfig& c, float lr, const std::string& flag) {
    try {
      validate(c, lr);
      ADD_FAILURE() << "accepted a bad " << flag;
    } catch (const InputError& e) {
      EXPECT_EQ(std::string(e.what()).rfind(flag + ": expected", 0), 0u) << e.what();
    }
  };
  refused({.kind = ScheduleKind::kStep, .step_every = 0}, 0.1f, "--lr-step-every");
  refused({.kind = ScheduleKind::kStep, .step_every = 5, .gamma = 0.0f}, 0.1f, "--lr-gamma");
  refused({.kind = ScheduleKind::kStep, .step_every = 5, .gamma = 1.5f}, 0.1f, "--lr-gamma");
  refused({.kind = ScheduleKind::kCosine, .min_lr = 0.2f}, 0.1f, "--min-lr");
  refused({.kind = ScheduleKind::kCosine, .min_lr = -1.0f}, 0.1f, "--min-lr");
  EXPECT_NO_THROW(validate({.kind = ScheduleKind::kCosine, .min_lr = 0.01f}, 0.1f));
}

}  // namespace schedule_test
}  // namespace cohort::optim
