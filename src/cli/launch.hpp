// `cohort launch`: a supervisor that runs a training job (`mpirun ... cohort train ...`, or a
// plain `cohort train ...`) and, when it fails, starts it again from its newest checkpoint
// (`--resume auto`) on the ranks still usable, until it finishes or the restarts run out. The
// weights do not depend on how many ranks compute a step and a resume is exact, so the restarted
// run ends with the weights the unbroken run would have had. Not the checkpoint search
// (checkpoint::newest_checkpoint) and not `cohort train` (train_command.cpp).
#pragma once

#include <CLI/CLI.hpp>

#include <cstddef>
#include <filesystem>
#include <iosfwd>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cohort/cli/cli.hpp"

namespace cohort::cli {

struct LaunchOptions {
  std::size_t max_restarts = 3;
  std::size_t min_ranks = 1;
  bool shrink = false;  // each restart one rank fewer (a test of shrinking on one machine)
  std::vector<std::string> command;  // after `--`
};
CLI::App* add_launch_command(CLI::App& app, LaunchOptions& o);

// Checks the command (InputError, exit 2, before anything runs), then runs it and restarts it as
// the header says; one line on `err` per restart. Returns 0 when the job finishes, the exit
// status of the failure that ended it (128 + N for a signal N), or 130 / 143 when a SIGINT /
// SIGTERM to the supervisor stopped it (passed on to the job once: it stops after its step and
// saves).
int launch_command(const LaunchOptions& o, const Loaders& loaders, std::ostream& err);

// The command a launch runs, as parsed. The cohort executable is the argument before the first
// "train" whose file name starts with "cohort"; the arguments before it, if any, are mpirun's.
struct JobCommand {
  std::vector<std::string> argv;
  std::size_t program = 0;  // argv[program] runs `train`
  bool mpirun = false;      // argv[0 .. program) launch it
  bool mpmd = false;        // several app contexts (`:`): their ranks are left as they are
  std::size_t ranks = 1;    // -np's value; 1 for a plain process
  std::optional<std::size_t> np_at, hosts_at, hostfile_at;  // indices of those options' values

  std::vector<std::string> train_args() const;  // what follows `train` (in its app context)
};
// Throws InputError naming what is missing or malformed.
JobCommand parse_job_command(std::vector<std::string> argv);

// `argv` with `--resume auto` at the end of each `cohort train`'s arguments (every app context of
// an MPMD mpirun), after any --resume of the user's: the restart's command.
std::vector<std::string> with_resume_auto(std::vector<std::string> argv);

// How a job ended, from its exit status and what it printed on stderr: mpirun names the rank,
// node and signal of a process that died ("mpirun noticed that process rank 1 with PID 42 on
// node n3 exited on signal 9 (Killed).") or the daemon of a node it lost ("Remote daemon: [[...],1]
// on node n3"); other failures are told by their status alone.
struct Failure {
  int status = 0;
  std::string
      cause;         // one clause: "rank 1 on node n3 ended by signal 9 (Killed) (exit status 137)"
  std::string node;  // the node that failed, when mpirun named one
};
Failure describe_failure(int status, std::string_view job_stderr);

// Whether a job that ended with `status` is started again. Not after success (0), bad input (2:
// it would fail alike, before its first step), a write that failed (74: the full or read-only disk
// is still there) or a stop that was asked for (130 Ctrl-C, 143 SIGTERM).
bool worth_restarting(int status);

// `host` taken out of the job's hosts (-H a,b:2 / --hostfile F, where F is copied without it to
// `scratch`). Returns the slots the remaining hosts give when every one states them (name:N,
// slots=N), SIZE_MAX when some do not, and nullopt when `host` is not among them (nothing
// changed). Only with more than one host: one machine is never dropped.
std::optional<std::size_t> drop_host(JobCommand& job, const std::string& host,
                                     const std::filesystem::path& scratch);

}  // namespace cohort::cli
