// Optimizers against values computed by hand (torch.optim's documented updates) and against a
// float64 reference over random arrays and several steps.
#include "cohort/optim/optimizer.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "cohort/core/error.hpp"

namespace cohort::optim {
namespace optimizer_test {

OptimizerConfig sgd_config(float lr, float momentum, float weight_decay = 0,
                           bool nesterov = false) {
  return {.kind = Kind::kSgd,
          .lr = lr,
          .momentum = momentum,
          .nesterov = nesterov,
          .weight_decay = weight_decay};
}

// Two steps on w = [1, -2], summed gradients g1 = [0.4, 0.2], g2 = [-0.2, 0.6] over a batch of 2
// (grad_scale 0.5), lr 0.1, momentum 0.9, weight decay 0.01. By hand, element 0:
//   step 1: d = 0.2 + 0.01*1 = 0.21;   v = 0.21;                w = 1 - 0.021 = 0.979
//   step 2: d = -0.1 + 0.00979 = -0.09021; v = 0.189 - 0.09021 = 0.09879; w = 0.979 - 0.009879
// element 1:
//   step 1: d = 0.1 - 0.02 = 0.08;     v = 0.08;                w = -2 - 0.008 = -2.008
//   step 2: d = 0.3 - 0.02008 = 0.27992; v = 0.072 + 0.27992 = 0.35192; w = -2.008 - 0.035192
TEST(Sgd, MomentumAndWeightDecayMatchHandComputation) {
  Optimizer sgd(sgd_config(0.1f, 0.9f, 0.01f));
  EXPECT_EQ(sgd.state_buffers(), 1u);
  std::vector<float> w{1.0f, -2.0f}, v{0, 0};
  std::vector<float> g1{0.4f, 0.2f}, g2{-0.2f, 0.6f};
  sgd.apply(sgd.scalars(0.1f, 0.5f, 1), w.data(), g1.data(), v.data(), nullptr, 2);
  EXPECT_NEAR(w[0], 0.979, 1e-6);
  EXPECT_NEAR(w[1], -2.008, 1e-6);
  sgd.apply(sgd.scalars(0.1f, 0.5f, 2), w.data(), g2.data(), v.data(), nullptr, 2);
  EXPECT_NEAR(v[0], 0.09879, 1e-6);
  EXPECT_NEAR(w[0], 0.979 - 0.009879, 1e-6);
  EXPECT_NEAR(v[1], 0.35192, 1e-6);
  EXPECT_NEAR(w[1], -2.008 - 0.035192, 1e-6);
}

// Nesterov, lr 0.1, momentum 0.5, no decay, w = 1, g = 1 then 1 (grad_scale 1):
//   step 1: v = 1;    w = 1 - 0.1 * (1 + 0.5)   = 0.85
//   step 2: v = 1.5;  w = 0.85 - 0.1 * (1 + 0.75) = 0.675
TEST(Sgd, NesterovMatchesHandComputation) {
  Optimizer sgd(sgd_config(0.1f, 0.5f, 0.0f, true));
  std::vector<float> w{1.0f}, v{0}, g{1.0f};
  sgd.apply(sgd.scalars(0.1f, 1.0f, 1), w.data(), g.data(), v.data(), nullptr, 1);
  EXPECT_NEAR(w[0], 0.85, 1e-7);
  sgd.apply(sgd.scalars(0.1f, 1.0f, 2), w.data(), g.data(), v.data(), nullptr, 1);
  EXPECT_NEAR(v[0], 1.5, 1e-7);
  EXPECT_NEAR(w[0], 0.675, 1e-7);
}

// A parameter whose gradient stays 0 has its state decay geometrically; below the smallest normal
// float it is flushed to 0 (subnormals take a microcode assist per multiply: 6x slower sweeps),
// never left subnormal, for every kind with state. Above that, nothing changes.
TEST(Optimizer, DecayingStateIsFlushedToZeroNeverLeftSubnormal) {
  const float smallest_normal = 1.17549435e-38f;
  for (const OptimizerConfig& c : {sgd_config(0.1f, 0.9f), sgd_config(0.1f, 0.9f, 0.0f, true),
                                   OptimizerConfig{.kind = Kind::kAdam, .lr = 0.001f},
                                   OptimizerConfig{.kind = Kind::kAdamW, .lr = 0.001f}}) {
    SCOPED_TRACE(std::string(to_string(c.kind)) + (c.nesterov ? " nesterov" : ""));
    Optimizer opt(c);
    std::vector<float> w{0.5f}, s0{0}, s1{0}, g{1.0f}, zero{0.0f};
    opt.apply(opt.scalars(c.lr, 1.0f, 1), w.data(), g.data(), s0.data(), s1.data(), 1);
    ASSERT_GT(std::fabs(s0[0]), 0.0f);
    bool reached_zero = false;
    for (std::uint64_t step = 2; step < 20000 && !reached_zero; ++step) {
      const float before = s0[0];
      opt.apply(opt.scalars(c.lr, 1.0f, step), w.data(), zero.data(), s0.data(), s1.data(), 1);
      for (float v : {s0[0], s1[0]}) {
        ASSERT_TRUE(v == 0.0f || std::fabs(v) >= smallest_normal) << "subnormal at step " << step;
      }
      if (before != 0.0f && std::fabs(before) > 1e-30f) {
        // Far above the threshold the update is the plain decay.
        const float decay = c.kind == Kind::kSgd ? c.momentum : c.beta1;
        ASSERT_EQ(s0[0], decay * before) << "step " << step;
      }
      reached_zero = s0[0] == 0.0f;
    }
    EXPECT_TRUE(reached_zero);
    EXPECT_TRUE(std::isfinite(w[0]));
  }
}

TEST(Sgd, PlainSgdNeedsNoState) {
  Optimizer sgd(sgd_config(0.5f, 0.0f));
  EXPECT_EQ(sgd.state_buffers(), 0u);
  std::vector<float> w{2.0f, 3.0f}, g{4.0f, -2.0f};
  sgd.apply(sgd.scalars(0.5f, 0.25f, 1), w.data(), g.data(), nullptr, nullptr, 2);
  EXPECT_FLOAT_EQ(w[0], 1.5f);
  EXPECT_FLOAT_EQ(w[1], 3.25f);
}

TEST(Sgd, OnlyTheGivenRangeChanges) {
  Optimizer sgd(sgd_config(1.0f, 0.9f));
  std::vector<float> w(10, 1.0f), v(10, 0.0f), g(10, 1.0f);
  sgd.apply(sgd.scalars(1.0f, 1.0f, 1), w.data() + 3, g.data() + 3, v.data() + 3, nullptr, 4);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(w[i], (i >= 3 && i < 7) ? 0.0f : 1.0f) << i;
}

// Adam with a constant gradient moves every weight by lr per step (the bias corrections cancel
// the moments' warm-up): w = 1, g = 0.5, lr 0.1. By hand, step 1: m = 0.05, v = 0.00025,
// step_size = 0.1 / 0.1 = 1, sqrt(v) / sqrt(0.001) = 0.5, w = 1 - 0.05 / 0.5 = 0.9. Step 2:
// m = 0.095, v = 0.00049975, step_size = 0.1 / 0.19, sqrt(v / 0.001999) = 0.5, w = 0.8.
TEST(Adam, ConstantGradientMovesByLrPerStep) {
  Optimizer adam({.kind = Kind::kAdam, .lr = 0.1f});
  EXPECT_EQ(adam.state_buffers(), 2u);
  std::vector<float> w{1.0f}, g{0.5f}, m{0}, v{0};
  adam.apply(adam.scalars(0.1f, 1.0f, 1), w.data(), g.data(), m.data(), v.data(), 1);
  // In float, 1 - 0.999f is 0.00099998713: the moments carry ~1e-5 relative error by design.
  EXPECT_NEAR(m[0], 0.05, 0.05 * 2e-5);
  EXPECT_NEAR(v[0], 0.00025, 0.00025 * 2e-5);
  EXPECT_NEAR(w[0], 0.9, 1e-6);
  adam.apply(adam.scalars(0.1f, 1.0f, 2), w.data(), g.data(), m.data(), v.data(), 1);
  EXPECT_NEAR(m[0], 0.095, 0.095 * 2e-5);
  EXPECT_NEAR(v[0], 0.00049975, 0.00049975 * 2e-5);
  EXPECT_NEAR(w[0], 0.8, 1e-6);
}

// Adam adds weight decay to the gradient (its first step still moves by lr: 1 -> 0.9); AdamW
// first shrinks the weight by lr * wd (1 -> 0.99), then steps (-> 0.89).
TEST(Adam, WeightDecayIsL2ForAdamAndDecoupledForAdamW) {
  for (Kind kind : {Kind::kAdam, Kind::kAdamW}) {
    Optimizer opt({.kind = kind, .lr = 0.1f, .weight_decay = 0.1f});
    std::vector<float> w{1.0f}, g{0.5f}, m{0}, v{0};
    opt.apply(opt.scalars(0.1f, 1.0f, 1), w.data(), g.data(), m.data(), v.data(), 1);
    EXPECT_NEAR(w[0], kind == Kind::kAdam ? 0.9 : 0.89, 1e-6) << to_string(kind);
  }
}

// Random arrays, five steps with varying lr and grad_scale, against the same formulas in double.
TEST(Adam, MatchesFloat64ReferenceOverSeveralSteps) {
  constexpr std::uint64_t kSeed = 7;
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  std::mt19937_64 rng(kSeed);
  std::normal_distribution<float> normal;
  const std::size_t n = 1000;
  for (Kind kind : {Kind::kAdam, Kind::kAdamW}) {
    OptimizerConfig c{.kind = kind,
                      .lr = 0.01f,
                      .weight_decay = 0.05f,
                      .beta1 = 0.8f,
                      .beta2 = 0.99f,
                      .eps = 1e-6f};
    Optimizer opt(c);
    std::vector<float> w(n), m(n, 0), v(n, 0);
    for (auto& x : w) x = normal(rng);
    std::vector<double> rw(w.begin(), w.end()), rm(n, 0), rv(n, 0);
    for (std::uint64_t t = 1; t <= 5; ++t) {
      std::vector<float> g(n);
      for (auto& x : g) x = normal(rng);
      const float lr = 0.01f * static_cast<float>(t), gs = 0.25f;
      opt.apply(opt.scalars(lr, gs, t), w.data(), g.data(), m.data(), v.data(), n);
      const double b1 = c.beta1, b2 = c.beta2, wd = c.weight_decay;
      for (std::size_t i = 0; i < n; ++i) {
        if (kind == Kind::kAdamW) rw[i] *= 1.0 - lr * wd;
        const double d = gs * double(g[i]) + (kind == Kind::kAdam ? wd * rw[i] : 0.0);
        rm[i] = b1 * rm[i] + (1 - b1) * d;
        rv[i] = b2 * rv[i] + (1 - b2) * d * d;
        const double mhat = rm[i] / (1 - std::pow(b1, double(t)));
        const double vhat = rv[i] / (1 - std::pow(b2, double(t)));
        rw[i] -= lr * mhat / (std::sqrt(vhat) + c.eps);
      }
    }
    for (std::size_t i = 0; i < n; ++i) {
      ASSERT_NEAR(w[i], rw[i], 1e-5 * (1 + std::abs(rw[i]))) << to_string(kind) << " i=" << i;
      ASSERT_NEAR(m[i], rm[i], 1e-6) << i;
      ASSERT_NEAR(v[i], rv[i], 1e-6) << i;
    }
  }
}

TEST(Optimizer, KindsParseAndPrint) {
  for (Kind k : {Kind::kSgd, Kind::kAdam, Kind::kAdamW}) EXPECT_EQ(parse_kind(to_string(k)), k);
  try {
    parse_kind("rmsprop");
    FAIL() << "accepted rmsprop";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--optimizer: expected sgd, adam or adamw, found "
                                         "'rmsprop'"),
              std::string::npos)
        << e.what();
  }
}

TEST(Optimizer, RefusesBadConfigNamingTheFlag) {
  struct Case {
    OptimizerConfig config;
    const char* flag;
  };
  const Case cases[] = {
      {sgd_config(0.0f, 0.9f), "--lr"},
      {sgd_config(std::nanf(""), 0.9f), "--lr"},
      {sgd_config(0.1f, 1.0f), "--momentum"},
      {sgd_config(0.1f, -0.1f), "--momentum"},
      {sgd_config(0.1f, 0.9f, -1.0f), "--weight-decay"},
      {sgd_config(0.1f, 0.0f, 0.0f, true), "--nesterov"},
      {{.kind = Kind::kAdam, .beta1 = 1.0f}, "--beta1"},
      {{.kind = Kind::kAdamW, .beta2 = -0.5f}, "--beta2"},
      {{.kind = Kind::kAdam, .eps = 0.0f}, "--eps"},
  };
  for (const Case& c : cases) {
    try {
      Optimizer opt(c.config);
      ADD_FAILURE() << "accepted a bad " << c.flag;
    } catch (const InputError& e) {
      EXPECT_EQ(std::string(e.what()).rfind(std::string(c.flag) + ": expected", 0), 0u) << e.what();
    }
  }
  // Adam ignores the momentum fields, SGD the Adam ones.
  EXPECT_NO_THROW(Optimizer({.kind = Kind::kAdam, .momentum = 5.0f}));
  EXPECT_NO_THROW(Optimizer({.kind = Kind::kSgd, .beta1 = 5.0f}));
}

}  // namespace optimizer_test
}  // namespace cohort::optim
