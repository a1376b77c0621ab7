// Checkpoints: exact round trips, every truncation and 1,000 bit flips refused whole, resume
// bit for bit equal to an uninterrupted run, mismatched resumes refused, and 50 SIGKILLs of a
// process that is writing checkpoints, after each of which the newest checkpoint loads.
#include "cohort/train/checkpoint.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>
#include <filesystem>
#include <fstream>

#include <chrono>
#include <random>
#include <thread>

#include "cohort/core/error.hpp"
#include "cohort/train/trainer.hpp"

namespace cohort::train {
namespace {

namespace fs = std::filesystem;

const data::Splits& fixture() {
  static const data::Splits splits = data::load_image_folder(COHORT_FIXTURE_DIR);
  return splits;
}

Checkpoint small_checkpoint() {
  Checkpoint c;
  c.model = "mlp:4-3";
  c.step = 17;
  c.seed = 5;
  c.batch = 8;
  c.micro_batch = 4;
  c.train_count = 512;
  c.config_json = R"({"lr":0.05})";
  for (int i = 0; i < 16; ++i) c.weights.push_back(0.25f * float(i) - 1.0f);
  for (int i = 0; i < 16; ++i) c.velocity.push_back(0.01f * float(i));
  return c;
}

class Checkpoints : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("cohort_ckpt_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  static std::vector<std::uint8_t> read(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), {}};
  }
  fs::path dir_;
};

TEST_F(Checkpoints, RoundTripIsExact) {
  const Checkpoint c = small_checkpoint();
  const auto bytes = encode_checkpoint(c);
  const Checkpoint d = decode_checkpoint(bytes, "mem");
  EXPECT_EQ(d.model, c.model);
  EXPECT_EQ(d.step, 17u);
  EXPECT_EQ(d.weights, c.weights);
  EXPECT_EQ(d.velocity, c.velocity);
  EXPECT_EQ(d.config_json, c.config_json);
  EXPECT_EQ(encode_checkpoint(d), bytes);
  // save, load, save: identical files
  save_checkpoint(dir_ / "a.ckpt", c);
  save_checkpoint(dir_ / "b.ckpt", load_checkpoint(dir_ / "a.ckpt"));
  EXPECT_EQ(read(dir_ / "a.ckpt"), read(dir_ / "b.ckpt"));
}

TEST_F(Checkpoints, EveryTruncationIsRefused) {
  const auto bytes = encode_checkpoint(small_checkpoint());
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    std::vector<std::uint8_t> cut(bytes.begin(), bytes.begin() + std::ptrdiff_t(n));
    EXPECT_THROW(decode_checkpoint(cut, "cut"), InputError) << "truncated to " << n << " bytes";
  }
  auto longer = bytes;
  longer.push_back(0);
  EXPECT_THROW(decode_checkpoint(longer, "long"), InputError);
}

TEST_F(Checkpoints, ThousandSingleBitFlipsAreRefused) {
  const auto bytes = encode_checkpoint(small_checkpoint());
  std::mt19937_64 rng(20261130);
  std::printf("seed 20261130, %zu bytes\n", bytes.size());
  for (int trial = 0; trial < 1000; ++trial) {
    auto bad = bytes;
    const std::size_t bit = rng() % (bad.size() * 8);
    bad[bit / 8] ^= std::uint8_t(1u << (bit % 8));
    EXPECT_THROW(decode_checkpoint(bad, "flip"), InputError) << "bit " << bit;
  }
}

TEST_F(Checkpoints, ForeignAndFutureFilesAreRefusedWithReasons) {
  auto bytes = encode_checkpoint(small_checkpoint());
  auto message = [](const std::vector<std::uint8_t>& b) {
    try {
      decode_checkpoint(b, "f.ckpt");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  auto future = bytes;
  future[8] = 2;  // version 2
  EXPECT_NE(message(future).find("newer cohort"), std::string::npos);
  auto foreign = bytes;
  foreign[0] = 'X';
  EXPECT_NE(message(foreign).find("magic"), std::string::npos);
  EXPECT_NE(message({}).find("magic"), std::string::npos);
  // A length that would overflow an offset: the last section's length set to 2^63.
  auto huge = bytes;
  const std::size_t momn_len = bytes.size() - 4 - 16 * 4 - 8;
  huge[momn_len + 7] = 0x80;
  EXPECT_NE(message(huge).find("MOMN"), std::string::npos);
  EXPECT_THROW(load_checkpoint(dir_ / "absent.ckpt"), InputError);
  EXPECT_THROW(load_checkpoint(dir_), InputError);
}

TEST_F(Checkpoints, KeepRotatesNewestFirst) {
  Checkpoint c = small_checkpoint();
  for (std::uint64_t step = 1; step <= 4; ++step) {
    c.step = step;
    save_checkpoint(dir_ / "run.ckpt", c, 3);
  }
  EXPECT_EQ(load_checkpoint(dir_ / "run.ckpt").step, 4u);
  EXPECT_EQ(load_checkpoint(dir_ / "run.ckpt.1").step, 3u);
  EXPECT_EQ(load_checkpoint(dir_ / "run.ckpt.2").step, 2u);
  EXPECT_FALSE(fs::exists(dir_ / "run.ckpt.3"));
  for (const auto& e : fs::directory_iterator(dir_))
    EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << e.path();
}

class Recorder : public Observer {
 public:
  void on_step(const StepEvent& e) override { losses.push_back(e.loss); }
  std::vector<double> losses;
};

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

class Resume : public ::testing::TestWithParam<const char*> {};

TEST_P(Resume, IsBitwiseTheUninterruptedRun) {
  Recorder whole;
  Trainer a(resume_config(GetParam(), 2), fixture());
  const Summary full = a.run(whole);

  TrainConfig first_half = resume_config(GetParam(), 1);
  first_half.steps = 11;
  Trainer b(first_half, fixture());
  Recorder first;
  b.run(first);
  const auto bytes = encode_checkpoint(b.checkpoint("{}"));

  Trainer c(resume_config(GetParam(), 2), fixture());
  c.restore(decode_checkpoint(bytes, "mem"), "mem");
  Recorder second;
  const Summary resumed = c.run(second);
  EXPECT_EQ(resumed.steps, 20u);
  EXPECT_EQ(resumed.weights_digest, full.weights_digest);
  first.losses.insert(first.losses.end(), second.losses.begin(), second.losses.end());
  EXPECT_EQ(first.losses, whole.losses);
}

INSTANTIATE_TEST_SUITE_P(Models, Resume,
                         ::testing::Values("mlp:784-64-10",
                                           "conv(4,5)-relu-maxpool(2)-flatten-dropout(0.3)-"
                                           "linear(10)"));

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
  c.sgd.momentum = 0;
  EXPECT_NE(message(c).find("momentum"), std::string::npos);
}

TEST_F(Checkpoints, SigkillWhileSavingNeverLeavesAnUnloadableCheckpoint) {
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

}  // namespace
}  // namespace cohort::train
