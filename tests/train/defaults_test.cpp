// The default leaf size is a function of the model, the batch and the precision only: never of
// the workers (nor of the machine, which resolve_defaults does not ask). The whole runs that
// check the same digest for every worker and rank count: tests/dist/mpi_test.py.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "cohort/nn/model.hpp"
#include "cohort/train/trainer.hpp"
#include "defaults.hpp"

namespace cohort::train {
namespace {

TEST(BalancedLeaf, TheFewestLeavesOfAtMostTheCapAsEvenAsWholeRowsAllow) {
  // (batch, cap, rows a leaf)
  const std::size_t cases[][3] = {{256, 64, 64}, {256, 32, 32}, {100, 64, 50}, {65, 64, 33},
                                  {40, 64, 40},  {12, 8, 6},    {64, 2, 2},    {1, 64, 1},
                                  {7, 1, 1},     {13, 4, 4}};
  for (const auto& [batch, cap, rows] : cases) {
    const std::size_t got = balanced_leaf(batch, cap);
    EXPECT_EQ(got, rows) << "batch " << batch << ", cap " << cap;
    EXPECT_LE(got, cap) << "batch " << batch << ", cap " << cap;
    const std::size_t leaves = (batch + got - 1) / got;
    EXPECT_EQ(leaves, (batch + cap - 1) / cap) << "the fewest leaves: batch " << batch;
  }
}

struct Case {
  std::string model;
  nn::Precision precision;
  std::size_t batch, rows;
};

TEST(LeafDefaults, FromTheModelBatchAndPrecisionWhateverTheWorkers) {
  const Case cases[] = {
      {"mlp:784-512-256-10", nn::Precision::kF32, 256, 64},
      {"mlp:784-512-256-10", nn::Precision::kBf16, 256, 64},
      {"mlp:784-512-256-10", nn::Precision::kF32, 100, 50},
      {"mlp:784-512-256-10", nn::Precision::kF32, 40, 40},
      // cnn: 32 rows in f32; in bf16 its first layer's output at 32 rows (32 x 24 x 24 values a
      // row, 1.18 MB) exceeds 1 MiB: 16.
      {"cnn", nn::Precision::kF32, 256, 32},
      {"cnn", nn::Precision::kBf16, 256, 16},
      {"cnn", nn::Precision::kF32, 48, 24},
      // bn: the statistics' sample, never balanced.
      {"resnet20", nn::Precision::kF32, 256, 64},
      {"resnet20", nn::Precision::kBf16, 100, 64},
      {"resnet20", nn::Precision::kF32, 40, 40},
  };
  for (const Case& k : cases) {
    const nn::SampleShape shape =
        k.model == "resnet20" ? nn::SampleShape{3, 32, 32} : nn::SampleShape{1, 28, 28};
    const nn::Model model = nn::Model::parse(k.model, shape);
    const std::string at = k.model + (k.precision == nn::Precision::kBf16 ? " bf16" : " f32") +
                           ", batch " + std::to_string(k.batch);
    TrainConfig c;
    c.model = k.model;
    c.batch = k.batch;
    c.precision = k.precision;
    for (const std::size_t workers : {1, 2, 3, 16, 64}) {
      c.workers = workers;
      EXPECT_EQ(resolve_defaults(c, model).micro_batch, k.rows) << at << ", " << workers;
    }
    c.micro_batch = 7;  // given: kept
    EXPECT_EQ(resolve_defaults(c, model).micro_batch, 7u) << at;
  }
}

// A small convolution whose 32-row outputs fit in 1 MiB keeps 32 rows in bf16.
TEST(LeafDefaults, ASmallConvolutionKeepsItsRowsInBf16) {
  const nn::Model small = nn::Model::parse("conv(4,3)-relu-flatten-linear(10)", {1, 8, 8});
  for (const nn::Precision p : {nn::Precision::kBf16, nn::Precision::kF32}) {
    EXPECT_EQ(small.kind().leaf_rule(p).cap, 32u);
    EXPECT_FALSE(small.kind().leaf_rule(p).exact);
  }
  // bn: exactly its cap, the statistics' sample.
  EXPECT_TRUE(
      nn::Model::parse("resnet20", {3, 32, 32}).kind().leaf_rule(nn::Precision::kF32).exact);
}

// A language model: its leaf's windows, balanced over the batch. nanoGPT's CPU recipe (batch
// 12, at most 8 windows a leaf) gets two leaves of 6. A batch within one leaf's cap is still two
// leaves (batch 4 of GPT-2's 124M at windows of 64 would otherwise run on one core), the second
// the shorter where the batch is odd; a batch of one window is one leaf.
TEST(LeafDefaults, ALanguageModelsWindowsBalancedOverTheBatch) {
  const nn::Model cpu = nn::Model::parse("gpt:4-4-128-64", {1, 1, 65}, 65);
  TrainConfig c;
  c.model = "gpt:4-4-128-64";
  c.batch = 12;
  EXPECT_EQ(resolve_defaults(c, cpu).micro_batch, 6u);
  c.batch = 32;
  EXPECT_EQ(resolve_defaults(c, cpu).micro_batch, 8u);
  for (const auto& [batch, rows] : std::vector<std::pair<std::size_t, std::size_t>>{
           {8, 4}, {5, 3}, {4, 2}, {3, 2}, {2, 1}, {1, 1}}) {
    c.batch = batch;
    for (const nn::Precision p : {nn::Precision::kBf16, nn::Precision::kF32}) {
      c.precision = p;
      EXPECT_EQ(resolve_defaults(c, cpu).micro_batch, rows) << "batch " << batch;
    }
  }
  c.precision = nn::Precision::kF32;
  // The layer lists keep one leaf for a batch within their cap.
  const nn::Model mlp = nn::Model::parse("mlp:784-512-256-10", {1, 28, 28});
  TrainConfig m;
  m.model = "mlp:784-512-256-10";
  m.batch = 64;
  EXPECT_EQ(resolve_defaults(m, mlp).micro_batch, 64u);
  const nn::Model full = nn::Model::parse("gpt:6-6-384-256", {1, 1, 257}, 65);
  c.model = "gpt:6-6-384-256";
  c.batch = 64;
  EXPECT_EQ(resolve_defaults(c, full).micro_batch, 2u);
}

}  // namespace
}  // namespace cohort::train
