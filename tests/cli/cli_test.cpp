// The command line: exit codes, messages that name the bad input, and the files it writes.
#include "cohort/cli/cli.hpp"
#include "cohort/core/cpu.hpp"
#include "cohort/nn/batch_grad.hpp"
#include "cohort/nn/linear_floor.hpp"
#include "cohort/nn/version.hpp"
#include "cohort/version.hpp"
#include "testing.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <sstream>

namespace cohort::cli {
namespace cli_test {

namespace fs = std::filesystem;
using testing::Cli;
using testing::cohort;
using testing::Result;

TEST_F(Cli, TrainWritesSummaryAndMetrics) {
  auto summary = (dir_ / "s.json").string(), metrics = (dir_ / "m.jsonl").string();
  Result r = cohort(quick({"--summary", summary, "--metrics", metrics, "--log-every", "4"}));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("summary"), std::string::npos);
  auto j = nlohmann::json::parse(std::ifstream(summary));
  EXPECT_EQ(j["steps"], 12);
  EXPECT_EQ(j["workers"], 2);
  for (const char* key : {"epochs", "samples_per_second", "train_loss", "test_accuracy",
                          "weights_digest", "time", "config"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_GT(j["samples_per_second"].get<double>(), 0);
  std::ifstream m(metrics);
  std::string line;
  int steps = 0, epochs = 0;
  while (std::getline(m, line)) {
    auto l = nlohmann::json::parse(line);
    (l["kind"] == "step" ? steps : epochs)++;
  }
  EXPECT_EQ(steps, 3);   // every 4 of 12 steps
  EXPECT_EQ(epochs, 2);  // 8 steps per fixture epoch: one full epoch and part of the second
  EXPECT_FALSE(fs::exists(summary + ".tmp"));
}

// A step line's loss is the mean over its own interval, printed or not: the two lines of the
// first epoch (steps 1-4 and 5-8) average to the epoch's train loss.
TEST_F(Cli, StepLinesAverageTheirIntervalEvenWhenQuiet) {
  auto metrics = (dir_ / "m.jsonl").string();
  ASSERT_EQ(cohort(quick({"--quiet", "--metrics", metrics, "--log-every", "4"})).code, 0);
  std::ifstream m(metrics);
  std::vector<double> step_loss;
  double epoch1 = 0;
  for (std::string line; std::getline(m, line);) {
    auto l = nlohmann::json::parse(line);
    if (l["kind"] == "step") step_loss.push_back(l["loss"].get<double>());
    if (l["kind"] == "epoch" && l["epoch"] == 1) epoch1 = l["train_loss"].get<double>();
  }
  ASSERT_EQ(step_loss.size(), 3u);
  EXPECT_NEAR((step_loss[0] + step_loss[1]) / 2, epoch1, 1e-9);
}

TEST_F(Cli, QuietPrintsNothing) {
  Result r = cohort(quick({"--quiet"}));
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.out, "");
}

TEST_F(Cli, BadInputExitsTwoNamingWhatIsWrong) {
  struct Bad {
    std::vector<std::string> args;
    std::string needle;
  };
  std::ofstream(dir_ / "a_file") << "a file, not a folder\n";
  const std::vector<Bad> cases = {
      {{"train", "--bogus"}, "--bogus"},
      {{"train", "--batch", "abc"}, "abc"},
      {{"train", "--lr", "0", "--data", COHORT_FIXTURE_DIR}, "lr"},
      {{"train", "--data", (dir_ / "nowhere").string()}, "nowhere"},
      {quick({"--batch", "0"}), "--batch"},
      {quick({"--model", "mlp:10-10"}), "input size of 784"},
      {quick({"--model", "resnet"}), "--model"},
      {quick({"--summary", (dir_ / "a_file/dir/s.json").string()}), "--summary"},
      {quick({"--metrics", dir_.string()}), "a directory"},
      {quick({"--reducer", "fastest"}), "fastest"},
      {quick({"--micro-batch", "65"}), "--micro-batch"},
      {quick({"--optimizer", "rmsprop"}), "--optimizer: expected sgd, adam or adamw"},
      {quick({"--schedule", "linear"}), "--schedule: expected constant, step or cosine"},
      {quick({"--schedule", "step"}), "--lr-step-every"},
      {quick({"--schedule", "step", "--lr-step-every", "5", "--lr-gamma", "0"}), "--lr-gamma"},
      {quick({"--schedule", "cosine", "--min-lr", "0.5"}), "--min-lr"},
      {quick({"--optimizer", "adam", "--beta2", "1"}), "--beta2"},
      {quick({"--clip-norm", "-1"}), "--clip-norm"},
      {quick({"--on-nonfinite", "ignore"}), "--on-nonfinite: expected stop or skip"},
      {quick({"--weight-grads", "gemm"}), "--weight-grads: expected batch or leaf"},
      {quick({"--max-skips", "0"}), "--max-skips"},
      {quick({"--trace", dir_.string()}), "--trace"},
      {{}, "subcommand"},
  };
  for (const auto& c : cases) {
    Result r = cohort(c.args);
    EXPECT_EQ(r.code, kExitBadInput) << c.needle << ": " << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << r.err;
  }
}

TEST_F(Cli, SameSeedSameDigest) {
  auto s1 = (dir_ / "a.json").string(), s2 = (dir_ / "b.json").string();
  ASSERT_EQ(cohort(quick({"--quiet", "--summary", s1, "--workers", "1"})).code, 0);
  ASSERT_EQ(cohort(quick({"--quiet", "--summary", s2, "--workers", "2"})).code, 0);
  auto a = nlohmann::json::parse(std::ifstream(s1)), b = nlohmann::json::parse(std::ifstream(s2));
  EXPECT_EQ(a["weights_digest"], b["weights_digest"]);
}

TEST_F(Cli, SaveResumeAndEvalGiveTheUninterruptedRun) {
  // SGD with momentum, and AdamW (two state arrays in the checkpoint).
  for (const std::vector<std::string>& optimizer :
       {std::vector<std::string>{},
        std::vector<std::string>{"--optimizer", "adamw", "--lr", "0.002"}}) {
    const std::string tag = optimizer.empty() ? "sgd" : "adamw";
    const auto full = (dir_ / (tag + "-full.json")).string();
    const auto resumed = (dir_ / (tag + "-resumed.json")).string();
    const auto ckpt = (dir_ / (tag + ".ckpt")).string(),
               eval = (dir_ / (tag + "-eval.json")).string();
    auto with = [&](std::vector<std::string> extra) {
      extra.insert(extra.end(), optimizer.begin(), optimizer.end());
      return quick(extra);
    };
    ASSERT_EQ(cohort(with({"--quiet", "--summary", full})).code, 0);
    auto half = with({"--quiet", "--save", ckpt});
    half[8] = "5";  // --steps 5 of 12
    ASSERT_EQ(cohort(half).code, 0);
    Result r = cohort(with({"--resume", ckpt, "--summary", resumed, "--save", ckpt}));
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("resumed from"), std::string::npos);
    auto a = nlohmann::json::parse(std::ifstream(full));
    auto b = nlohmann::json::parse(std::ifstream(resumed));
    EXPECT_EQ(a["weights_digest"], b["weights_digest"]) << tag;
    EXPECT_EQ(b["steps"], 12);
    Result e =
        cohort({"eval", "--checkpoint", ckpt, "--data", COHORT_FIXTURE_DIR, "--summary", eval});
    ASSERT_EQ(e.code, 0) << tag << ": " << e.err;
    auto j = nlohmann::json::parse(std::ifstream(eval));
    EXPECT_EQ(j["step"], 12);
    EXPECT_EQ(j["weights_digest"], a["weights_digest"]) << tag;
    EXPECT_EQ(j["test_accuracy"], a["test_accuracy"]) << tag;
  }
}

TEST_F(Cli, BadCheckpointsExitTwoBeforeTraining) {
  const auto ckpt = (dir_ / "run.ckpt").string();
  ASSERT_EQ(cohort(quick({"--quiet", "--save", ckpt})).code, 0);
  std::filesystem::resize_file(ckpt, std::filesystem::file_size(ckpt) / 2);
  Result r = cohort(quick({"--resume", ckpt}));
  EXPECT_EQ(r.code, kExitBadInput);
  EXPECT_NE(r.err.find(ckpt), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");  // refused before anything started
  EXPECT_EQ(cohort({"eval", "--checkpoint", ckpt, "--data", COHORT_FIXTURE_DIR}).code,
            kExitBadInput);
  EXPECT_EQ(cohort(quick({"--save-every", "3"})).code, kExitBadInput);  // no --save
  EXPECT_EQ(cohort(quick({"--save", dir_.string()})).code, kExitBadInput);
}

// At most one save per step: the last periodic save (step 8) is also the final one, so --keep 2
// holds steps 8 and 4, not two copies of step 8.
TEST_F(Cli, KeepHoldsDistinctStepsWhenTheLastPeriodicSaveIsTheFinalStep) {
  const auto ckpt = (dir_ / "run.ckpt").string();
  Result r = cohort(
      quick({"--quiet", "--steps", "8", "--save", ckpt, "--save-every", "4", "--keep", "2"}));
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(checkpoint::load_checkpoint(ckpt).step, 8u);
  EXPECT_EQ(checkpoint::load_checkpoint(ckpt + ".1").step, 4u);
}

// --save naming a link writes the link's target, with the kept copies beside the target; a link
// whose target's folders are missing has them created; one whose target lies under a file is
// refused before anything starts.
TEST_F(Cli, SaveThroughALinkWritesItsTarget) {
  fs::create_directories(dir_ / "scratch");
  const auto link = (dir_ / "latest.ckpt").string();
  fs::create_symlink(dir_ / "scratch" / "run.ckpt", link);
  Result r = cohort(
      quick({"--quiet", "--steps", "8", "--save", link, "--save-every", "4", "--keep", "2"}));
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_EQ(checkpoint::load_checkpoint(dir_ / "scratch" / "run.ckpt").step, 8u);
  EXPECT_EQ(checkpoint::load_checkpoint(dir_ / "scratch" / "run.ckpt.1").step, 4u);
  const auto dangling = (dir_ / "dangling.ckpt").string();
  fs::create_symlink(dir_ / "no_such_folder" / "run.ckpt", dangling);
  r = cohort(quick({"--quiet", "--save", dangling}));
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_TRUE(fs::is_symlink(dangling));
  EXPECT_EQ(checkpoint::load_checkpoint(dir_ / "no_such_folder" / "run.ckpt").step, 12u);
  std::ofstream(dir_ / "a_file") << "a file, not a folder\n";
  const auto blocked = (dir_ / "blocked.ckpt").string();
  fs::create_symlink(dir_ / "a_file" / "run.ckpt", blocked);
  r = cohort(quick({"--save", blocked}));
  EXPECT_EQ(r.code, kExitBadInput);
  EXPECT_NE(r.err.find("a_file is not a folder"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");  // refused before anything started
}

TEST_F(Cli, ConfigFileWithFlagsOverridingIt) {
  const auto cfg = dir_ / "job.toml", summary = dir_ / "s.json";
  std::ofstream(cfg) << "[data]\ndir = \"" << COHORT_FIXTURE_DIR << "\"\n"
                     << "[model]\nspec = \"mlp:784-32-10\"\n"
                     << "[run]\nbatch = 64\nsteps = 6\nworkers = 2\n"
                     << "[optimizer]\nlr = 0.2\nnesterov = true\n"
                     << "[output]\nquiet = true\nsummary = \"" << summary.string() << "\"\n";
  ASSERT_EQ(cohort({"train", "--config", cfg.string(), "--lr", "0.1"}).code, 0);
  auto j = nlohmann::json::parse(std::ifstream(summary));
  EXPECT_EQ(j["steps"], 6);
  EXPECT_NEAR(j["config"]["optimizer"]["lr"].get<double>(), 0.1,
              1e-7);                                      // the flag wins over the file
  EXPECT_EQ(j["config"]["optimizer"]["nesterov"], true);  // the file's value stays
  EXPECT_EQ(j["config"]["model"], "mlp:784-32-10");
}

// A run's summary fed back with --config repeats the run: the same effective config (but the
// workers, the machine's) and the same weights, on any worker count. Its kernel set, where it
// differs from this machine's, is named in the header; a JSON file that is neither a summary nor
// an effective config is exit 2 naming it.
TEST_F(Cli, ASummaryFedBackAsConfigRepeatsTheRun) {
  const auto s1 = (dir_ / "s1.json").string(), s2 = (dir_ / "s2.json").string();
  ASSERT_EQ(cohort(quick({"--quiet", "--workers", "1", "--summary", s1, "--optimizer", "adamw",
                          "--lr", "0.003", "--keep-last", "--augment", "flip", "--seed", "11",
                          "--schedule", "step", "--lr-step-every", "3"}))
                .code,
            kExitOk);
  Result r = cohort({"train", "--config", s1, "--workers", "2", "--summary", s2});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(r.out.find("note: the config was written where"), std::string::npos) << r.out;
  auto a = nlohmann::json::parse(std::ifstream(s1)), b = nlohmann::json::parse(std::ifstream(s2));
  EXPECT_EQ(a["weights_digest"], b["weights_digest"]);
  EXPECT_EQ(b["workers"], 2);
  a["config"].erase("workers");
  b["config"].erase("workers");
  EXPECT_EQ(a["config"], b["config"]);
  r = cohort({"train", "--config", s1, "--kernels", "onednn:sse41,cohort:portable,openblas:x",
              "--dry-run"});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_NE(r.out.find("note: the config was written where the kernels were onednn:sse41"),
            std::string::npos)
      << r.out;
  const auto bad = (dir_ / "bad.json").string();
  std::ofstream(bad) << "[1, 2]";
  r = cohort({"train", "--config", bad});
  EXPECT_EQ(r.code, kExitBadInput);
  EXPECT_NE(r.err.find(bad + ": --config: expected a JSON object"), std::string::npos) << r.err;
}

TEST_F(Cli, BadConfigsAreRefusedWithFileLineAndKey) {
  struct Bad {
    std::string toml;
    int line;
    std::string key;  // or the words the message must hold
  };
  const std::string ro = (dir_ / "ro").string();
  std::filesystem::create_directories(ro);
  std::filesystem::permissions(
      ro, std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
  const bool root_ignores_modes = ::access(ro.c_str(), W_OK) == 0;  // root writes anyway
  const std::string file = (dir_ / "a_file").string();  // no folder can be made under it
  std::ofstream(file) << "a file, not a folder\n";
  std::vector<Bad> cases = {
      {"[run]\nbatchsize = 64\n", 2, "run.batchsize"},
      {"lr = 0.1\n", 1, "'lr'"},
      {"[optimizer]\nlr = \"fast\"\n", 2, "optimizer.lr"},
      {"[run]\nbatch = 64\nbatch = 32\n", 3, "batch"},
      {"[run\nbatch = 64\n", 1, ""},
      {"[optimizer]\nlr = -0.1\n", 2, "optimizer.lr"},
      {"[optimizer]\nlr = 0\n", 2, "optimizer.lr"},
      {"[optimizer]\nmomentum = 1.0\n", 2, "optimizer.momentum"},
      {"[run]\nbatch = 0\n", 2, "run.batch"},
      {"[run]\nworkers = 5000\n", 2, "run.workers"},
      {"[run]\nworkers = -1\n", 2, "run.workers"},
      {"[run]\nmicro_batch = 1.5\n", 2, "run.micro_batch"},
      {"[run]\nepochs = \"5\"\n", 2, "run.epochs"},
      {"[data]\ndir = \"/nonexistent/fashion\"\n", 2, "data.dir"},
      {"[output]\nsummary = \"" + file + "/dir/s.json\"\n", 2, "output.summary"},
      {"[model]\nspec = \"\"\n", 2, "model.spec"},
      {"[optimizer]\nnesterov = 1\n", 2, "optimizer.nesterov"},
      {"[checkpoint]\nkeep = 0\n", 2, "checkpoint.keep"},
      {"[checkpoint]\nresume = \"/nonexistent.ckpt\"\n", 2, "checkpoint.resume"},
      {"[optimizer]\nkind = \"rmsprop\"\n", 2, "optimizer.kind"},
      {"[optimizer]\nbeta2 = 1.0\n", 2, "optimizer.beta2"},
      {"[optimizer]\nclip_norm = -1.0\n", 2, "optimizer.clip_norm"},
      {"[schedule]\nkind = 3\n", 2, "schedule.kind"},
      {"[schedule]\ngamma = 0.0\n", 2, "schedule.gamma"},
      {"[schedule]\nstep_every = 0\n", 2, "schedule.step_every"},
      {"[run]\non_nonfinite = \"ignore\"\n", 2, "run.on_nonfinite"},
      {"[run]\nweight_grads = \"gemm\"\n", 2, "run.weight_grads"},
      {"[run]\nmax_skips = 0\n", 2, "run.max_skips"},
      {"[output]\ntrace = \"" + file + "/dir/t.json\"\n", 2, "output.trace"},
  };
  if (!root_ignores_modes)
    cases.push_back({"[output]\nmetrics = \"" + ro + "/m.jsonl\"\n", 2, "output.metrics"});
  int n = 0;
  for (const auto& c : cases) {
    const auto cfg = dir_ / ("bad" + std::to_string(n++) + ".toml");
    std::ofstream(cfg) << c.toml;
    // --data would replace the file's data.dir before any check: given only where the file has
    // none.
    std::vector<std::string> args{"train", "--config", cfg.string()};
    if (c.toml.find("[data]") == std::string::npos)
      args.insert(args.end(), {"--data", COHORT_FIXTURE_DIR});
    Result r = cohort(args);
    EXPECT_EQ(r.code, kExitBadInput) << c.toml;
    EXPECT_NE(r.err.find(cfg.string() + ":" + std::to_string(c.line) + ":"), std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find(c.key), std::string::npos) << r.err;
    EXPECT_EQ(r.out, "") << "started before refusing: " << c.toml;
  }
  EXPECT_GE(n, 15);
}

TEST_F(Cli, OptimizerAndScheduleReachTheSummaryAndMetrics) {
  auto summary = (dir_ / "s.json").string(), metrics = (dir_ / "m.jsonl").string();
  Result r = cohort(quick({"--optimizer", "adamw", "--lr", "0.002", "--weight-decay", "0.01",
                           "--schedule", "cosine", "--warmup-steps", "3", "--clip-norm", "5",
                           "--summary", summary, "--metrics", metrics, "--log-every", "1"}));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("\n  optimizer  adamw lr=0.002 "), std::string::npos)
      << "effective config printed: " << r.out;
  auto j = nlohmann::json::parse(std::ifstream(summary));
  EXPECT_EQ(j["config"]["optimizer"]["kind"], "adamw");
  EXPECT_EQ(j["config"]["schedule"]["kind"], "cosine");
  EXPECT_EQ(j["config"]["schedule"]["warmup_steps"], 3);
  EXPECT_EQ(j["updates"], 12);
  EXPECT_EQ(j["skipped_steps"], 0);
  std::ifstream m(metrics);
  std::vector<double> lr;
  for (std::string line; std::getline(m, line);) {
    auto l = nlohmann::json::parse(line);
    if (l["kind"] != "step") continue;
    lr.push_back(l["lr"].get<double>());
    EXPECT_GT(l["grad_norm"].get<double>(), 0);  // computed with clipping on
  }
  ASSERT_EQ(lr.size(), 12u);
  EXPECT_NEAR(lr[0], 0.002 / 3, 1e-9);  // warmup
  EXPECT_NEAR(lr[2], 0.002, 1e-9);
  EXPECT_LT(lr[11], lr[3]);  // cosine decay
}

TEST_F(Cli, SkippedStepsAreReportedAndTooManyStopTheRun) {
  auto metrics = (dir_ / "m.jsonl").string();
  Result r =
      cohort(quick({"--lr", "1e12", "--momentum", "0", "--on-nonfinite", "skip", "--max-skips", "3",
                    "--steps", "100", "--metrics", metrics, "--log-every", "1"}));
  EXPECT_EQ(r.code, kExitInternal);
  EXPECT_NE(r.err.find("3 steps in a row skipped"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("skipped: non-finite loss"), std::string::npos) << r.out;
  std::ifstream m(metrics);
  int skips = 0;
  for (std::string line; std::getline(m, line);)
    skips += nlohmann::json::parse(line)["kind"] == "skip";
  EXPECT_EQ(skips, 2);  // the third stops the run before it is reported
}

TEST_F(Cli, TraceIsAChromeTraceWithATrackPerReplica) {
  auto trace = (dir_ / "t.json").string();
  Result r = cohort(quick({"--trace", trace, "--micro-batch", "16"}));
  ASSERT_EQ(r.code, 0) << r.err;
  auto j = nlohmann::json::parse(std::ifstream(trace));
  std::map<int, std::string> thread_names;
  int forwards = 0, backwards = 0;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name")
      thread_names[e["tid"].get<int>()] = e["args"]["name"];
    if (e["ph"] != "X") continue;
    ASSERT_TRUE(e["ts"].is_number() && e["dur"].is_number() && e["dur"].get<double>() >= 0);
    ASSERT_TRUE(e["args"]["step"].is_number());
    forwards += e["name"] == "forward";
    backwards += e["name"] == "backward";
  }
  EXPECT_EQ(thread_names[0], "replica 0");
  EXPECT_EQ(thread_names[1], "replica 1");
  EXPECT_EQ(thread_names[3], "controller");
  EXPECT_EQ(forwards, 12 * 4);  // 12 steps of 4 leaves
  EXPECT_EQ(backwards, 12 * 4);
  EXPECT_EQ(j["otherData"]["truncated"], false);
  EXPECT_EQ(j["otherData"]["tool"], "cohort " COHORT_VERSION);  // project(VERSION), one place
}

TEST_F(Cli, PlainProgressLinesShowTheEta) {
  Result r = cohort(quick({"--log-every", "4"}));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("epoch 2/2  step 4/8"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ETA 0:00:"), std::string::npos) << r.out;
  // 12 steps of 8-step epochs: the first epoch ends, the run ends inside the second.
  EXPECT_NE(r.out.find("epoch 1 done: train loss"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("step 12 (end of run): train loss"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("epoch 2 done"), std::string::npos) << r.out;
}

TEST_F(Cli, ARunInsideItsFirstEpochCountsItsOwnSteps) {
  // The fixture's epoch is 8 steps of 64: 6 steps end inside it (a language model's recipe is
  // 2,000 steps of an epoch of 80,000); 8 steps end with it.
  Result r = cohort({"train", "--data", COHORT_FIXTURE_DIR, "--model", "mlp:784-32-10", "--batch",
                     "64", "--steps", "6", "--workers", "2", "--log-every", "3"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("step 3/6  loss"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("step 6 (end of run): train loss"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("epoch 1"), std::string::npos) << r.out;
  r = cohort(quick({"--steps", "8", "--log-every", "4"}));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("epoch 1/1  step 4/8  loss"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("epoch 1 done: train loss"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("end of run"), std::string::npos) << r.out;
}

TEST_F(Cli, PlotDrawsTheMetricsOfOneOrMoreRuns) {
  fs::create_directories(dir_ / "a");
  fs::create_directories(dir_ / "b");
  auto ma = (dir_ / "a/m.jsonl").string(), mb = (dir_ / "b/m.jsonl").string();
  ASSERT_EQ(cohort(quick({"--quiet", "--metrics", ma, "--log-every", "2"})).code, 0);
  ASSERT_EQ(cohort(quick({"--quiet", "--metrics", mb, "--log-every", "2", "--lr", "0.01"})).code,
            0);
  const auto svg = (dir_ / "curves.svg").string();
  Result r = cohort({"plot", ma, mb, "-o", svg, "--title", "two runs"});
  ASSERT_EQ(r.code, 0) << r.err;
  std::ifstream f(svg);
  const std::string text((std::istreambuf_iterator<char>(f)), {});
  EXPECT_EQ(text.rfind("<svg", 0) == 0 || text.rfind("<?xml", 0) == 0, true) << text.substr(0, 80);
  EXPECT_NE(text.find("two runs"), std::string::npos);
  // Both files are called m.jsonl: the legend tells them apart by folder.
  EXPECT_NE(text.find((dir_ / "a/m.jsonl").string()), std::string::npos);
  EXPECT_NE(text.find((dir_ / "b/m.jsonl").string()), std::string::npos);
  // Bad input: exit 2 naming the file and line, and nothing written.
  const auto bad = (dir_ / "bad.jsonl").string();
  std::ofstream(bad) << "{\"kind\":\"step\",\"step\":1,\"loss\":0.5}\nnot json\n";
  const auto svg2 = (dir_ / "no.svg").string();
  r = cohort({"plot", bad, "-o", svg2});
  EXPECT_EQ(r.code, kExitBadInput);
  EXPECT_NE(r.err.find(bad + ":2"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(svg2));
  std::ofstream(dir_ / "a_file") << "a file, not a folder\n";
  EXPECT_EQ(cohort({"plot", ma, "-o", (dir_ / "a_file/x.svg").string()}).code, kExitBadInput);
  EXPECT_EQ(cohort({"plot", ma, "-o", (dir_ / "plots/x.svg").string()}).code, kExitOk);
  EXPECT_TRUE(fs::is_regular_file(dir_ / "plots/x.svg"));         // its folder created
  EXPECT_EQ(cohort({"plot", ma, "-o", ""}).code, kExitBadInput);  // not a failed write (74)
  // A loss past 1e300 would overflow the axis (its ticks ran without end): refused.
  const auto huge = (dir_ / "huge.jsonl").string();
  std::ofstream(huge) << "{\"kind\":\"step\",\"step\":1,\"loss\":-1.7e308}\n"
                      << "{\"kind\":\"step\",\"step\":2,\"loss\":1}\n";
  r = cohort({"plot", huge, "-o", svg2});
  EXPECT_EQ(r.code, kExitBadInput);
  EXPECT_NE(r.err.find(huge + ":1: loss: expected a number of magnitude at most 1e300"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(cohort({"plot", (dir_ / "absent.jsonl").string(), "-o", svg2}).code, kExitBadInput);
}

// A data file that is a loop of links is bad input naming it (exit 2), not an internal error.
TEST_F(Cli, ALoopOfLinksInTheDataIsBadInput) {
  const fs::path data = fixture_copy();
  const fs::path labels = data / "t10k-labels-idx1-ubyte.gz";
  fs::remove(labels);
  fs::create_symlink(labels.filename(), labels);
  Result r = cohort(quick({"--data", data.string()}));
  EXPECT_EQ(r.code, kExitBadInput) << r.err;
  EXPECT_NE(r.err.find(labels.string() + ": file: expected an existing file"), std::string::npos)
      << r.err;
}

TEST_F(Cli, ExampleConfigsParse) {
  // The examples write to runs/ relative to where they are run (the repository root, where
  // scripts/train.sh makes it): run them from a folder that has one.
  std::filesystem::create_directories(dir_ / "runs");
  const auto cwd = std::filesystem::current_path();
  std::filesystem::current_path(dir_);
  for (const char* name : {"mlp.toml", "cnn.toml"}) {
    const auto path =
        std::filesystem::canonical(std::filesystem::path(COHORT_FIXTURE_DIR) / "../../examples") /
        name;
    Result r = cohort({"train", "--config", path.string(), "--data", COHORT_FIXTURE_DIR, "--steps",
                       "1", "--quiet", "--summary", (dir_ / "s.json").string(), "--metrics",
                       (dir_ / "m.jsonl").string(), "--save", (dir_ / "c.ckpt").string()});
    EXPECT_EQ(r.code, 0) << name << ": " << r.err;
  }
  std::filesystem::current_path(cwd);
}

TEST_F(Cli, HelpAndVersionExitZero) {
  EXPECT_EQ(cohort({"--help"}).code, 0);
  EXPECT_NE(cohort({"train", "--help"}).out.find("--micro-batch"), std::string::npos);
}

// --version names cohort's version (from CMake's project(VERSION)), the oneDNN, OpenBLAS and
// oneTBB libraries it runs on and what oneDNN does here (its ISA, bf16 none, emulated or native),
// one a line, and the kernel the root's bf16 GEMMs run on. The OpenBLAS loaded is its OpenMP
// build, the one replicas may call at once (cmake/FindOpenBLASOpenMP.cmake): with another, or
// with kernels older than the CPU (nn::openblas_core_fits), nn::openblas_usable() keeps the
// language models' small weight gradients on oneDNN, and --version says so.
TEST_F(Cli, VersionNamesCohortAndItsLibraries) {
  Result r = cohort({"--version"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("cohort " COHORT_VERSION "\n", 0), 0u) << r.out;
  EXPECT_NE(r.out.find("\nbuild " COHORT_BUILD_TARGET ", cohort's kernels " + cohort_kernels_isa() +
                       "\n"),
            std::string::npos)
      << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(\noneDNN \d+\.\d+\.\d+ \(.*cpu runtime )")))
      << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(\noneTBB \d+\.\d+)"))) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(\nOpenBLAS \d+\.\d+\.\d+ \(OpenMP build, )")))
      << r.out;
  const bool fits = nn::openblas_core_fits(nn::openblas_core(), cpu_features().x86_64_v3());
  EXPECT_EQ(nn::openblas_usable(), fits) << "kernels " << nn::openblas_core();
  EXPECT_EQ(r.out.find("not called") == std::string::npos, fits) << r.out;
  EXPECT_NE(r.out.find("\nCPU " + nn::onednn_isa() + " (oneDNN's dispatch), bf16 " +
                       std::string(name_of(nn::kBf16SupportNames, nn::bf16_support())) +
                       ", the root's bf16 GEMMs on " +
                       std::string(name_of(nn::kRootGemmNames, nn::root_bf16_gemm())) +
                       ", bf16 inner products' weights " +
                       (nn::plans_choose_layout(nn::Precision::kBf16, true) ? "in oneDNN's layout"
                                                                            : "plain") +
                       "\n"),
            std::string::npos)
      << r.out;
}

// OpenBLAS's kernels are called only where they are of AVX2's class on a CPU with AVX2: a build
// that does not know the CPU falls back to an older core's (SSE3's "Prescott" on some Xeons).
TEST(OpenBlasCore, KernelsOfAvx2sClassWhereTheCpuHasAvx2) {
  for (const char* core : {"Haswell", "Zen", "SkylakeX", "COOPERLAKE", "SapphireRapids"})
    EXPECT_TRUE(nn::openblas_core_fits(core, /*avx2=*/true)) << core;
  for (const char* core : {"Prescott", "Core2", "Nehalem", "Sandybridge", "Atom", ""})
    EXPECT_FALSE(nn::openblas_core_fits(core, true)) << core;
  EXPECT_TRUE(nn::openblas_core_fits("Prescott", /*avx2=*/false));  // nothing better to run
}

// --precision bf16 where oneDNN has no bf16 kernels (no AVX-512) is refused with exit 2 before
// anything is written, even with --allow-emulated-bf16; where it has them, the same run trains.
TEST_F(Cli, Bf16IsRefusedWhereOneDnnHasNoBf16AndRunsWhereItHas) {
  const auto summary = (dir_ / "bf16.json").string();
  Result r = cohort(quick({"--precision", "bf16", "--allow-emulated-bf16", "--summary", summary}));
  std::printf("oneDNN dispatches %s, bf16 %s\n", nn::onednn_isa().c_str(),
              std::string(name_of(nn::kBf16SupportNames, nn::bf16_support())).c_str());
  if (nn::bf16_support() == nn::Bf16Support::kNone) {
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_EQ(r.out, "");
    EXPECT_NE(r.err.find("--precision bf16"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("AVX-512"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(summary));
  } else {
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_TRUE(fs::exists(summary));
  }
}

// Every command takes --quiet; eval and plot then print nothing but still write their files.
TEST_F(Cli, EveryCommandTakesQuiet) {
  const auto ckpt = (dir_ / "c.ckpt").string(), metrics = (dir_ / "m.jsonl").string();
  Result t = cohort(quick({"--quiet", "--save", ckpt, "--metrics", metrics}));
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_EQ(t.out, "");
  const auto summary = (dir_ / "eval.json").string();
  Result e = cohort({"eval", "--quiet", "--checkpoint", ckpt, "--data", COHORT_FIXTURE_DIR,
                     "--summary", summary});
  ASSERT_EQ(e.code, 0) << e.err;
  EXPECT_EQ(e.out, "");
  EXPECT_TRUE(fs::exists(summary));
  const auto svg = (dir_ / "c.svg").string();
  Result p = cohort({"plot", "--quiet", metrics, "-o", svg});
  ASSERT_EQ(p.code, 0) << p.err;
  EXPECT_EQ(p.out, "");
  EXPECT_TRUE(fs::exists(svg));
  const auto onnx = (dir_ / "c.onnx").string();
  Result x = cohort({"export", "--quiet", "--checkpoint", ckpt, "--format", "onnx", "-o", onnx});
  ASSERT_EQ(x.code, 0) << x.err;
  EXPECT_EQ(x.out, "");
  EXPECT_TRUE(fs::exists(onnx));
  // Without --quiet they do print (so the test above can fail).
  EXPECT_NE(cohort({"plot", metrics, "-o", svg}).out, "");
  EXPECT_NE(cohort({"export", "--checkpoint", ckpt, "--format", "onnx", "-o", onnx}).out, "");
}

}  // namespace cli_test
}  // namespace cohort::cli
