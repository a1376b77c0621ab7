// The step's roofline in the run's summary (src/train/roofline.cpp, docs/architecture.md "The
// roofline"): its plan and arithmetic (what it times and how it combines them), the step it
// compares is the mean after the run's first step, and the bytes it charges the root are the
// root's own (counted here from the model, independently). Its figures are a benchmark's, not a
// test's: nothing here compares timings.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "cohort/nn/model.hpp"
#include "cohort/train/trainer.hpp"
#include "roofline.hpp"
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

// The floor in a run: its parts measured on the run's own shapes and combined by the floor's
// arithmetic, checked against what the config and the model say (the leaves, the replicas, the
// root's bytes counted here layer by layer), never against the machine's timing: the parts'
// figures vary with the load, the arithmetic and its inputs do not. Their figures are printed.
TEST_P(Roofline, TheFloorIsItsPartsOnTheRunsOwnShapes) {
  if (GetParam().precision == nn::Precision::kBf16) {
    COHORT_SKIP_WITHOUT_BF16();
  }
  TrainConfig c = roofline_config(GetParam().precision, GetParam().grads);
  std::printf("seed %llu\n", static_cast<unsigned long long>(c.seed));
  Trainer t(c, fixture());
  Recorder rec;
  const Summary s = t.run(rec);
  ASSERT_EQ(s.steps, c.steps);
  const train::Roofline& r = s.roofline;
  std::printf(
      "leaf GEMMs %.1f us (chosen layouts' saving %.1f us), root GEMMs %.1f us, sweep %.1f us, "
      "step %.1f us\n",
      r.leaf_gemm_seconds * 1e6, r.linear_layout_seconds * 1e6, r.root_gemm_seconds * 1e6,
      r.root_seconds * 1e6, r.step_seconds * 1e6);
  // A layer list's inner products on oneDNN's chosen weight layouts: a saving or none.
  EXPECT_GE(r.linear_layout_seconds, 0);
  EXPECT_EQ(r.leaves, c.batch / c.micro_batch);
  EXPECT_EQ(r.replicas, std::min(c.workers, r.leaves));
  EXPECT_GT(r.leaf_gemm_seconds, 0);
  // The root's GEMMs are timed where the root computes them: with batch weight gradients only.
  if (c.weight_grads == TrainConfig::WeightGrads::kBatch)
    EXPECT_GT(r.root_gemm_seconds, 0);
  else
    EXPECT_EQ(r.root_gemm_seconds, 0);
  EXPECT_EQ(r.root_threads, c.workers);
  EXPECT_DOUBLE_EQ(
      r.gemm_alone_seconds,
      static_cast<double>(r.leaves) * r.leaf_gemm_seconds / static_cast<double>(r.replicas) +
          r.root_gemm_seconds / static_cast<double>(r.root_threads));
  // The run's own work a step, a replica's share of its GEMMs (here every worker has leaves, so
  // the root's GEMMs spread as the leaves') and a worker's of its reduce, over the steps after
  // the first: the whole run's time table less at most the first step's wall time on every
  // worker.
  ASSERT_EQ(r.replicas, r.root_threads);
  std::printf("the run's own: GEMMs %.1f us, root %.1f us\n", r.run_gemm_seconds * 1e6,
              r.run_root_seconds * 1e6);
  const auto steady = static_cast<double>(c.steps - 1);
  const double first = r.first_step_seconds * static_cast<double>(c.workers);
  const double gemms = s.time.matmul + s.time.attention;
  EXPECT_GT(r.run_gemm_seconds, 0);
  EXPECT_LE(r.run_gemm_seconds * static_cast<double>(r.replicas) * steady, gemms);
  EXPECT_GE(r.run_gemm_seconds * static_cast<double>(r.replicas) * steady, gemms - first);
  EXPECT_GT(r.run_root_seconds, 0);
  EXPECT_LE(r.run_root_seconds * static_cast<double>(c.workers) * steady, s.time.reduce);
  EXPECT_GE(r.run_root_seconds * static_cast<double>(c.workers) * steady, s.time.reduce - first);
  EXPECT_DOUBLE_EQ(r.gemm_seconds, std::min(r.gemm_alone_seconds, r.run_gemm_seconds));
  EXPECT_GT(r.sweep_seconds, 0);
  EXPECT_DOUBLE_EQ(r.root_seconds, std::min(r.sweep_seconds, r.run_root_seconds));
  EXPECT_DOUBLE_EQ(r.root_bytes, expected_root_bytes(c));
  EXPECT_DOUBLE_EQ(r.floor_seconds, r.gemm_seconds + r.root_seconds);
  EXPECT_DOUBLE_EQ(r.fraction, r.floor_seconds / r.step_seconds);
  // The first step is left out of the mean, and accounted for: together they are the run's
  // step time.
  EXPECT_GT(r.first_step_seconds, 0);
  EXPECT_NEAR(r.first_step_seconds + static_cast<double>(c.steps - 1) * r.step_seconds, s.time.step,
              1e-9 * s.time.step);
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

// The floor's plan, from the model and the config alone: several ranks each sweep their share of
// the root's bytes; the replicas are the job's, at most the leaves.
TEST(RooflinePlan, RanksShareTheSweepAndReplicasAtMostTheLeaves) {
  const TrainConfig c = roofline_config(nn::Precision::kF32, TrainConfig::WeightGrads::kBatch);
  const nn::Model model = nn::Model::parse(c.model, {1, 28, 28});
  const auto n = static_cast<double>(model.layout().total());
  const std::size_t momentum = 1;
  for (const std::size_t ranks : {1u, 2u, 3u}) {
    const FloorPlan f = plan_floor(model, c, momentum, /*job_replicas=*/2 * ranks, ranks,
                                   /*root_sources=*/4);
    SCOPED_TRACE("ranks " + std::to_string(ranks));
    EXPECT_EQ(f.leaves, 4u);
    EXPECT_EQ(f.replicas, std::min<std::size_t>(2 * ranks, 4));
    EXPECT_EQ(f.root_threads, 2 * ranks);  // every worker of every rank: the root's chunks
    EXPECT_EQ(f.workers, c.workers);
    EXPECT_EQ(f.ranks, ranks);
    EXPECT_DOUBLE_EQ(f.root_bytes, expected_root_bytes(c));
    // The weights and the momentum are updated in place (read and written: 8 bytes a float
    // each); the rest of the root's bytes is read, shared over the ranks.
    EXPECT_DOUBLE_EQ(f.sweep_read_bytes,
                     (expected_root_bytes(c) - n * 8 * 2) / static_cast<double>(ranks));
    EXPECT_EQ(f.sweep_arrays, 2u);
    EXPECT_EQ(f.sweep_floats, static_cast<std::size_t>(n / static_cast<double>(ranks)));
  }
}

// The floor's arithmetic on given parts: the leaves' GEMMs spread over the replicas with leaves,
// the root's over every worker (each runs the root's chunks, also one without a leaf: the MLP at
// batch 32 has one leaf and two workers), plus the sweep.
TEST(RooflinePlan, TheFloorIsTheLeavesGemmsOverTheReplicasTheRootsOverEveryWorkerPlusTheSweep) {
  struct Shape {
    const char* name;
    std::size_t leaves, replicas, root_threads;
    double gemm;
  };
  for (const Shape& p : {Shape{"6 leaves, 4 workers", 6, 4, 4, (6 * 0.002 + 0.004) / 4},
                         Shape{"1 leaf, 2 workers", 1, 1, 2, 0.002 + 0.004 / 2}}) {
    SCOPED_TRACE(p.name);
    FloorPlan f;
    f.leaves = p.leaves;
    f.replicas = p.replicas;
    f.root_threads = p.root_threads;
    f.root_bytes = 1e6;
    const train::Roofline r = roofline_of(f, /*leaf=*/0.002, /*root=*/0.004, /*sweep=*/0.001,
                                          /*step=*/0.01);
    EXPECT_DOUBLE_EQ(r.gemm_alone_seconds, p.gemm);
    EXPECT_DOUBLE_EQ(r.gemm_seconds, p.gemm);
    EXPECT_DOUBLE_EQ(r.floor_seconds, p.gemm + 0.001);
    EXPECT_DOUBLE_EQ(r.fraction, r.floor_seconds / 0.01);
    EXPECT_DOUBLE_EQ(r.root_bytes, 1e6);
    EXPECT_EQ(r.leaves, p.leaves);
    EXPECT_EQ(r.replicas, p.replicas);
    EXPECT_EQ(r.root_threads, p.root_threads);
    EXPECT_EQ(roofline_of(f, 0.002, 0.004, 0.001, 0).fraction, 0);  // no step measured
  }
}

// A part timed alone is a floor only if the run's own steps took no less for the same work: each
// counts at most the run's own (its worker-seconds a step spread as the floor's: the leaves'
// GEMMs over the replicas with leaves, the root's GEMMs and its reducer's and optimizer's work
// over every worker), in one process; several ranks' tables each hold a rank's share, and their
// parts count as timed.
TEST(RooflinePlan, EachPartCountsAtMostTheRunsOwnTimeForTheSameWork) {
  FloorPlan f;
  f.leaves = 6;
  f.replicas = 4;
  f.root_threads = 5;
  f.workers = 5;
  f.ranks = 1;
  const double alone = 6 * 0.002 / 4 + 0.004 / 5;  // 3.8 ms
  struct Part {
    const char* name;
    RunWork run;
    double gemm, root;
  };
  for (const Part& p :
       {Part{"the run slower: the parts as timed", {0.016, 0.008, 0.010}, alone, 0.001},
        Part{"GEMMs faster in the run", {0.010, 0.002, 0.010}, 0.0029, 0.001},
        Part{"root faster in the run", {0.016, 0.008, 0.004}, alone, 0.0008},
        Part{"not known: as timed", {0, 0, 0}, alone, 0.001}}) {
    SCOPED_TRACE(p.name);
    const train::Roofline r = roofline_of(f, 0.002, 0.004, 0.001, 0.01, p.run);
    EXPECT_DOUBLE_EQ(r.gemm_alone_seconds, alone);
    EXPECT_DOUBLE_EQ(r.run_gemm_seconds, p.run.leaf_gemm_seconds / 4 + p.run.root_gemm_seconds / 5);
    EXPECT_DOUBLE_EQ(r.run_root_seconds, p.run.reduce_seconds / 5);
    EXPECT_DOUBLE_EQ(r.gemm_seconds, p.gemm);
    EXPECT_DOUBLE_EQ(r.sweep_seconds, 0.001);
    EXPECT_DOUBLE_EQ(r.root_seconds, p.root);
    EXPECT_DOUBLE_EQ(r.floor_seconds, p.gemm + p.root);
    EXPECT_DOUBLE_EQ(r.fraction, (p.gemm + p.root) / 0.01);
  }
  f.ranks = 2;
  const train::Roofline r = roofline_of(f, 0.002, 0.004, 0.001, 0.01, {0.003, 0.001, 0.001});
  EXPECT_EQ(r.run_gemm_seconds, 0);
  EXPECT_EQ(r.run_root_seconds, 0);
  EXPECT_DOUBLE_EQ(r.floor_seconds, alone + 0.001);
}

}  // namespace roofline_test
}  // namespace cohort::train
