// `cohort launch`'s parts (the job's command parsed, --resume auto added, a failure told from
// mpirun's messages, which statuses are retried, a failed host taken out of -H and hostfiles),
// its refusals before anything runs, and supervised single-process jobs of the real binary: one
// that finishes, and one that fails every time until its restarts run out. The restarts of an
// mpirun job whose ranks are killed are in tests/dist/launch_test.py.
#include "launch.hpp"

#include <gtest/gtest.h>

#include <climits>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "cohort/core/error.hpp"
#include "testing.hpp"

namespace cohort::cli {
namespace launch_test {

namespace fs = std::filesystem;
using Args = std::vector<std::string>;
using testing::cohort;
using testing::Result;

TEST(LaunchCommand, FindsMpirunsRanksHostsAndTheTrainArguments) {
  const JobCommand job = parse_job_command({"mpirun", "--oversubscribe", "-np", "3", "-H",
                                            "a:2,b:2", "/opt/bin/cohort", "train", "--save", "x"});
  EXPECT_TRUE(job.mpirun);
  EXPECT_FALSE(job.mpmd);
  EXPECT_EQ(job.program, 6u);
  EXPECT_EQ(job.ranks, 3u);
  EXPECT_EQ(job.np_at, 3u);
  EXPECT_EQ(job.hosts_at, 5u);
  EXPECT_FALSE(job.hostfile_at);
  EXPECT_EQ(job.train_args(), (Args{"--save", "x"}));

  const JobCommand plain = parse_job_command({"./cohort", "train", "--steps", "9"});
  EXPECT_FALSE(plain.mpirun);
  EXPECT_EQ(plain.ranks, 1u);
  EXPECT_EQ(plain.train_args(), (Args{"--steps", "9"}));

  for (const char* np : {"-n", "--np", "-c"})
    EXPECT_EQ(parse_job_command({"mpirun", np, "5", "cohort", "train"}).ranks, 5u) << np;
  const JobCommand mpmd = parse_job_command({"mpirun", "-np", "1", "cohort", "train", "--lr", "1",
                                             ":", "-np", "1", "cohort", "train", "--lr", "2"});
  EXPECT_TRUE(mpmd.mpmd);
  EXPECT_FALSE(mpmd.np_at);  // ranks of several app contexts are left as they are
  EXPECT_EQ(mpmd.train_args(), (Args{"--lr", "1"}));
}

TEST(LaunchCommand, RefusesACommandWithoutCohortTrainOrWithBadRanks) {
  EXPECT_THROW(parse_job_command({"mpirun", "-np", "2", "python3", "train.py"}), InputError);
  EXPECT_THROW(parse_job_command({"cohort", "eval"}), InputError);
  EXPECT_THROW(parse_job_command({}), InputError);
  for (const char* bad : {"0", "x", "2x", "-1"})
    EXPECT_THROW(parse_job_command({"mpirun", "-np", bad, "cohort", "train"}), InputError) << bad;
}

TEST(LaunchCommand, ResumeAutoGoesLastInEveryAppContext) {
  EXPECT_EQ(
      with_resume_auto({"mpirun", "-np", "2", "cohort", "train", "--resume", "old.ckpt"}),
      (Args{"mpirun", "-np", "2", "cohort", "train", "--resume", "old.ckpt", "--resume", "auto"}));
  EXPECT_EQ(with_resume_auto({"mpirun", "-np", "1", "cohort", "train", "--lr", "1", ":", "-np", "1",
                              "cohort", "train"}),
            (Args{"mpirun", "-np", "1", "cohort", "train", "--lr", "1", "--resume", "auto", ":",
                  "-np", "1", "cohort", "train", "--resume", "auto"}));
}

TEST(LaunchFailure, ToldFromMpirunsMessagesOrTheStatus) {
  const Failure killed = describe_failure(
      137,
      "--------------------------------------------------------------------------\n"
      "mpirun noticed that process rank 2 with PID 0 on node n3 exited on signal 9 (Killed).\n"
      "--------------------------------------------------------------------------\n");
  EXPECT_EQ(killed.node, "n3");
  EXPECT_EQ(killed.cause, "rank 2 on node n3 ended by signal 9 (Killed) (exit status 137)");

  const Failure lost = describe_failure(
      1,
      "ORTE has lost communication with a remote daemon.\n\n  HNP daemon   : [[9,0],0] on "
      "node n1\n  Remote daemon: [[9,0],2] on node n4\n");
  EXPECT_EQ(lost.node, "n4");
  EXPECT_EQ(lost.cause, "mpirun lost node n4 (exit status 1)");

  const Failure aborted = describe_failure(
      1, "MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD\nwith errorcode 1.\n");
  EXPECT_EQ(aborted.node, "");
  EXPECT_EQ(aborted.cause, "rank 1 called MPI_Abort (exit status 1)");

  EXPECT_EQ(describe_failure(134, "").cause.rfind("the job ended by signal 6 (", 0), 0u);
  EXPECT_EQ(describe_failure(1, "cohort: internal error\n").cause, "the job exited with status 1");
}

TEST(LaunchFailure, RetriesFailuresNotBadInputWriteErrorsOrStops) {
  for (int status : {1, 134, 137, 139}) EXPECT_TRUE(worth_restarting(status)) << status;
  for (int status : {kExitOk, kExitBadInput, kExitWriteFailed, kExitInterrupted, kExitTerminated})
    EXPECT_FALSE(worth_restarting(status)) << status;
}

class LaunchHosts : public testing::TempDirTest {};

TEST_F(LaunchHosts, AFailedHostLeavesTheHostListAndTheHostfile) {
  JobCommand listed =
      parse_job_command({"mpirun", "-np", "6", "-H", "a:2,b:2,c:2", "cohort", "train"});
  EXPECT_EQ(drop_host(listed, "b", dir_ / "unused"), 4u);
  EXPECT_EQ(listed.argv[4], "a:2,c:2");
  EXPECT_FALSE(drop_host(listed, "zz", dir_ / "unused"));  // not one of them: nothing changes
  EXPECT_EQ(listed.argv[4], "a:2,c:2");

  JobCommand unstated = parse_job_command({"mpirun", "--host", "a,b", "cohort", "train"});
  EXPECT_EQ(drop_host(unstated, "a", dir_ / "unused"), SIZE_MAX);  // slots unknown
  EXPECT_EQ(unstated.argv[2], "b");
  EXPECT_FALSE(drop_host(unstated, "b", dir_ / "unused"));  // the last host stays
  EXPECT_FALSE(fs::exists(dir_ / "unused"));

  const fs::path hostfile = dir_ / "hosts", scratch = dir_ / "hosts.left";
  std::ofstream(hostfile) << "# the cluster\nn1 slots=4\nn2 slots=4 max_slots=8\n\nn3 slots=2\n";
  JobCommand job = parse_job_command(
      {"mpirun", "--hostfile", hostfile.string(), "-np", "10", "cohort", "train"});
  EXPECT_EQ(drop_host(job, "n2", scratch), 6u);
  EXPECT_EQ(job.argv[2], scratch.string());
  std::ifstream left(scratch);
  const std::string text((std::istreambuf_iterator<char>(left)), {});
  EXPECT_EQ(text, "n1 slots=4\nn3 slots=2\n");
}

// The real binary under the supervisor, as one process (no mpirun).
class Launch : public testing::Cli {
 protected:
  Args supervised(Args launch_flags, Args train_extra) {
    Args a{"launch"};
    a.insert(a.end(), launch_flags.begin(), launch_flags.end());
    a.push_back("--");
    a.push_back(COHORT_BINARY);
    Args train = quick({"--quiet", "--save", (dir_ / "run.ckpt").string(), "--save-every", "4"});
    a.insert(a.end(), train.begin(), train.end());
    a.insert(a.end(), train_extra.begin(), train_extra.end());
    return a;
  }
  static std::vector<std::string> launch_lines(const std::string& err) {
    std::vector<std::string> lines;
    std::istringstream in(err);
    for (std::string line; std::getline(in, line);)
      if (line.rfind("cohort launch:", 0) == 0) lines.push_back(line);
    return lines;
  }
};

TEST_F(Launch, AJobThatFinishesRunsOnce) {
  const std::string summary = (dir_ / "s.json").string();
  Result r = cohort(supervised({}, {"--summary", summary}));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(launch_lines(r.err), std::vector<std::string>{});
  EXPECT_TRUE(fs::exists(summary));
}

TEST_F(Launch, AJobThatKeepsFailingEndsWithItsStatusWhenTheRestartsRunOut) {
  // A learning rate that overflows: every attempt stops at the same step (--max-skips 1),
  // a failure the supervisor cannot tell from a crash, so it retries until it may not.
  Result r = cohort(supervised({"--max-restarts", "2"},
                               {"--lr", "1e15", "--max-skips", "1", "--warmup-steps", "0"}));
  const std::vector<std::string> lines = launch_lines(r.err);
  ASSERT_EQ(lines.size(), 3u) << r.err;
  EXPECT_EQ(lines[0].rfind("cohort launch: restart 1 of 2 after the job exited with status " +
                               std::to_string(r.code) + ": resuming from step ",
                           0),
            0u)
      << lines[0];
  EXPECT_NE(lines[0].find(" on 1 rank"), std::string::npos) << lines[0];
  EXPECT_EQ(lines[1].rfind("cohort launch: restart 2 of 2 after ", 0), 0u) << lines[1];
  EXPECT_EQ(lines[2], "cohort launch: the job exited with status " + std::to_string(r.code) +
                          "; no restarts left (--max-restarts 2)");
  EXPECT_EQ(r.code, kExitInternal);
}

// The hostfile without a failed node is a file of the launch's own (mkstemp beside --save),
// removed at the end: a user's file of any name beside the checkpoint is never touched.
TEST_F(Launch, TheHostfileLeftAfterAFailedNodeIsAFileOfItsOwn) {
  const fs::path mpirun = dir_ / "mpirun", hosts = dir_ / "hosts";
  std::ofstream(mpirun) << "#!/bin/sh\necho 'process rank 1 with PID 999 on node nodeB exited on "
                           "signal 9 (Killed).' >&2\nexit 1\n";
  fs::permissions(mpirun, fs::perms::owner_all);
  std::ofstream(hosts) << "nodeA slots=1\nnodeB slots=1\n";
  const fs::path mine = dir_ / "run.ckpt.hosts";
  std::ofstream(mine) << "my notes\n";
  Args a{"launch",    "--max-restarts", "1",          "--", mpirun.string(), "-np", "2",
         "-hostfile", hosts.string(),   COHORT_BINARY};
  Args train = quick({"--quiet", "--save", (dir_ / "run.ckpt").string(), "--save-every", "4"});
  a.insert(a.end(), train.begin(), train.end());
  Result r = cohort(a);
  EXPECT_NE(r.err.find("without node nodeB"), std::string::npos) << r.err;
  std::ifstream in(mine);
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(in)), {}), "my notes\n");
  for (const auto& e : fs::directory_iterator(dir_))
    EXPECT_EQ(e.path().filename().string().rfind("run.ckpt.hosts.", 0), std::string::npos)
        << e.path() << " left behind";
}

TEST_F(Launch, RefusesBeforeRunningAnything) {
  const std::string ckpt = (dir_ / "run.ckpt").string();
  const struct {
    const char* name;
    Args args;
    const char* says;
  } cases[] = {
      {"no job", {"launch"}, "command"},
      {"not cohort train", {"launch", "--", "true"}, "cohort train"},
      {"no --save", {"launch", "--", COHORT_BINARY, "train", "--steps", "2"}, "--save FILE"},
      {"no --save-every",
       {"launch", "--", COHORT_BINARY, "train", "--save", ckpt},
       "--save-every N"},
      {"unknown flag",
       {"launch", "--", COHORT_BINARY, "train", "--save", ckpt, "--save-every", "2", "--nope"},
       "--nope"},
      {"--shrink without -np",
       {"launch", "--shrink", "--", "mpirun", COHORT_BINARY, "train", "--save", ckpt,
        "--save-every", "2"},
       "-np N"},
      {"--min-ranks past -np",
       {"launch", "--min-ranks", "3", "--", "mpirun", "-np", "2", COHORT_BINARY, "train", "--save",
        ckpt, "--save-every", "2"},
       "--min-ranks"},
  };
  for (const auto& c : cases) {
    Result r = cohort(c.args);
    EXPECT_EQ(r.code, kExitBadInput) << c.name << ": " << r.err;
    EXPECT_NE(r.err.find(c.says), std::string::npos) << c.name << ": " << r.err;
    EXPECT_FALSE(fs::exists(ckpt)) << c.name;
  }
}

}  // namespace launch_test
}  // namespace cohort::cli
