// The root sharded over ranks (src/train/sharded.hpp) against the one-process run: R trainers on
// R threads of this process, joined by an in-process ThreadComm (thread_comm.hpp), must end with
// the single process's weights, losses, evaluation and optimizer state, bit for bit. The same
// exchange code as under MPI (tests/dist/mpi_test.py runs the real thing), without MPI, so it
// also runs under the sanitizers.
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "cohort/train/trainer.hpp"
#include "thread_comm.hpp"
#include "train_test_util.hpp"

namespace cohort::train {
namespace sharded_test {

using testing::fixture;
using testing::Recorder;
using testing::ThreadComm;
using testing::ThreadWorld;

struct Case {
  std::string name;
  std::string model = "mlp:784-64-32-10";
  std::size_t batch = 64, micro_batch = 8;
  optim::Kind optimizer = optim::Kind::kSgd;
  float clip = 0;
  TrainConfig::WeightGrads weight_grads = TrainConfig::WeightGrads::kBatch;
};

void PrintTo(const Case& k, std::ostream* os) { *os << k.name; }

struct Result {
  Summary summary;
  std::vector<double> losses;
  checkpoint::Checkpoint checkpoint;
};

TrainConfig config_of(const Case& k, std::size_t workers) {
  TrainConfig c;
  c.model = k.model;
  c.batch = k.batch;
  c.micro_batch = k.micro_batch;
  c.workers = workers;
  c.steps = 12;
  c.seed = 11;
  c.optimizer.kind = k.optimizer;
  c.optimizer.lr = k.optimizer == optim::Kind::kSgd ? 0.05f : 0.002f;
  c.optimizer.momentum = 0.9f;
  c.clip_norm = k.clip;
  c.weight_grads = k.weight_grads;
  return c;
}

Result run_one(const TrainConfig& c, dist::Comm* comm) {
  Trainer t(c, fixture(), comm);
  Recorder rec;
  Result r;
  r.summary = t.run(rec);
  r.losses = rec.losses;
  r.checkpoint = t.checkpoint("{}");  // several ranks: a collective
  return r;
}

// Rank r's result of an R-rank run with W workers each.
std::vector<Result> run_ranks(const Case& k, int ranks, std::size_t workers) {
  ThreadWorld world(ranks);
  std::vector<Result> out(static_cast<std::size_t>(ranks));
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(out.size());
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        ThreadComm comm(world, r);
        out[static_cast<std::size_t>(r)] = run_one(config_of(k, workers), &comm);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return out;
}

struct Split {
  int ranks;
  std::size_t workers;
};

void PrintTo(const Split& s, std::ostream* os) { *os << s.ranks << " ranks x " << s.workers; }

class Sharded : public ::testing::TestWithParam<std::tuple<Case, Split>> {};

TEST_P(Sharded, EqualsOneProcessBitForBit) {
  const auto& [k, split] = GetParam();
  std::printf("seed 11, %s, %d ranks x %zu workers\n", k.name.c_str(), split.ranks, split.workers);
  const Result one = run_one(config_of(k, 1), nullptr);
  const std::vector<Result> ranks = run_ranks(k, split.ranks, split.workers);
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const Result& got = ranks[r];
    EXPECT_EQ(got.summary.weights_digest, one.summary.weights_digest);
    EXPECT_EQ(got.losses, one.losses);
    EXPECT_EQ(got.summary.test_loss, one.summary.test_loss);
    EXPECT_EQ(got.summary.test_accuracy, one.summary.test_accuracy);
    EXPECT_EQ(got.summary.ranks, static_cast<std::size_t>(split.ranks));
    EXPECT_GT(got.summary.bytes_sent_per_step, 0.0);
    // The gathered optimizer state is the one process's.
    ASSERT_EQ(got.checkpoint.state.size(), one.checkpoint.state.size());
    for (std::size_t i = 0; i < one.checkpoint.state.size(); ++i)
      EXPECT_TRUE(got.checkpoint.state[i] == one.checkpoint.state[i]) << "state array " << i;
    EXPECT_TRUE(got.checkpoint.running_stats == one.checkpoint.running_stats);
  }
}

const Case kCases[] = {
    {.name = "mlp_batch_grads"},
    {.name = "mlp_leaf_grads", .weight_grads = TrainConfig::WeightGrads::kLeaf},
    {.name = "adam", .optimizer = optim::Kind::kAdam},
    {.name = "clip", .clip = 0.05f},
    {.name = "cnn", .model = "cnn", .batch = 32, .micro_batch = 8},
    // bn: the leaves' statistics are all-gathered and folded in leaf order on every rank.
    {.name = "bn",
     .model = "conv(8,3,1,1,nobias)-bn-relu-res(8)-res(16,2)-gap-linear(10)",
     .batch = 32,
     .micro_batch = 8},
    // 96 leaves: more than one flat root (64), so owners sum the tree's inner nodes themselves.
    {.name = "leaves_96", .model = "mlp:784-16-10", .batch = 96, .micro_batch = 1},
};
const Split kSplits[] = {{2, 1}, {3, 1}, {2, 2}, {5, 1}};

// Sharded/RanksTimesWorkers.EqualsOneProcessBitForBit/cnn_R2xW1
std::string case_name(const ::testing::TestParamInfo<std::tuple<Case, Split>>& param) {
  const Case& k = std::get<0>(param.param);
  const Split& s = std::get<1>(param.param);
  return k.name + "_R" + std::to_string(s.ranks) + "xW" + std::to_string(s.workers);
}

INSTANTIATE_TEST_SUITE_P(RanksTimesWorkers, Sharded,
                         ::testing::Combine(::testing::ValuesIn(kCases),
                                            ::testing::ValuesIn(kSplits)),
                         case_name);

}  // namespace sharded_test
}  // namespace cohort::train
