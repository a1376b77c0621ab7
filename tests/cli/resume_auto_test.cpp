// `cohort train --resume auto`: a fresh start with no checkpoint, the newest checkpoint that
// loads (damaged and unfinished files passed over, each named on one line), the same weights as
// the uninterrupted run, a resumed run's metrics file continued without a step twice or missing,
// and the refusals (no --save; a checkpoint of another run is not overwritten by a fresh start).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cohort/cli/cli.hpp"
#include "testing.hpp"

namespace cohort::cli {
namespace resume_auto_test {

namespace fs = std::filesystem;
using testing::cohort;
using testing::Result;

class ResumeAuto : public testing::Cli {
 protected:
  // quick() for `steps` steps with checkpoints every 4 (three kept) and --resume auto.
  std::vector<std::string> run_to(int steps, std::vector<std::string> extra = {}) {
    std::vector<std::string> a = quick(
        {"--quiet", "--save", ckpt(), "--save-every", "4", "--keep", "3", "--resume", "auto"});
    a[8] = std::to_string(steps);  // --steps
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  std::string ckpt() const { return (dir_ / "run.ckpt").string(); }
  std::string digest(const std::string& summary) const {
    return nlohmann::json::parse(std::ifstream(summary))["weights_digest"];
  }
  // The metrics file's step lines as (step, loss).
  static std::vector<std::pair<int, double>> step_lines(const fs::path& metrics) {
    std::vector<std::pair<int, double>> lines;
    std::ifstream in(metrics);
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j["kind"] == "step") lines.emplace_back(j["step"], j["loss"]);
    }
    return lines;
  }
};

TEST_F(ResumeAuto, StartsFreshThenResumesTheNewestCheckpointThatLoads) {
  const std::string full = (dir_ / "full.json").string(),
                    resumed = (dir_ / "resumed.json").string();
  ASSERT_EQ(cohort(quick({"--quiet", "--summary", full})).code, 0);

  Result first = cohort(run_to(8));  // saves at steps 4 and 8: run.ckpt (8), run.ckpt.1 (4)
  ASSERT_EQ(first.code, 0) << first.err;
  EXPECT_EQ(first.err, "");  // nothing to pass over: a fresh start is not a warning
  ASSERT_TRUE(fs::exists(ckpt() + ".1"));
  ASSERT_FALSE(fs::exists(ckpt() + ".2"));
  {  // the newest damaged in its middle, and a save that died before its rename
    std::fstream f(ckpt(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(ckpt()) / 2));
    f.put('\x5a');
    std::ofstream(ckpt() + ".tmp.4242") << "half";
  }
  std::vector<std::string> args = run_to(12, {"--summary", resumed});
  args.erase(std::find(args.begin(), args.end(), "--quiet"));
  Result r = cohort(args);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("resumed from " + ckpt() + ".1 at step 4"), std::string::npos) << r.out;
  const std::string damaged = "cohort: warning: --resume auto: passed over " + ckpt() + ": ";
  const std::string unfinished =
      "cohort: warning: --resume auto: passed over " + ckpt() + ".tmp.4242: a save that did not";
  EXPECT_NE(r.err.find(damaged), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(unfinished), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 2) << r.err;
  EXPECT_EQ(digest(resumed), digest(full));
}

TEST_F(ResumeAuto, NoCheckpointIsAFreshStartSaidOnce) {
  std::vector<std::string> args = run_to(4);
  args.erase(std::find(args.begin(), args.end(), "--quiet"));
  Result r = cohort(args);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("--resume auto: no checkpoint of " + ckpt() +
                       " to resume; starting at "
                       "step 0"),
            std::string::npos)
      << r.out;
  Result dry = cohort(run_to(8, {"--dry-run"}));
  ASSERT_EQ(dry.code, 0) << dry.err;
  EXPECT_NE(dry.out.find("would resume from " + ckpt() + " at step 4"), std::string::npos)
      << dry.out;
}

TEST_F(ResumeAuto, NeedsSaveAndNeverStartsOverAnotherRunsCheckpoint) {
  std::vector<std::string> no_save = quick({"--resume", "auto"});
  Result r = cohort(no_save);
  EXPECT_EQ(r.code, kExitBadInput);
  EXPECT_NE(r.err.find("--resume auto: expected --save FILE"), std::string::npos) << r.err;
  // A checkpoint of another model where this run saves: refused (exit 2), not passed over for a
  // fresh start that would rotate it away.
  std::vector<std::string> other = run_to(4);
  other[4] = "mlp:784-16-10";
  ASSERT_EQ(cohort(other).code, 0);
  const auto before = fs::last_write_time(ckpt());
  r = cohort(run_to(8));
  EXPECT_EQ(r.code, kExitBadInput) << r.err;
  EXPECT_NE(r.err.find(ckpt()), std::string::npos) << r.err;
  EXPECT_EQ(fs::last_write_time(ckpt()), before);
  EXPECT_FALSE(fs::exists(ckpt() + ".1"));
  // A file named auto is ./auto.
  r = cohort(quick({"--resume", "./auto"}));
  EXPECT_EQ(r.code, kExitBadInput);
  EXPECT_NE(r.err.find("./auto"), std::string::npos) << r.err;
}

TEST_F(ResumeAuto, TheResumedRunContinuesItsMetrics) {
  const fs::path full = dir_ / "full.jsonl", metrics = dir_ / "m.jsonl";
  ASSERT_EQ(cohort(quick({"--quiet", "--log-every", "1", "--metrics", full.string()})).code, 0);
  // A run that got to step 10 after its checkpoint at step 8, as one killed there would leave
  // it: run.ckpt.1 (8) and the metrics of steps 1-10, the last line cut short.
  ASSERT_EQ(cohort(run_to(10, {"--log-every", "1", "--metrics", metrics.string()})).code, 0);
  fs::remove(ckpt());
  std::ofstream(metrics, std::ios::app) << R"({"kind":"step","step":11,"lo)";
  ASSERT_EQ(cohort(run_to(12, {"--log-every", "1", "--metrics", metrics.string()})).code, 0);
  const auto want = step_lines(full), got = step_lines(metrics);
  ASSERT_EQ(got.size(), 12u);
  EXPECT_EQ(got, want);  // each step once, in order, with the uninterrupted run's loss
  // elapsed_s counts on across the restart.
  std::ifstream in(metrics);
  double last = -1;
  for (std::string line; std::getline(in, line);) {
    const double t = nlohmann::json::parse(line)["elapsed_s"];
    EXPECT_GE(t, last) << line;
    last = t;
  }
}

}  // namespace resume_auto_test
}  // namespace cohort::cli
