// Resume and crash safety end to end: a resumed run is bit for bit the uninterrupted one, a
// checkpoint of another run is refused naming the field, and 50 SIGKILLs of a process that is
// writing checkpoints each leave one that loads.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <ostream>
#include <random>
#include <string>
#include <thread>

#include "cohort/checkpoint/checkpoint.hpp"
#include "cohort/core/error.hpp"
#include "cohort/train/trainer.hpp"
#include "train_test_util.hpp"

namespace cohort::train {
namespace resume_test {

namespace fs = std::filesystem;
using checkpoint::Checkpoint;
using checkpoint::decode_checkpoint;
using checkpoint::encode_checkpoint;
using checkpoint::load_checkpoint;

using testing::fixture;
using testing::Recorder;

TrainConfig resume_config(const char* model, std::size_t workers) {
  TrainConfig c;
  c.model = model;
  c.batch = 64;
  c.micro_batch = 16;
  c.workers = workers;
  c.seed = 3;
  c.steps = 20;  // 2.5 epochs of the fixture: the resume crosses an epoch boundary
  return c;
}

struct ResumeCase {
  const char* name;  // the test's parameter name
  const char* spec;
};

void PrintTo(const ResumeCase& m, std::ostream* os) { *os << m.spec; }

class Resume : public ::testing::TestWithParam<ResumeCase> {};

TEST_P(Resume, IsBitwiseTheUninterruptedRun) {
  const char* spec = GetParam().spec;
  std::printf("seed 3, model %s\n", spec);
  Recorder whole;
  Trainer a(resume_config(spec, 2), fixture());
  const Summary full = a.run(whole);

  TrainConfig first_half = resume_config(spec, 1);
  first_half.steps = 11;
  Trainer b(first_half, fixture());
  Recorder first;
  b.run(first);
  const auto bytes = encode_checkpoint(b.checkpoint("{}"));

  Trainer c(resume_config(spec, 2), fixture());
  c.restore(decode_checkpoint(bytes, "mem"), "mem");
  Recorder second;
  const Summary resumed = c.run(second);
  EXPECT_EQ(resumed.steps, 20u);
  EXPECT_EQ(resumed.weights_digest, full.weights_digest);
  ASSERT_EQ(whole.losses.size(), 20u);
  ASSERT_EQ(first.losses.size(), 11u);
  ASSERT_EQ(second.losses.size(), 9u);
  first.losses.insert(first.losses.end(), second.losses.begin(), second.losses.end());
  EXPECT_EQ(first.losses, whole.losses);
}

INSTANTIATE_TEST_SUITE_P(
    Models, Resume,
    ::testing::Values(ResumeCase{"mlp", "mlp:784-64-10"},
                      ResumeCase{"cnn_dropout",
                                 "conv(4,5)-relu-maxpool(2)-flatten-dropout(0.3)-linear(10)"}),
    [](const auto& test) { return std::string(test.param.name); });

// A checkpoint holds linear weights (and optimizer state) in PyTorch's (OC, IC) order, whatever
// order the build stores them in.
TEST(CheckpointOrder, LinearWeightsAreCanonical) {
  TrainConfig c = resume_config("mlp:784-64-10", 1);
  c.steps = 3;
  Trainer t(c, fixture());
  Recorder r;
  t.run(r);
  const Checkpoint ck = t.checkpoint("{}");
  const auto& w = t.model().layout().at("fc1.weight");  // stored (784, 64)
  for (std::size_t o : {0u, 17u, 63u})
    for (std::size_t i : {300u, 406u, 434u}) {  // pixels inside the image: non-zero gradients
      EXPECT_EQ(ck.weights[w.offset + o * 784 + i], t.weights()[w.offset + i * 64 + o]);
      EXPECT_NE(ck.state.at(0)[w.offset + o * 784 + i], 0.0f);  // momentum moved too
    }
}

TEST(ResumeDone, AFinishedRunStillReportsItsAccuracy) {
  TrainConfig c = resume_config("mlp:784-64-10", 1);
  Trainer a(c, fixture());
  Recorder r;
  const Summary done = a.run(r);
  Trainer b(c, fixture());
  b.restore(a.checkpoint("{}"), "mem");
  Recorder none;
  const Summary again = b.run(none);  // already at --steps: nothing to train
  EXPECT_TRUE(none.losses.empty());
  EXPECT_EQ(again.steps, 20u);
  EXPECT_EQ(again.weights_digest, done.weights_digest);
  EXPECT_EQ(again.test_accuracy, done.test_accuracy);
}

TEST(ResumeRefusals, AnotherRunsCheckpointIsRefusedNamingTheField) {
  Trainer b(resume_config("mlp:784-64-10", 1), fixture());
  const Checkpoint ck = b.checkpoint("{}");
  auto message = [&](TrainConfig c) {
    try {
      Trainer(c, fixture()).restore(ck, "x.ckpt");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(message(resume_config("mlp:784-64-10", 2)), "accepted");
  EXPECT_NE(message(resume_config("mlp:784-32-10", 1)).find("--model"), std::string::npos);
  TrainConfig c = resume_config("mlp:784-64-10", 1);
  c.seed = 4;
  EXPECT_NE(message(c).find("--seed"), std::string::npos);
  c = resume_config("mlp:784-64-10", 1);
  c.batch = 32;
  EXPECT_NE(message(c).find("--batch"), std::string::npos);
  c = resume_config("mlp:784-64-10", 1);
  c.micro_batch = 8;
  EXPECT_NE(message(c).find("--micro-batch"), std::string::npos);
  c = resume_config("mlp:784-64-10", 1);
  c.optimizer.momentum = 0;
  EXPECT_NE(message(c).find("momentum"), std::string::npos);
  // A checkpoint of samples of another shape (same parameter count: an mlp on 784 features).
  Checkpoint tabular = ck;
  tabular.input = {1, 1, 784};
  try {
    Trainer(resume_config("mlp:784-64-10", 1), fixture()).restore(tabular, "t.ckpt");
    ADD_FAILURE() << "accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("input shape (C, H, W): this run has (1, 28, 28), the "
                                         "checkpoint (1, 1, 784)"),
              std::string::npos)
        << e.what();
  }
}

class CrashSafety : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("cohort_crash_safety_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(CrashSafety, SigkillWhileSavingNeverLeavesAnUnloadableCheckpoint) {
  // A child trains a small model and saves after every step; it is killed at a random moment,
  // 50 times (the first once it has saved). The checkpoint must exist and load every time.
  std::mt19937_64 rng(7);
  std::printf("seed 7\n");
  const fs::path ckpt = dir_ / "live.ckpt";
  int loaded = 0;
  for (int trial = 0; trial < 50; ++trial) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      const int devnull = ::open("/dev/null", O_WRONLY);
      dup2(devnull, 1);
      dup2(devnull, 2);
      execl(COHORT_BINARY, COHORT_BINARY, "train", "--data", COHORT_FIXTURE_DIR, "--model",
            "mlp:784-64-10", "--batch", "32", "--steps", "1000000", "--workers", "2", "--save",
            ckpt.c_str(), "--save-every", "1", "--keep", "2", "--quiet", nullptr);
      _exit(127);
    }
    if (trial == 0) {  // the first child runs until it has written one (however slow the build)
      for (int i = 0; i < 600 && !fs::exists(ckpt); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 400));
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the child exited on its own: " << status;
    // Once a checkpoint has been written, every later kill must leave one (the old or the new).
    if (!fs::exists(ckpt)) {
      EXPECT_EQ(loaded, 0) << "trial " << trial << ": the checkpoint vanished";
      continue;
    }
    EXPECT_NO_THROW(load_checkpoint(ckpt)) << "trial " << trial;
    ++loaded;
  }
  std::printf("%d of 50 kills left a checkpoint; all loaded\n", loaded);
  EXPECT_EQ(loaded, 50);
}

}  // namespace resume_test
}  // namespace cohort::train
