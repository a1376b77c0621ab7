// Rows staged ahead (src/train/staging.hpp): a replica with no leaf left assembles rows of the
// next step while the last leaf is computed. The run must be bit for bit the 1-worker run (which
// never stages ahead: its one replica computes the last leaf itself) across epoch boundaries,
// partial last batches, augmentation (keyed by epoch) and bf16 rows, and staging ahead must
// happen at all: both replicas start every step and its last leaf is made slow, so the replica
// without it always waits.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "cohort/train/trainer.hpp"
#include "train_test_util.hpp"

namespace cohort::train {
namespace staging_run_test {

using testing::fixture;
using testing::Recorder;

struct Case {
  const char* name;
  std::size_t batch, micro_batch;
  bool drop_last;
  const char* augment;
  nn::Precision precision;
};

TrainConfig case_config(const Case& k, std::size_t workers) {
  TrainConfig c;
  c.model = "mlp:784-32-10";
  c.batch = k.batch;
  c.micro_batch = k.micro_batch;
  c.drop_last = k.drop_last;
  c.augment = k.augment;
  c.precision = k.precision;
  c.allow_emulated_bf16 = true;  // the same bits, natively or not
  c.workers = workers;
  c.epochs = 3;  // the 512-image fixture: two epoch boundaries
  c.seed = 11;
  return c;
}

class StagingAhead : public ::testing::TestWithParam<Case> {};

TEST_P(StagingAhead, GivesTheOneWorkerRunsBits) {
  const Case& k = GetParam();
  if (k.precision == nn::Precision::kBf16) {
    COHORT_SKIP_WITHOUT_BF16();
  }
  std::printf("seed %llu\n", static_cast<unsigned long long>(case_config(k, 1).seed));
  Recorder one_rec;
  Trainer one(case_config(k, 1), fixture());
  const Summary one_s = one.run(one_rec);
  EXPECT_EQ(one_s.rows_staged_ahead, 0u);  // one replica never waits for another's leaf

  TrainConfig c = case_config(k, 2);
  const std::size_t leaves = (k.batch + k.micro_batch - 1) / k.micro_batch;
  // Both replicas work on every step: leaf 0 waits (at most a second) until another replica has
  // started leaf 1, so a loaded machine that schedules one replica late still runs two. The last
  // leaf of a full batch is slow: the replica without it runs out of leaves first and stages.
  std::atomic<std::uint64_t> second_started{0};
  c.leaf_hook = [leaves, &second_started](std::uint64_t step, std::size_t leaf) {
    if (leaf == 1) second_started.store(step);
    if (leaf == 0) {
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(1);
      while (second_started.load() != step && std::chrono::steady_clock::now() < give_up)
        std::this_thread::yield();
    }
    if (leaf == leaves - 1) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  };
  Recorder two_rec;
  Trainer two(c, fixture());
  const Summary two_s = two.run(two_rec);
  EXPECT_GT(two_s.rows_staged_ahead, 0u);
  EXPECT_EQ(two_s.weights_digest, one_s.weights_digest);
  EXPECT_EQ(two_rec.losses, one_rec.losses);
  EXPECT_EQ(two_s.test_loss, one_s.test_loss);
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) { return info.param.name; }

INSTANTIATE_TEST_SUITE_P(
    Runs, StagingAhead,
    ::testing::Values(Case{"Plain", 32, 8, true, "", nn::Precision::kF32},
                      // 512 = 10 x 48 + 32: every epoch ends with a partial batch of 3 leaves
                      Case{"PartialBatchAugmented", 48, 12, false, "crop:2,flip",
                           nn::Precision::kF32},
                      // leaves of 20 rows: pieces of 16 and 4
                      Case{"Bf16AugmentedUnevenPieces", 60, 20, true, "crop:2,flip,erase:0.5",
                           nn::Precision::kBf16}),
    case_name);

}  // namespace staging_run_test
}  // namespace cohort::train
