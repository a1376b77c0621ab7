// The summary's time table (src/train/time_account.cpp): the root's chunks and the two-phase
// root's second phase go to the lines they belong to, and what is busy is never counted as idle.
// The unit cases feed fixed durations; the run checks the trainer hands the account the right
// chunks, by the table's own arithmetic, not by the machine's timing.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <vector>

#include "cohort/train/root.hpp"
#include "cohort/train/trainer.hpp"
#include "time_account.hpp"
#include "train_test_util.hpp"

namespace cohort::train {
namespace time_account_test {

using std::chrono::microseconds;

// Two root chunks run outside any replica's reducer call (2 ms and 3 ms, 1 ms apart), so the
// account counts them as busy time of their own.
std::vector<ChunkStats> two_chunks() {
  const TimePoint t0 = Clock::now();
  std::vector<ChunkStats> chunks(2);
  chunks[0].begin = t0;
  chunks[0].end = t0 + microseconds(2000);
  chunks[1].begin = t0 + microseconds(1000);
  chunks[1].end = t0 + microseconds(4000);
  return chunks;
}

TEST(TimeAccount, FusedChunksAreTheOptimizersTimeBesideTheirGemms) {
  std::vector<ChunkStats> chunks = two_chunks();
  chunks[1].gemm_seconds = 1e-3;
  TimeAccount account;
  account.add_root(chunks, /*fused=*/true);
  account.end_step(/*wall=*/10e-3, /*workers=*/2);
  const TimeBreakdown& t = account.total();
  EXPECT_NEAR(t.optimizer, 4e-3, 1e-12);  // 2 + 3 ms, less the GEMMs' 1 ms
  EXPECT_NEAR(t.weight_grad, 1e-3, 1e-12);
  EXPECT_NEAR(t.reduce, 4e-3, 1e-12);
  EXPECT_NEAR(t.reduce_critical, 4e-3, 1e-12);
  EXPECT_NEAR(t.idle, 20e-3 - 5e-3, 1e-12);
}

// A two-phase root's chunks only sum (the gradient's norm is needed before any update); its
// second phase applies the optimizer chunk by chunk on every worker, and those seconds are busy
// time in reduce + optimizer, not idle.
TEST(TimeAccount, TwoPhaseChunksSumAndTheSecondPhaseIsTheOptimizerNotIdle) {
  std::vector<ChunkStats> chunks = two_chunks();
  TimeAccount account;
  account.add_root(chunks, /*fused=*/false);
  EXPECT_EQ(account.total().optimizer, 0);
  chunks[0].apply_seconds = 1e-3;
  chunks[1].apply_seconds = 1.5e-3;
  account.add_second_phase(chunks, /*wall=*/1.6e-3);
  account.end_step(/*wall=*/10e-3, /*workers=*/2);
  const TimeBreakdown& t = account.total();
  EXPECT_NEAR(t.optimizer, 2.5e-3, 1e-12);
  EXPECT_NEAR(t.reduce, 5e-3 + 2.5e-3, 1e-12);
  EXPECT_NEAR(t.reduce_critical, 4e-3 + 1.6e-3, 1e-12);
  EXPECT_NEAR(t.idle, 20e-3 - 7.5e-3, 1e-12);
}

// A run with a two-phase root (gradient clipping), 2 workers: the optimizer's line is part of
// reduce + optimizer, and the table adds up to the workers' time.
TEST(TimeAccount, ARunsOptimizerIsWithinReduceAndTheTableAddsUp) {
  TrainConfig c;
  c.model = "mlp:784-64-10";
  c.batch = 64;
  c.micro_batch = 16;
  c.workers = 2;
  c.steps = 6;
  c.seed = 5;
  c.clip_norm = 1.0f;  // the two-phase root
  std::printf("seed %llu\n", static_cast<unsigned long long>(c.seed));
  Trainer trainer(c, testing::fixture());
  testing::Recorder rec;
  const Summary s = trainer.run(rec);
  ASSERT_EQ(s.steps, c.steps);
  const TimeBreakdown& t = s.time;
  std::printf("reduce %.1f us, optimizer %.1f us, idle %.1f us over %.1f us x 2\n", t.reduce * 1e6,
              t.optimizer * 1e6, t.idle * 1e6, t.step * 1e6);
  EXPECT_GT(t.optimizer, 0);
  EXPECT_LE(t.optimizer, t.reduce);
  // idle is each step's workers x wall less its busy time, floored at 0: the lines cover it.
  EXPECT_GE(t.compute + t.data + t.reduce + t.idle, 2 * t.step * (1 - 1e-9));
}

}  // namespace time_account_test
}  // namespace cohort::train
