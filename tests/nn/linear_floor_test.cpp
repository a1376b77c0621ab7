// The roofline's linear layers (nn/linear_floor.hpp): which inner products a leaf runs, each timed
// in both layouts, and the saving's arithmetic. Timings are a benchmark's: only their presence
// and sign are checked.
#include "cohort/nn/linear_floor.hpp"

#include <gtest/gtest.h>
#include <omp.h>

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "cohort/nn/gpt/gpt.hpp"
#include "cohort/nn/version.hpp"

namespace cohort::nn {
namespace linear_floor_test {

using Pass = LinearTiming::Pass;

// mlp:784-64-32-10 is layers 0 (linear), 1 (relu), 2 (linear), 3 (relu), 4 (linear).
std::vector<std::pair<std::size_t, Pass>> passes_of(const std::vector<LinearTiming>& t) {
  std::vector<std::pair<std::size_t, Pass>> out;
  for (const LinearTiming& x : t) {
    out.emplace_back(x.layer, x.pass);
    EXPECT_GT(x.plain_seconds, 0) << "layer " << x.layer;
    EXPECT_GT(x.chosen_seconds, 0) << "layer " << x.layer;
    std::printf("layer %zu pass %d: plain %.1f us, chosen %.1f us\n", x.layer,
                static_cast<int>(x.pass), x.plain_seconds * 1e6, x.chosen_seconds * 1e6);
  }
  return out;
}

TEST(LinearFloor, EveryInnerProductOfALeafIsTimedInBothLayouts) {
  omp_set_num_threads(1);
  const Model m = Model::parse("mlp:784-64-32-10", {1, 28, 28});
  std::vector<Precision> precisions{Precision::kF32};
  if (bf16_support() != Bf16Support::kNone) precisions.push_back(Precision::kBf16);
  for (const Precision p : precisions) {
    SCOPED_TRACE(p == Precision::kBf16 ? "bf16" : "f32");
    // Batch weight gradients: forwards, and the backward-data of all but the first layer.
    EXPECT_EQ(passes_of(time_linear_layouts(m, p, 16, false)),
              (std::vector<std::pair<std::size_t, Pass>>{{0, Pass::kForward},
                                                         {2, Pass::kForward},
                                                         {2, Pass::kBackwardData},
                                                         {4, Pass::kForward},
                                                         {4, Pass::kBackwardData}}));
    // Leaf weight gradients: their backward-weights too.
    EXPECT_EQ(passes_of(time_linear_layouts(m, p, 16, true)),
              (std::vector<std::pair<std::size_t, Pass>>{{0, Pass::kForward},
                                                         {0, Pass::kBackwardWeights},
                                                         {2, Pass::kForward},
                                                         {2, Pass::kBackwardData},
                                                         {2, Pass::kBackwardWeights},
                                                         {4, Pass::kForward},
                                                         {4, Pass::kBackwardData},
                                                         {4, Pass::kBackwardWeights}}));
  }
}

TEST(LinearFloor, AModelWithoutALayerListHasNone) {
  const Model gpt = Model::parse("gpt:1-2-8-4", {1, 1, 5}, 7);
  EXPECT_TRUE(time_linear_layouts(gpt, Precision::kF32, 8, false).empty());
}

TEST(LinearFloor, TheSavingCountsOnlyWhereTheChosenLayoutIsFaster) {
  const std::vector<LinearTiming> t{{0, Pass::kForward, 3e-6, 1e-6},
                                    {2, Pass::kForward, 1e-6, 2e-6},
                                    {2, Pass::kBackwardData, 5e-6, 4.5e-6}};
  const LinearTotals sum = linear_totals(t, false);
  EXPECT_DOUBLE_EQ(sum.plain_seconds, 3e-6 + 1e-6 + 5e-6);
  EXPECT_DOUBLE_EQ(sum.best_seconds, 1e-6 + 1e-6 + 4.5e-6);
  EXPECT_DOUBLE_EQ(sum.plain_seconds - sum.best_seconds, 2e-6 + 0.5e-6);
  EXPECT_EQ(linear_totals({}, false).plain_seconds, 0);
  EXPECT_EQ(linear_totals({}, false).best_seconds, 0);
}

// The run's own time is each pass on the layout its plans give it: chosen where the plans choose
// (forward and backward-data; backward-weights stay plain), plain otherwise.
TEST(LinearFloor, TheRunsTimeIsOnThePlansLayouts) {
  const std::vector<LinearTiming> t{{0, Pass::kForward, 3e-6, 1e-6},
                                    {2, Pass::kBackwardData, 1e-6, 2e-6},
                                    {2, Pass::kBackwardWeights, 5e-6, 4.5e-6}};
  EXPECT_DOUBLE_EQ(linear_totals(t, true).run_seconds, 1e-6 + 2e-6 + 5e-6);
  EXPECT_DOUBLE_EQ(linear_totals(t, false).run_seconds, 3e-6 + 1e-6 + 5e-6);
}

// The layout rule: oneDNN's chosen layout only for bf16 with blocked layouts, where oneDNN has
// native bf16 without AMX; this process follows it.
TEST(LinearFloor, ThePlansChooseTheLayoutOnlyWithNativeBf16WithoutAmx) {
  static_assert(choose_linear_layout(/*onednn_amx=*/false, /*native_bf16=*/true));
  static_assert(!choose_linear_layout(true, true));
  static_assert(!choose_linear_layout(false, false));
  const bool rule = choose_linear_layout(onednn_isa().find("amx") != std::string::npos,
                                         bf16_support() == Bf16Support::kNative);
  EXPECT_EQ(plans_choose_layout(Precision::kBf16, true), rule);
  EXPECT_FALSE(plans_choose_layout(Precision::kBf16, false));
  EXPECT_FALSE(plans_choose_layout(Precision::kF32, true));
}

}  // namespace linear_floor_test
}  // namespace cohort::nn
