// SGD against values computed by hand (and matching torch.optim.SGD's documented update).
#include "cohort/optim/sgd.hpp"

#include <gtest/gtest.h>

#include <vector>

#include "cohort/core/error.hpp"

namespace cohort::optim {
namespace {

// Two steps on w = [1, -2], summed gradients g1 = [0.4, 0.2], g2 = [-0.2, 0.6] over a batch of 2
// (grad_scale 0.5), lr 0.1, momentum 0.9, weight decay 0.01. By hand, element 0:
//   step 1: d = 0.2 + 0.01*1 = 0.21;   v = 0.21;                w = 1 - 0.021 = 0.979
//   step 2: d = -0.1 + 0.00979 = -0.09021; v = 0.189 - 0.09021 = 0.09879; w = 0.979 - 0.009879
// element 1:
//   step 1: d = 0.1 - 0.02 = 0.08;     v = 0.08;                w = -2 - 0.008 = -2.008
//   step 2: d = 0.3 - 0.02008 = 0.27992; v = 0.072 + 0.27992 = 0.35192; w = -2.008 - 0.035192
TEST(Sgd, MomentumAndWeightDecayMatchHandComputation) {
  Sgd sgd({.lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.01f, .nesterov = false});
  std::vector<float> w{1.0f, -2.0f}, v{0, 0};
  std::vector<float> g1{0.4f, 0.2f}, g2{-0.2f, 0.6f};
  sgd.apply(w.data(), g1.data(), v.data(), 2, 0.1f, 0.5f);
  EXPECT_NEAR(w[0], 0.979, 1e-6);
  EXPECT_NEAR(w[1], -2.008, 1e-6);
  sgd.apply(w.data(), g2.data(), v.data(), 2, 0.1f, 0.5f);
  EXPECT_NEAR(v[0], 0.09879, 1e-6);
  EXPECT_NEAR(w[0], 0.979 - 0.009879, 1e-6);
  EXPECT_NEAR(v[1], 0.35192, 1e-6);
  EXPECT_NEAR(w[1], -2.008 - 0.035192, 1e-6);
}

// Nesterov, lr 0.1, momentum 0.5, no decay, w = 1, g = 1 then 1 (grad_scale 1):
//   step 1: v = 1;    w = 1 - 0.1 * (1 + 0.5)   = 0.85
//   step 2: v = 1.5;  w = 0.85 - 0.1 * (1 + 0.75) = 0.675
TEST(Sgd, NesterovMatchesHandComputation) {
  Sgd sgd({.lr = 0.1f, .momentum = 0.5f, .weight_decay = 0.0f, .nesterov = true});
  std::vector<float> w{1.0f}, v{0}, g{1.0f};
  sgd.apply(w.data(), g.data(), v.data(), 1, 0.1f, 1.0f);
  EXPECT_NEAR(w[0], 0.85, 1e-7);
  sgd.apply(w.data(), g.data(), v.data(), 1, 0.1f, 1.0f);
  EXPECT_NEAR(v[0], 1.5, 1e-7);
  EXPECT_NEAR(w[0], 0.675, 1e-7);
}

TEST(Sgd, PlainSgdNeedsNoVelocity) {
  Sgd sgd({.lr = 0.5f, .momentum = 0.0f});
  std::vector<float> w{2.0f, 3.0f}, g{4.0f, -2.0f};
  sgd.apply(w.data(), g.data(), nullptr, 2, 0.5f, 0.25f);
  EXPECT_FLOAT_EQ(w[0], 1.5f);
  EXPECT_FLOAT_EQ(w[1], 3.25f);
}

TEST(Sgd, OnlyTheGivenRangeChanges) {
  Sgd sgd({.lr = 1.0f, .momentum = 0.9f});
  std::vector<float> w(10, 1.0f), v(10, 0.0f), g(10, 1.0f);
  sgd.apply(w.data() + 3, g.data() + 3, v.data() + 3, 4, 1.0f, 1.0f);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(w[i], (i >= 3 && i < 7) ? 0.0f : 1.0f) << i;
}

TEST(Sgd, BadConfigIsRefusedNamingTheField) {
  auto message_of = [](SgdConfig c) {
    try {
      validate(c);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message_of({.lr = 0.0f}).find("lr"), std::string::npos);
  EXPECT_NE(message_of({.lr = 0.1f, .momentum = 1.5f}).find("momentum"), std::string::npos);
  EXPECT_NE(message_of({.lr = 0.1f, .weight_decay = -1.0f}).find("weight-decay"),
            std::string::npos);
  EXPECT_NE(message_of({.lr = 0.1f, .momentum = 0.0f, .nesterov = true}).find("nesterov"),
            std::string::npos);
  EXPECT_EQ(message_of({.lr = 0.1f}), "accepted");
}

}  // namespace
}  // namespace cohort::optim
