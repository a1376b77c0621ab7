// The step's roofline in the run's summary (src/train/roofline.cpp, docs/architecture.md "The
// roofline"): its GEMM floor against the run's own timing of the same primitives, the step it
// compares is the mean after the run's first step, and the bytes it charges the root are the
// root's own (counted here from the model, independently).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "../common/sanitizers.hpp"
#include "cohort/nn/model.hpp"
#include "cohort/train/trainer.hpp"
#include "train_test_util.hpp"

namespace cohort::train {
namespace roofline_test {

using testing::fixture;
using testing::Recorder;

TrainConfig roofline_config(nn::Precision precision, TrainConfig::WeightGrads grads) {
  TrainConfig c;
  c.model = "mlp:784-256-128-10";
  c.batch = 128;
  c.micro_batch = 32;  // 4 leaves
  c.workers = 2;
  c.steps = 12;
  c.seed = 3;
  c.precision = precision;
  c.weight_grads = grads;
  c.roofline = true;
  c.allow_emulated_bf16 = true;  // a CPU without AVX512_BF16 runs the bf16 cases too
  return c;
}

// What the root reads and writes per step, counted layer by layer: the f32 weights and the SGD
// momentum read and written, the bf16 copy written; per linear layer either its rows (the batch's
// X and dY in the replicas' precision) or its gradient read from every leaf.
double expected_root_bytes(const TrainConfig& c) {
  const nn::Model model = nn::Model::parse(c.model, {1, 28, 28});
  const bool b16 = c.precision == nn::Precision::kBf16;
  const double n = static_cast<double>(model.layout().total());
  double bytes = n * 4 * 2 * 2 + (b16 ? n * 2 : 0);
  const double leaves = static_cast<double>(c.batch / c.micro_batch);
  for (const nn::LayerSpec& l : model.layers()) {
    if (l.kind != nn::LayerSpec::Kind::kLinear) continue;
    const double in = static_cast<double>(l.in.numel()), out = static_cast<double>(l.out.C);
    if (c.weight_grads == TrainConfig::WeightGrads::kBatch)
      bytes += static_cast<double>(c.batch) * (in + out) * (b16 ? 2 : 4);
    else
      bytes += (in * out + out) * 4 * leaves;
  }
  return bytes;
}

struct Case {
  nn::Precision precision;
  TrainConfig::WeightGrads grads;
};

class Roofline : public ::testing::TestWithParam<Case> {};

// The floor against the run's own measurement of the same work: the replicas time every oneDNN
// matmul they run (Summary::time.matmul, summed over replicas) and the root its batch
// weight-gradient GEMMs (time.weight_grad). The floor's GEMM part is the same primitives timed
// alone at their best, shared over the replicas, so it must not exceed what the run spent per
// step and replica (with room for timer noise), and must be of its order (a floor that forgot
// the leaves or divided them twice would be far off either way). The root's bytes are counted
// from the model, independently of the code under test.
TEST_P(Roofline, FloorIsBelowTheRunsOwnTimingOfTheSameWork) {
  if (GetParam().precision == nn::Precision::kBf16) {
    COHORT_SKIP_WITHOUT_BF16();
  }
  TrainConfig c = roofline_config(GetParam().precision, GetParam().grads);
  c.steps = 30;
  std::printf("seed %llu\n", static_cast<unsigned long long>(c.seed));
  {
    // oneDNN generates its kernels the first time a process creates a primitive: a run before
    // keeps that out of the timed run's matmul time.
    TrainConfig warm = c;
    warm.steps = 1;
    Trainer w(warm, fixture());
    Recorder ignored;
    w.run(ignored);
  }
  Trainer t(c, fixture());
  Recorder rec;
  const Summary s = t.run(rec);
  ASSERT_EQ(s.steps, c.steps);
  const train::Roofline& r = s.roofline;
  const double leaves = static_cast<double>(c.batch / c.micro_batch);
  const double replicas = std::min(static_cast<double>(c.workers), leaves);
  const double run_gemm =
      (s.time.matmul + s.time.weight_grad) / static_cast<double>(s.steps) / replicas;
  std::printf("floor GEMMs %.1f us, the run's %.1f us a step and replica\n", r.gemm_seconds * 1e6,
              run_gemm * 1e6);
  EXPECT_GT(r.gemm_seconds, 0);
  EXPECT_LE(r.gemm_seconds, 1.5 * run_gemm);
  // Under AddressSanitizer cohort's own kernels (the bf16 batch weight gradients' row-pair
  // GEMM) are instrumented and oneDNN's are not, and at -O0 they are not optimized: there the
  // run's time for them is not of the floor's order.
  if (!cohort::testing::kAsan && !cohort::testing::kUnoptimized) {
    EXPECT_GE(r.gemm_seconds, run_gemm / 8);
  }
  EXPECT_GT(r.root_seconds, 0);
  EXPECT_LE(r.floor_seconds, s.time.step / static_cast<double>(s.steps) * 1.5);
  // The first step is left out of the mean, and accounted for: together they are the run's
  // step time.
  EXPECT_GT(r.first_step_seconds, 0);
  EXPECT_NEAR(r.first_step_seconds + static_cast<double>(c.steps - 1) * r.step_seconds, s.time.step,
              1e-9 * s.time.step);
  EXPECT_DOUBLE_EQ(r.root_bytes, expected_root_bytes(c));
}

TEST_P(Roofline, OneStepIsItsOwnStep) {
  if (GetParam().precision == nn::Precision::kBf16) {
    COHORT_SKIP_WITHOUT_BF16();
  }
  TrainConfig c = roofline_config(GetParam().precision, GetParam().grads);
  c.steps = 1;
  Trainer t(c, fixture());
  Recorder rec;
  const Summary s = t.run(rec);
  EXPECT_EQ(s.roofline.first_step_seconds, 0);
  EXPECT_DOUBLE_EQ(s.roofline.step_seconds, s.time.step);
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return std::string(info.param.precision == nn::Precision::kBf16 ? "Bf16" : "F32") +
         (info.param.grads == TrainConfig::WeightGrads::kBatch ? "BatchGrads" : "LeafGrads");
}

INSTANTIATE_TEST_SUITE_P(
    Precisions, Roofline,
    ::testing::Values(Case{nn::Precision::kF32, TrainConfig::WeightGrads::kBatch},
                      Case{nn::Precision::kF32, TrainConfig::WeightGrads::kLeaf},
                      Case{nn::Precision::kBf16, TrainConfig::WeightGrads::kBatch},
                      Case{nn::Precision::kBf16, TrainConfig::WeightGrads::kLeaf}),
    case_name);

}  // namespace roofline_test
}  // namespace cohort::train
