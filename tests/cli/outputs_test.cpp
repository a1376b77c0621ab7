// Outputs never replace what the user saved: an output naming an input (the checkpoint, the
// config, the data, through links too, a metrics file), another output or --save's --keep copies,
// or a FIFO or device it would be renamed over, is refused before any work (exit 2), and the
// file it named is left as it was.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "cohort/checkpoint/checkpoint.hpp"
#include "cohort/cli/cli.hpp"
#include "testing.hpp"

namespace cohort::cli {
namespace outputs_test {

namespace fs = std::filesystem;
using testing::Cli;
using testing::cohort;
using testing::Result;

std::string bytes_of(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

// `args` exits 2 before any work, its message names both flags (or the data), and `victim`
// keeps its bytes.
void expect_refused(const std::vector<std::string>& args, const fs::path& victim,
                    const std::vector<std::string>& named) {
  const std::string before = bytes_of(victim);
  const Result r = cohort(args);
  EXPECT_EQ(r.code, kExitBadInput) << args[0] << " " << args[args.size() - 1] << ": " << r.err;
  for (const std::string& n : named) EXPECT_NE(r.err.find(n), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("expected a file of its own"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");  // refused before anything started
  EXPECT_EQ(bytes_of(victim), before) << victim;
}

TEST_F(Cli, AnOutputNamingAnInputOrAnotherOutputIsRefusedAndTheFileKept) {
  const auto ckpt = (dir_ / "run.ckpt").string();
  ASSERT_EQ(cohort(quick({"--quiet", "--steps", "6", "--save", ckpt})).code, kExitOk);
  const auto link = (dir_ / "latest.ckpt").string();
  fs::create_symlink(ckpt, link);

  // export and eval onto the checkpoint they read, directly and through a link.
  expect_refused({"export", "--checkpoint", ckpt, "--format", "onnx", "-o", ckpt}, ckpt,
                 {"-o/--output", "--checkpoint"});
  expect_refused({"export", "--checkpoint", ckpt, "--format", "safetensors", "-o", link}, ckpt,
                 {"-o/--output", "--checkpoint"});
  expect_refused({"eval", "--checkpoint", ckpt, "--data", COHORT_FIXTURE_DIR, "--summary", link},
                 ckpt, {"--summary", "--checkpoint"});

  // train: an output onto --resume's file, onto another output, onto the config.
  expect_refused(quick({"--resume", ckpt, "--summary", ckpt}), ckpt, {"--summary", "--resume"});
  const auto metrics = (dir_ / "m.jsonl").string();
  std::ofstream(metrics) << "{}\n";
  expect_refused(quick({"--metrics", metrics, "--trace", metrics}), metrics,
                 {"--trace", "--metrics"});
  const auto config = (dir_ / "job.toml").string();
  std::ofstream(config) << "[run]\nsteps = 4\n";
  expect_refused(quick({"--config", config, "--summary", config}), config,
                 {"--summary", "--config"});

  // --save may name --resume's file: the run continues it and saves over it.
  Result r = cohort(quick({"--quiet", "--resume", ckpt, "--save", ckpt}));
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(checkpoint::load_checkpoint(ckpt).step, 12u);

  // --save's older copies (--keep) are outputs too, and one --config is read, not two.
  expect_refused(quick({"--save", ckpt, "--keep", "3", "--summary", ckpt + ".2"}), ckpt,
                 {"--summary", "--save's copy (--keep)"});
  // A save stopped between its hard link and its rename leaves FILE and FILE.1 one file: the
  // restart resumes from it (tests/train/resume_test.cpp kills saves at random moments).
  fs::remove(ckpt + ".1");
  fs::create_hard_link(ckpt, ckpt + ".1");
  r = cohort(
      quick({"--quiet", "--steps", "14", "--save", ckpt, "--keep", "2", "--resume", "auto"}));
  EXPECT_EQ(r.code, kExitOk) << r.err;
  r = cohort(quick({"--config", config, "--config", metrics, "--dry-run"}));
  EXPECT_EQ(r.code, kExitBadInput);
  EXPECT_NE(r.err.find("--config: expected one job file, found 2"), std::string::npos) << r.err;

  // plot onto one of the metrics files it reads.
  ASSERT_EQ(cohort(quick({"--quiet", "--metrics", metrics, "--log-every", "2"})).code, kExitOk);
  expect_refused({"plot", metrics, "-o", metrics}, metrics, {"--output", "metrics file"});
}

TEST_F(Cli, AnOutputNamingADataFileIsRefused) {
  const fs::path data = fixture_copy();
  const fs::path labels = data / "train-labels-idx1-ubyte.gz";
  expect_refused(quick({"--data", data.string(), "--metrics", labels.string()}), labels,
                 {"--metrics", "data of --data"});
  // A file of another format's names is refused too: the folder's data may change format.
  const fs::path csv = data / "train.csv";
  Result r = cohort(quick({"--data", data.string(), "--summary", csv.string()}));
  EXPECT_EQ(r.code, kExitBadInput) << r.err;
  EXPECT_FALSE(fs::exists(csv));
  const auto ckpt = (dir_ / "run.ckpt").string();
  ASSERT_EQ(cohort(quick({"--quiet", "--steps", "2", "--save", ckpt})).code, kExitOk);
  expect_refused({"eval", "--checkpoint", ckpt, "--data", data.string(), "--summary",
                  (data / "t10k-images-idx3-ubyte.gz").string()},
                 data / "t10k-images-idx3-ubyte.gz", {"--summary", "data of --data"});
  // A folder of links to the data elsewhere: the files behind the links are the data.
  const fs::path store = dir_ / "store", linked = dir_ / "linked";
  fs::create_directories(store);
  fs::create_directories(linked);
  for (const auto& f : fs::directory_iterator(data)) {
    if (!f.is_regular_file()) continue;
    fs::copy_file(f.path(), store / f.path().filename());
    fs::create_symlink(store / f.path().filename(), linked / f.path().filename());
  }
  expect_refused(quick({"--data", linked.string(), "--summary",
                        (linked / "train-labels-idx1-ubyte.gz").string()}),
                 store / "train-labels-idx1-ubyte.gz", {"--summary", "data of --data"});
  // Beside the data, under another name, is fine.
  EXPECT_EQ(cohort(quick({"--quiet", "--steps", "2", "--data", data.string(), "--summary",
                          (data / "summary.json").string()}))
                .code,
            kExitOk);
}

TEST_F(Cli, AFifoOrDeviceIsNotReplacedByAnOutput) {
  const auto fifo = (dir_ / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  Result r = cohort(quick({"--summary", fifo}));
  EXPECT_EQ(r.code, kExitBadInput);
  EXPECT_NE(r.err.find("which is a FIFO"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
  const auto ckpt = (dir_ / "run.ckpt").string();
  ASSERT_EQ(cohort(quick({"--quiet", "--steps", "2", "--save", ckpt})).code, kExitOk);
  r = cohort({"export", "--checkpoint", ckpt, "--format", "safetensors", "-o", fifo});
  EXPECT_EQ(r.code, kExitBadInput);
  EXPECT_NE(r.err.find("which is a FIFO"), std::string::npos) << r.err;
  EXPECT_TRUE(fs::is_fifo(fifo));
  // The metrics are a stream, written to the FIFO, not renamed over it (a dry run opens nothing).
  r = cohort(quick({"--metrics", fifo, "--dry-run"}));
  EXPECT_EQ(r.code, kExitOk) << r.err;
  r = cohort(
      {"eval", "--checkpoint", ckpt, "--data", COHORT_FIXTURE_DIR, "--summary", "/dev/null"});
  EXPECT_EQ(r.code, kExitBadInput);
  EXPECT_NE(r.err.find("which is a device"), std::string::npos) << r.err;
  EXPECT_TRUE(fs::is_character_file("/dev/null"));
}

}  // namespace outputs_test
}  // namespace cohort::cli
