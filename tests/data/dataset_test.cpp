// Sampler ordering and batch assembly.
#include "cohort/data/dataset.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

namespace cohort::data {
namespace {

TEST(Sampler, EachEpochIsAPermutationKeyedBySeedAndEpoch) {
  Sampler s(1000, /*seed=*/7);
  auto e0 = s.epoch_order(0), e1 = s.epoch_order(1);
  ASSERT_EQ(e0.size(), 1000u);
  EXPECT_EQ(e0, Sampler(1000, 7).epoch_order(0));  // a pure function of (seed, epoch)
  EXPECT_NE(e0, e1);
  EXPECT_NE(e0, Sampler(1000, 8).epoch_order(0));
  auto sorted = e1;
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::uint32_t> iota(1000);
  std::iota(iota.begin(), iota.end(), 0u);
  EXPECT_EQ(sorted, iota);
  EXPECT_EQ(Sampler(1000, 7, /*shuffle=*/false).epoch_order(3), iota);
}

TEST(Sampler, ShuffleIsRoughlyUniform) {
  // Position of sample 0 over 4000 epochs of a 4-element set: each slot ~1000 times.
  Sampler s(4, 11);
  std::vector<int> where(4);
  for (int e = 0; e < 4000; ++e) {
    auto o = s.epoch_order(e);
    ++where[std::find(o.begin(), o.end(), 0u) - o.begin()];
  }
  for (int c : where) EXPECT_NEAR(c, 1000, 150);
}

TEST(AssembleBatch, NormalisesPixelsAndCopiesLabels) {
  Dataset set;
  set.count = 2;
  set.rows = 1;
  set.cols = 3;
  set.num_classes = 10;
  set.images = {0, 255, 51, 1, 2, 3};
  set.labels = {4, 9};
  std::vector<std::uint32_t> ids{1, 0};
  std::vector<float> x(6);
  std::vector<std::int32_t> y(2);
  assemble_batch(set, ids, x.data(), y.data());
  EXPECT_EQ(x, (std::vector<float>{1 / 255.0f, 2 / 255.0f, 3 / 255.0f, 0.0f, 1.0f, 51 / 255.0f}));
  EXPECT_EQ(y, (std::vector<std::int32_t>{9, 4}));
}

}  // namespace
}  // namespace cohort::data
