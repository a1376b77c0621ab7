// The command line as a process among others: stopped by a signal (Ctrl-C, a batch scheduler's
// SIGTERM) it finishes the step, saves and exits 130 or 143; with its reader gone it trains on
// (no SIGPIPE); with its standard output closed its metrics file stays JSON; a save that fails
// during the run (disk full, a failed rename) exits 74.
#include "cohort/cli/cli.hpp"
#include "cohort/core/atomic_file.hpp"
#include "testing.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace cohort::cli {
namespace cli_process_test {

namespace fs = std::filesystem;
using testing::Cli;
using testing::cohort;
using testing::Result;

// A save that fails during the run (the disk full at a periodic save, a failed rename) is exit
// 74, not bad input, naming the file and the system's reason; the previous checkpoint stays.
TEST_F(Cli, ASaveThatFailsDuringTheRunExits74NamingTheFile) {
  const auto ckpt = (dir_ / "run.ckpt").string();
  const int full = ::open("/dev/full", O_WRONLY | O_CLOEXEC);
  ASSERT_GE(full, 0);
  bool synced = false;
  int renames = 0;
  FileCalls disk_full = system_file_calls(), rename_fails = system_file_calls();
  disk_full.write = [&](int fd, const void* p, std::size_t n) {
    return ::write(synced ? full : fd, p, n);  // the writes after the first save's fsync fail
  };
  disk_full.fsync = [&](int fd) {
    synced = true;
    return ::fsync(fd);
  };
  rename_fails.rename = [&](const char* from, const char* to) {
    if (++renames == 1) return std::rename(from, to);
    errno = EIO;
    return -1;
  };
  for (const auto& [calls, error] : {std::pair{disk_full, ENOSPC}, std::pair{rename_fails, EIO}}) {
    fs::remove(ckpt);
    const FileCalls before = set_file_calls(calls);
    Result r = cohort(quick({"--quiet", "--save", ckpt, "--save-every", "4"}));
    set_file_calls(before);
    EXPECT_EQ(r.code, kExitWriteFailed) << r.err;
    EXPECT_NE(r.err.find(ckpt), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(std::strerror(error)), std::string::npos) << r.err;
    EXPECT_EQ(checkpoint::load_checkpoint(ckpt).step, 4u);  // the first periodic save
    for (const auto& e : fs::directory_iterator(dir_))
      EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << e.path();
  }
  ::close(full);
}

// Starts the cohort binary on `args` (those after "cohort") with its standard output on `out`
// (-1: closed, as by `>&-`); returns its pid.
pid_t start_cohort(const std::vector<std::string>& args, int out) {
  // Built before fork: the child of a process with threads may not allocate.
  std::vector<char*> argv{const_cast<char*>(COHORT_BINARY)};
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    if (out < 0) ::close(STDOUT_FILENO);
    if (out >= 0) ::dup2(out, STDOUT_FILENO);
    ::execv(COHORT_BINARY, argv.data());
    _exit(127);
  }
  return pid;
}

// Waits for `pid`; its wait status in words for a failed assertion.
std::pair<int, std::string> wait_for(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return {-1, std::strerror(errno)};
  return {status, WIFSIGNALED(status) ? std::string("killed by ") + strsignal(WTERMSIG(status))
                                      : "exit " + std::to_string(WEXITSTATUS(status))};
}

// A long run saving every 50 steps is sent `sig` once it has saved: it finishes the step, saves
// it (not a multiple of --save-every), names the signal and the step and exits with `code`.
void expect_stop_saves(const fs::path& dir, int sig, int code) {
  const auto ckpt = dir / "live.ckpt", out = dir / "out.txt";
  const int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  const pid_t pid =
      start_cohort({"train", "--data", COHORT_FIXTURE_DIR, "--model", "mlp:784-64-10", "--batch",
                    "32", "--steps", "1000000", "--save", ckpt.string(), "--save-every", "50"},
                   fd);
  ::close(fd);
  ASSERT_GE(pid, 0);
  for (int i = 0; i < 600 && !fs::exists(ckpt); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_TRUE(fs::exists(ckpt));
  ASSERT_EQ(kill(pid, sig), 0);
  const auto [status, said] = wait_for(pid);
  ASSERT_TRUE(WIFEXITED(status)) << said;
  EXPECT_EQ(WEXITSTATUS(status), code);
  std::ifstream printed(out);
  const std::string text{std::istreambuf_iterator<char>(printed), {}};
  std::smatch m;
  ASSERT_TRUE(std::regex_search(text, m, std::regex("stopped by (SIG[A-Z]+) after step (\\d+)")))
      << text.substr(text.size() > 2000 ? text.size() - 2000 : 0);
  EXPECT_EQ(m[1].str(), sig == SIGTERM ? "SIGTERM" : "SIGINT");
  EXPECT_EQ(checkpoint::load_checkpoint(ckpt).step, std::stoull(m[2].str()));
  Result e = cohort({"eval", "--checkpoint", ckpt.string(), "--data", COHORT_FIXTURE_DIR});
  EXPECT_EQ(e.code, 0) << e.err;
}

// The binary run through the shell with `env` before it (VAR=value ...): its exit code and its
// standard output and error together.
std::pair<int, std::string> run_with_env(const std::string& env, const std::string& args) {
  const std::string command = env + " " + COHORT_BINARY + " " + args + " 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return {-1, std::strerror(errno)};
  std::string text;
  char buffer[4096];
  for (std::size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;) text.append(buffer, n);
  const int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, text};
}

// COHORT_MAX_CPU_ISA caps cohort's own kernels (core/cpu.hpp): --version names the capped set, a
// cap above the CPU changes nothing, and a value it does not know is bad input (exit 2, naming
// the variable, the values it takes and the value found) before any work.
TEST(CpuCap, CohortMaxCpuIsaCapsTheKernelsAndAnUnknownValueExits2) {
  const auto [code, text] = run_with_env("COHORT_MAX_CPU_ISA=avx2", "--version");
  EXPECT_EQ(code, 0) << text;
  EXPECT_NE(text.find("cohort's kernels portable"), std::string::npos) << text;
  const auto [all_code, all] = run_with_env("COHORT_MAX_CPU_ISA=ALL", "--version");
  const auto [own_code, own] = run_with_env("", "--version");
  EXPECT_EQ(all_code, 0);
  EXPECT_EQ(all, own);
  const auto [bad, said] = run_with_env("COHORT_MAX_CPU_ISA=avx9", "train --data /nonexistent");
  EXPECT_EQ(bad, kExitBadInput);
  EXPECT_NE(said.find("COHORT_MAX_CPU_ISA: expected avx2, avx512, avx512_bf16, amx or all, "
                      "found \"avx9\""),
            std::string::npos)
      << said;
  EXPECT_EQ(said.find("/nonexistent"), std::string::npos) << said;  // nothing else was looked at
}

TEST_F(Cli, CtrlCFinishesTheStepSavesAndExits130) {
  expect_stop_saves(dir_, SIGINT, kExitInterrupted);
}

// A batch scheduler's notice: as Ctrl-C, with SIGTERM's conventional status.
TEST_F(Cli, SigtermFinishesTheStepSavesAndExits143) {
  expect_stop_saves(dir_, SIGTERM, kExitTerminated);
}

// `cohort train ... | head -1`: the reader goes away after one line; the run goes on to its end
// (no SIGPIPE), printing nothing more, and saves as usual.
TEST_F(Cli, AReaderThatGoesAwayEndsTheProgressNotTheRun) {
  const auto ckpt = dir_ / "run.ckpt";
  int fds[2];
  ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);
  // A line a step: far more than a pipe's buffer, so the writes fail while the run trains.
  const pid_t pid =
      start_cohort(quick({"--steps", "300", "--log-every", "1", "--save", ckpt.string()}), fds[1]);
  ::close(fds[1]);
  ASSERT_GE(pid, 0);
  char c = 0;
  while (::read(fds[0], &c, 1) == 1 && c != '\n') {
  }
  ::close(fds[0]);
  const auto [status, said] = wait_for(pid);
  ASSERT_TRUE(WIFEXITED(status)) << said;
  EXPECT_EQ(WEXITSTATUS(status), kExitOk);
  EXPECT_EQ(checkpoint::load_checkpoint(ckpt).step, 300u);
}

// `cohort train ... >&-`: descriptor 1 is opened on /dev/null before any file is, so the
// metrics file (the next file opened) does not take it and holds JSON lines only.
TEST_F(Cli, MetricsStayJsonWhenStandardOutputIsClosed) {
  const auto metrics = dir_ / "m.jsonl";
  // A line a step: more than the output's buffer, so lines are written while the run trains.
  const pid_t pid = start_cohort(
      quick({"--steps", "200", "--log-every", "1", "--metrics", metrics.string()}), -1);
  ASSERT_GE(pid, 0);
  const auto [status, said] = wait_for(pid);
  ASSERT_TRUE(WIFEXITED(status)) << said;
  EXPECT_EQ(WEXITSTATUS(status), kExitOk);
  std::ifstream in(metrics);
  int lines = 0, json = 0;
  std::string other;  // the first line that is not JSON
  for (std::string line; std::getline(in, line); ++lines)
    if (nlohmann::json::accept(line))
      ++json;
    else if (other.empty())
      other = line;
  EXPECT_EQ(json, lines) << "first other line: " << other;
  EXPECT_GE(json, 200);  // a step line a step
}

}  // namespace cli_process_test
}  // namespace cohort::cli
