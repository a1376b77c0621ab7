// `cohort train --dry-run` and cli::check_train: every input checked, exit 0 or 2, the effective
// config printed, nothing trained and no file written; and the loaders a caller injects.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "cohort/cli/cli.hpp"
#include "cohort/core/error.hpp"
#include "testing.hpp"

namespace cohort::cli {
namespace train_command_test {

namespace fs = std::filesystem;
using testing::cohort;
using testing::Result;

class CliDryRun : public testing::TempDirTest {
 protected:
  // A quick run's flags, with every output file in dir_.
  std::vector<std::string> with_outputs(std::vector<std::string> extra = {}) {
    std::vector<std::string> a{"train",
                               "--data",
                               COHORT_FIXTURE_DIR,
                               "--model",
                               "mlp:784-32-10",
                               "--batch",
                               "64",
                               "--steps",
                               "4",
                               "--summary",
                               (dir_ / "s.json").string(),
                               "--metrics",
                               (dir_ / "m.jsonl").string(),
                               "--trace",
                               (dir_ / "t.json").string(),
                               "--save",
                               (dir_ / "c.ckpt").string(),
                               "--dry-run"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  bool nothing_written() const { return fs::is_empty(dir_); }
};

TEST_F(CliDryRun, ChecksPrintsTheConfigAndWritesNothing) {
  Result r = cohort(with_outputs());
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_NE(r.out.find("every input checked, nothing trained or written"), std::string::npos);
  // The config as aligned lines, one a section, not one JSON object.
  EXPECT_NE(r.out.find("\n  model      mlp:784-32-10\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\n  run        batch=64 "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\n  optimizer  sgd lr=0.1 momentum=0.9 "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\n  schedule   cosine warmup_steps=200 "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\n  engine     reducer=tree "), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find('{'), std::string::npos) << r.out;
  // workers and micro-batch resolved for this machine, as the run would use them.
  EXPECT_NE(r.out.find(" workers="), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find(" workers=0 "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" micro_batch="), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find(" micro_batch=0 "), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("train loss"), std::string::npos) << "trained: " << r.out;
  EXPECT_EQ(r.out.find("\nsummary\n"), std::string::npos) << "trained: " << r.out;
  EXPECT_TRUE(nothing_written());
}

TEST_F(CliDryRun, ConfigFileAndFlagsGiveTheSameConfigAsARun) {
  const auto cfg = dir_ / "job.toml";
  std::ofstream(cfg) << "[model]\nspec = \"mlp:784-32-10\"\n[optimizer]\nkind = \"adamw\"\n"
                     << "lr = 0.002\n[run]\nreducer = \"serial\"\n";
  Result r = cohort({"train", "--config", cfg.string(), "--data", COHORT_FIXTURE_DIR, "--lr",
                     "0.003", "--dry-run"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_NE(r.out.find("  optimizer  adamw lr=0.003 "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" reducer=serial "), std::string::npos) << r.out;
  fs::remove(cfg);
  EXPECT_TRUE(nothing_written());
}

TEST_F(CliDryRun, ChecksTheCheckpointToResume) {
  const auto ckpt = (dir_ / "run.ckpt").string();
  ASSERT_EQ(cohort({"train", "--data", COHORT_FIXTURE_DIR, "--model", "mlp:784-32-10", "--batch",
                    "64", "--steps", "2", "--quiet", "--save", ckpt})
                .code,
            kExitOk);
  const auto written = fs::last_write_time(ckpt);
  Result r = cohort(with_outputs({"--resume", ckpt}));
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_NE(r.out.find("would resume from " + ckpt + " at step 2"), std::string::npos) << r.out;
  EXPECT_EQ(fs::last_write_time(ckpt), written);
  // Another run's checkpoint (another seed) is refused by the dry run, naming the field.
  r = cohort(with_outputs({"--resume", ckpt, "--seed", "7"}));
  EXPECT_EQ(r.code, kExitBadInput);
  EXPECT_NE(r.err.find("--seed: this run has 7, the checkpoint 1"), std::string::npos) << r.err;
  fs::resize_file(ckpt, fs::file_size(ckpt) / 2);
  r = cohort(with_outputs({"--resume", ckpt}));
  EXPECT_EQ(r.code, kExitBadInput);
  EXPECT_NE(r.err.find(ckpt), std::string::npos) << r.err;
}

struct BadInput {
  std::string name;
  std::vector<std::string> flags;
  std::string needle;  // in the message
};

void PrintTo(const BadInput& input, std::ostream* os) { *os << input.name; }

class CliDryRunRefuses : public CliDryRun, public ::testing::WithParamInterface<BadInput> {};

TEST_P(CliDryRunRefuses, WithExitTwoNamingTheInputAndWritesNothing) {
  Result r = cohort(with_outputs(GetParam().flags));
  EXPECT_EQ(r.code, kExitBadInput) << r.out;
  EXPECT_NE(r.err.find(GetParam().needle), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_TRUE(nothing_written());
}

INSTANTIATE_TEST_SUITE_P(
    Inputs, CliDryRunRefuses,
    ::testing::Values(
        BadInput{"ModelAgainstData", {"--model", "mlp:100-10"}, "input size of 784"},
        BadInput{"ModelSpec", {"--model", "conv(3)"}, "--model"},
        BadInput{"MicroBatchAboveBatch", {"--micro-batch", "65"}, "--micro-batch"},
        BadInput{"BatchAboveTrainingSet", {"--batch", "100000"}, "--batch"},
        BadInput{"RangeOfAFlag", {"--momentum", "1"}, "--momentum: expected"},
        BadInput{"DataFolder", {"--data", "/nonexistent/fashion"}, "/nonexistent/fashion"},
        BadInput{"OutputFolder", {"--summary", "/proc/version/s.json"}, "--summary"},
        BadInput{"SaveEveryWithoutSave", {"--save", "", "--save-every", "2"}, "--save-every"},
        BadInput{"MissingCheckpoint", {"--resume", "/nonexistent.ckpt"}, "--resume"},
        BadInput{"Schedule", {"--schedule", "step"}, "--lr-step-every"},
        BadInput{"ConfigFile", {"--config", "/nonexistent.toml"}, "/nonexistent.toml"}),
    [](const ::testing::TestParamInfo<BadInput>& p) { return p.param.name; });

// Loaders that count their calls and serve the fixture (loaded once) for any folder.
struct CountingLoaders {
  int config = 0, data = 0, checkpoint = 0;
  std::vector<std::string> config_flags;
  Loaders loaders() {
    static const auto fixture =
        std::make_shared<const data::Splits>(data::load_image_folder(COHORT_FIXTURE_DIR));
    return {.config =
                [this](const std::string&, const config::Schema&) {
                  ++config;
                  return config_flags;
                },
            .data =
                [this](const std::string&, std::size_t) {
                  ++data;
                  return fixture;
                },
            .checkpoint = [this](const std::string& path) -> checkpoint::Checkpoint {
              ++checkpoint;
              throw InputError(path + ": no checkpoint here");
            }};
  }
};

class CliCheckTrain : public testing::TempDirTest {};

// check_train is a dry run whatever the flags say, and reads through the loaders it is given.
TEST_F(CliCheckTrain, IsADryRunWithTheInjectedLoaders) {
  CountingLoaders counting;
  std::ostringstream out, err;
  const std::string summary = (dir_ / "s.json").string();
  const int code = check_train({"--data", dir_.string(), "--model", "mlp:784-16-10", "--batch",
                                "32", "--steps", "1", "--summary", summary, "--dry-run=false"},
                               out, err, counting.loaders());
  EXPECT_EQ(code, kExitOk) << err.str();
  EXPECT_EQ(counting.data, 1);
  EXPECT_EQ(counting.config, 0);
  EXPECT_NE(out.str().find("nothing trained or written"), std::string::npos) << out.str();
  EXPECT_TRUE(fs::is_empty(dir_));
}

TEST_F(CliCheckTrain, RefusesWhatTheInjectedConfigSays) {
  CountingLoaders counting;
  counting.config_flags = {"--batch", "0"};
  std::ostringstream out, err;
  const std::string cfg = (dir_ / "job.toml").string();
  std::ofstream(cfg) << "# the loader, not this file, gives the flags\n";
  const int code = check_train({"--config", cfg}, out, err, counting.loaders());
  EXPECT_EQ(code, kExitBadInput);
  EXPECT_EQ(counting.config, 1);
  EXPECT_NE(err.str().find("--batch: expected an integer >= 1"), std::string::npos) << err.str();
}

TEST_F(CliCheckTrain, ReportsTheLoadersErrorsAsBadInput) {
  CountingLoaders counting;
  std::ostringstream out, err;
  const std::string ckpt = (dir_ / "c.ckpt").string();
  std::ofstream(ckpt) << "x";
  const int code = check_train({"--resume", ckpt}, out, err, counting.loaders());
  EXPECT_EQ(code, kExitBadInput);
  EXPECT_EQ(counting.checkpoint, 1);
  EXPECT_NE(err.str().find("no checkpoint here"), std::string::npos) << err.str();
}

// CSV as the dry run counts it: a UTF-8 byte-order mark and CRLF do not cost the first sample,
// and a first line of numbers only (pandas' "0,1,2") is a sample by the header rule, while one
// with any non-numeric cell is a header.
TEST_F(CliDryRun, CountsCsvSamplesByTheHeaderRule) {
  std::ofstream(dir_ / "train.csv", std::ios::binary) << "\xEF\xBB\xBF"
                                                      << "1,0.5,2\r\n0,1,2\r\n1,3,4\r\n";
  std::ofstream(dir_ / "test.csv", std::ios::binary) << "0,1,2\n1,0.5,2\n0,1,2\n";
  const std::vector<std::string> args{"train",   "--data",  dir_.string(), "--model",
                                      "mlp:2-2", "--batch", "1",           "--dry-run"};
  Result r = cohort(args);
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_NE(r.out.find("(3 train, 3 test samples of 2 tabular features)"), std::string::npos)
      << r.out;
  std::ofstream(dir_ / "test.csv", std::ios::binary) << "y,a,2\n1,0.5,2\n0,1,2\n";
  r = cohort(args);
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_NE(r.out.find("(3 train, 2 test samples of 2 tabular features)"), std::string::npos)
      << r.out;
}

}  // namespace train_command_test
}  // namespace cohort::cli
