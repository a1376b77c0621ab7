// `cohort launch` (launch.hpp): the command's parts, the supervised process and the restart loop.
#include "launch.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <ostream>
#include <regex>
#include <sstream>

#include "cohort/checkpoint/checkpoint.hpp"
#include "cohort/core/error.hpp"
#include "options.hpp"
#include "progress.hpp"

extern char** environ;

namespace cohort::cli {

namespace {

namespace fs = std::filesystem;

bool is_one_of(const std::string& arg, std::initializer_list<const char*> names) {
  return std::any_of(names.begin(), names.end(), [&arg](const char* n) { return arg == n; });
}

std::size_t count_of(const std::string& flag, const std::string& text) {
  std::size_t n = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (ec != std::errc() || end != text.data() + text.size() || n == 0)
    throw InputError("cohort launch: the command's " + flag +
                     ": expected a positive number of ranks, found '" + text + "'");
  return n;
}

// "name:slots" of -H, or a hostfile's line "name slots=N ...": the host's name and slots (0: not
// stated).
std::pair<std::string, std::size_t> host_entry(const std::string& entry, bool hostfile) {
  std::string name = entry, slots;
  if (hostfile) {
    std::istringstream words(entry);
    words >> name;
    for (std::string w; words >> w;)
      if (w.rfind("slots=", 0) == 0) slots = w.substr(6);
  } else if (const std::size_t colon = entry.find(':'); colon != std::string::npos) {
    name = entry.substr(0, colon);
    slots = entry.substr(colon + 1);
  }
  std::size_t n = 0;
  if (!slots.empty()) std::from_chars(slots.data(), slots.data() + slots.size(), n);
  return {name, n};
}

// The status as a shell reports it: the exit code, or 128 + the signal that ended the process.
int shell_status(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return kExitInternal;
}

// One run of the job: its stdout is ours, its stdin /dev/null (mpirun would otherwise read the
// terminal from a process group that does not own it), its stderr copied to `err` line by line
// and kept (the last 64 KiB) for describe_failure. It runs in a process group of its own, so a
// Ctrl-C at the terminal reaches the supervisor alone, which passes the first SIGINT or SIGTERM
// on to it once (mpirun hands it to every rank as SIGTERM: they stop after the step and save).
struct JobEnd {
  int status = 0;
  std::string stderr_tail;
  bool signalled = false;  // the supervisor passed a signal on: the job was asked to stop
  int signal = 0;          // which
};

JobEnd run_job(const std::vector<std::string>& argv, std::ostream& err) {
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0)
    throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // The child starts with no signal blocked (the supervisor blocks SIGINT and SIGTERM for its
  // signal thread, and a mask survives exec) and SIGPIPE at its default (ignored here).
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGPIPE);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int spawned = ::posix_spawnp(&pid, args[0], &actions, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  ::close(pipe_fds[1]);
  if (spawned != 0) {
    ::close(pipe_fds[0]);
    throw InputError("cohort launch: cannot run '" + argv[0] + "': " + std::strerror(spawned));
  }
  JobEnd end;
  std::string line;
  bool open = true, exited = false;
  int wait_status = 0;
  char buffer[4096];
  // After the job exits, its stderr is read until it closes or goes quiet for a second (a rank
  // that outlived mpirun may hold it open).
  int quiet_polls = 0;
  while (open && !(exited && quiet_polls >= 10)) {
    if (!end.signalled && StopSignals::requested()) {
      end.signal = StopSignals::received();
      ::kill(pid, end.signal);
      end.signalled = true;
    }
    pollfd p{pipe_fds[0], POLLIN, 0};
    const int ready = ::poll(&p, 1, 100);
    if (ready > 0) {
      const ssize_t n = ::read(pipe_fds[0], buffer, sizeof buffer);
      if (n <= 0) {
        open = n < 0 && errno == EINTR;
      } else {
        quiet_polls = 0;
        for (ssize_t i = 0; i < n; ++i) {
          line += buffer[i];
          if (buffer[i] != '\n') continue;
          err << line << std::flush;
          end.stderr_tail += line;
          line.clear();
        }
        if (end.stderr_tail.size() > 65536)
          end.stderr_tail.erase(0, end.stderr_tail.size() - 65536);
      }
    } else if (exited) {
      ++quiet_polls;
    }
    if (!exited && ::waitpid(pid, &wait_status, WNOHANG) == pid) exited = true;
  }
  ::close(pipe_fds[0]);
  if (!line.empty()) {
    err << line << "\n" << std::flush;
    end.stderr_tail += line;
  }
  if (!exited) ::waitpid(pid, &wait_status, 0);
  end.status = shell_status(wait_status);
  return end;
}

// The train arguments parsed as `cohort train` parses them (its config file expanded), for the
// flags the supervisor reads: --save, --save-every.
TrainOptions train_options(const JobCommand& job, const Loaders& loaders) {
  std::vector<std::string> args{"cohort", "train"};
  const std::vector<std::string> rest = job.train_args();
  args.insert(args.end(), rest.begin(), rest.end());
  args = with_config_flags(std::move(args), loaders);
  CLI::App app;
  TrainOptions o;
  add_train_command(app, o);
  std::vector<const char*> view;
  for (const auto& a : args) view.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(view.size()), view.data());
  } catch (const CLI::ParseError& e) {
    throw InputError("cohort launch: the command's cohort train: " + std::string(e.what()));
  }
  return o;
}

bool runs_train(const std::vector<std::string>& argv, std::size_t i) {
  return i + 1 < argv.size() && argv[i + 1] == "train" &&
         fs::path(argv[i]).filename().string().rfind("cohort", 0) == 0;
}

}  // namespace

std::vector<std::string> with_resume_auto(std::vector<std::string> argv) {
  // From the back, so the indices ahead stay valid: each `cohort train` (one per app context of
  // an MPMD mpirun) gets the flag at the end of its own arguments, where it overrides any earlier
  // --resume (a flag given twice takes its last value).
  std::size_t end = argv.size();
  for (std::size_t i = argv.size(); i-- > 0;) {
    if (argv[i] == ":") end = i;
    if (runs_train(argv, i)) {
      argv.insert(argv.begin() + static_cast<std::ptrdiff_t>(end),
                  {"--resume", std::string(kResumeAuto)});
      end = i;
    }
  }
  return argv;
}

std::vector<std::string> JobCommand::train_args() const {
  const auto begin = argv.begin() + static_cast<std::ptrdiff_t>(program) + 2;
  return {begin, std::find(begin, argv.end(), ":")};
}

JobCommand parse_job_command(std::vector<std::string> argv) {
  JobCommand job;
  job.argv = std::move(argv);
  const std::vector<std::string>& a = job.argv;
  std::size_t program = a.size();
  for (std::size_t i = 0; i < a.size(); ++i)
    if (runs_train(a, i)) {
      program = i;
      break;
    }
  if (program == a.size())
    throw InputError(
        "cohort launch: expected a command that runs `cohort train` after --, e.g. "
        "`cohort launch -- mpirun -np 3 cohort train --save run.ckpt --save-every 100`, found '" +
        [&a] {
          std::string s;
          for (const std::string& w : a) s += (s.empty() ? "" : " ") + w;
          return s;
        }() +
        "'");
  job.program = program;
  job.mpirun = program > 0;
  for (std::size_t i = 1; i < program; ++i) {
    const std::string& arg = a[i];
    const bool has_value = i + 1 < program;
    if (is_one_of(arg, {"-np", "-n", "--np", "--n", "-c"}) && has_value) {
      job.np_at = i + 1;
      job.ranks = count_of(arg, a[i + 1]);
    } else if (is_one_of(arg, {"-H", "-host", "--host"}) && has_value) {
      job.hosts_at = i + 1;
    } else if (is_one_of(arg, {"-hostfile", "--hostfile", "-machinefile", "--machinefile"}) &&
               has_value) {
      job.hostfile_at = i + 1;
    }
  }
  job.mpmd = job.mpirun && std::find(a.begin(), a.end(), ":") != a.end();
  if (job.mpmd) job.np_at.reset();
  return job;
}

Failure describe_failure(int status, std::string_view job_stderr) {
  Failure f;
  f.status = status;
  const std::string text(job_stderr);
  std::smatch m;
  static const std::regex died(
      R"(process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+)( \(([^)]*)\))?)");
  static const std::regex lost(R"(Remote daemon: \S+ on node (\S+))");
  static const std::regex aborted(R"(MPI_ABORT was invoked on rank (\d+))");
  if (std::regex_search(text, m, died)) {
    f.node = m[2];
    f.cause = "rank " + m[1].str() + " on node " + f.node + " ended by signal " + m[3].str() +
              (m[5].matched ? " (" + m[5].str() + ")" : "");
  } else if (std::regex_search(text, m, lost)) {
    f.node = m[1];
    f.cause = "mpirun lost node " + f.node;
  } else if (std::regex_search(text, m, aborted)) {
    f.cause = "rank " + m[1].str() + " called MPI_Abort";
  } else if (status > 128 && status < 128 + 65) {
    const char* name = ::strsignal(status - 128);
    f.cause = "the job ended by signal " + std::to_string(status - 128) +
              (name ? " (" + std::string(name) + ")" : "");
  } else {
    f.cause = "the job exited with status " + std::to_string(status);
    return f;
  }
  f.cause += " (exit status " + std::to_string(status) + ")";
  return f;
}

bool worth_restarting(int status) {
  return status != kExitOk && status != kExitBadInput && status != kExitWriteFailed &&
         status != kExitInterrupted && status != kExitTerminated;
}

std::optional<std::size_t> drop_host(JobCommand& job, const std::string& host,
                                     const fs::path& scratch) {
  const bool from_file = !job.hosts_at && job.hostfile_at;
  if (!job.hosts_at && !job.hostfile_at) return std::nullopt;
  std::vector<std::string> entries;
  if (from_file) {
    std::ifstream in(job.argv[*job.hostfile_at]);
    for (std::string line; std::getline(in, line);) {
      const std::size_t hash = line.find('#');
      if (hash != std::string::npos) line.erase(hash);
      if (line.find_first_not_of(" \t\r") != std::string::npos) entries.push_back(line);
    }
  } else {
    std::istringstream list(job.argv[*job.hosts_at]);
    for (std::string e; std::getline(list, e, ',');)
      if (!e.empty()) entries.push_back(e);
  }
  std::vector<std::string> kept;
  std::size_t slots = 0;
  bool all_stated = true;
  for (const std::string& e : entries) {
    const auto [name, n] = host_entry(e, from_file);
    if (name == host) continue;
    kept.push_back(e);
    all_stated = all_stated && n > 0;
    slots += n;
  }
  if (kept.size() == entries.size() || kept.empty()) return std::nullopt;
  if (from_file) {
    std::ofstream out(scratch, std::ios::trunc);
    for (const std::string& e : kept) out << e << "\n";
    if (!out.flush())
      throw OutputError(scratch.string() + ": cannot write the hosts left after " + host);
    job.argv[*job.hostfile_at] = scratch.string();
  } else {
    std::string list;
    for (const std::string& e : kept) list += (list.empty() ? "" : ",") + e;
    job.argv[*job.hosts_at] = list;
  }
  return all_stated ? slots : SIZE_MAX;
}

CLI::App* add_launch_command(CLI::App& app, LaunchOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "launch",
      "run a training job and restart it from its newest checkpoint when it fails: cohort "
      "launch [options] -- mpirun -np N cohort train ... --save FILE --save-every K");
  cmd->add_option("--max-restarts", o.max_restarts, "restarts before giving up")
      ->transform(unsigned_decimal())
      ->check(CLI::Range(std::size_t{0}, std::size_t{1000}))
      ->capture_default_str();
  cmd->add_option("--min-ranks", o.min_ranks, "fewest ranks a restart may run on")
      ->transform(unsigned_decimal())
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 20))
      ->capture_default_str();
  cmd->add_flag("--shrink", o.shrink,
                "restart on one rank fewer each time (one machine: a test of shrinking)");
  cmd->add_option("command", o.command, "the job: mpirun ... cohort train ... (after --)")
      ->required();
  return cmd;
}

int launch_command(const LaunchOptions& o, const Loaders& loaders, std::ostream& err) {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"})
    if (std::getenv(var) != nullptr)
      throw InputError("cohort launch: runs mpirun itself; start it outside mpirun (" +
                       std::string(var) + " is set)");
  JobCommand job = parse_job_command(o.command);
  const TrainOptions train = train_options(job, loaders);
  const CheckpointOptions& ck = train.checkpoint;
  if (ck.save.empty())
    throw InputError(
        "cohort launch: the command's cohort train: expected --save FILE (the "
        "checkpoints a restart resumes from), found none");
  if (ck.save_every == 0)
    throw InputError(
        "cohort launch: the command's cohort train: expected --save-every N (a "
        "failure loses at most N steps), found none: a restart would start over");
  if (o.shrink && job.mpirun && !job.np_at)
    throw InputError("cohort launch: --shrink: expected the command's mpirun to give -np N " +
                     std::string(job.mpmd ? "in one app context" : "") + ", found none");
  if (job.ranks < o.min_ranks)
    throw InputError("cohort launch: --min-ranks: expected at most the job's " +
                     std::to_string(job.ranks) + " ranks, found " + std::to_string(o.min_ranks));
  // A hostfile without a failed host (created by mkstemp beside --save), removed at the end.
  std::optional<fs::path> scratch_hosts;
  struct Remove {
    std::optional<fs::path>& path;
    ~Remove() {
      std::error_code ec;
      if (path) fs::remove(*path, ec);
    }
  } remove_scratch{scratch_hosts};

  const StopSignals signals;  // the first SIGINT or SIGTERM goes to the job, and ends the launch
  for (std::size_t restarts = 0;; ++restarts) {
    const JobEnd end = run_job(job.argv, err);
    if (end.status == kExitOk) return kExitOk;
    // Asked to stop: the job stopped after its step and saved, and the launch ends as `cohort
    // train` does (130 / 143), whatever mpirun made of it (Open MPI 4 exits 1 after passing a
    // signal on).
    if (end.signalled) return 128 + end.signal;
    const Failure failure = describe_failure(end.status, end.stderr_tail);
    if (!worth_restarting(end.status)) {
      err << "cohort launch: " << failure.cause << "; not restarted ("
          << (end.status == kExitBadInput      ? "bad input fails again alike"
              : end.status == kExitWriteFailed ? "a write failed: free or fix the disk first"
                                               : "a stop that was asked for")
          << ")\n";
      return end.status;
    }
    if (restarts == o.max_restarts) {
      err << "cohort launch: " << failure.cause << "; no restarts left (--max-restarts "
          << o.max_restarts << ")\n";
      return end.status;
    }
    std::size_t ranks = job.ranks;
    std::string dropped;
    if (!failure.node.empty()) {
      if (!scratch_hosts && job.hostfile_at && !job.hosts_at) {
        // A name of its own beside --save (the same paths on every node), never a user's file.
        std::string name = fs::path(ck.save).string() + ".hosts.XXXXXX";
        const int fd = ::mkstemp(name.data());
        if (fd < 0)
          throw OutputError(name + ": cannot create the hostfile without node " + failure.node +
                            ": " + std::strerror(errno));
        ::close(fd);
        scratch_hosts = fs::path(name);
      }
      if (const std::optional<std::size_t> slots =
              drop_host(job, failure.node, scratch_hosts ? *scratch_hosts : fs::path())) {
        dropped = " without node " + failure.node;
        ranks = std::min(ranks, *slots);
      }
    }
    if (o.shrink && job.mpirun) ranks -= 1;
    if (ranks < o.min_ranks) {
      err << "cohort launch: " << failure.cause << "; not restarted: " << ranks
          << " ranks left, fewer than --min-ranks " << o.min_ranks << "\n";
      return end.status;
    }
    if (job.np_at) job.argv[*job.np_at] = std::to_string(ranks);
    job.ranks = ranks;
    if (restarts == 0) job.argv = with_resume_auto(job.argv);
    const checkpoint::Newest newest = checkpoint::newest_checkpoint(
        ck.save, [&loaders](const fs::path& p) { return loaders.checkpoint(p.string()); });
    err << "cohort launch: restart " << restarts + 1 << " of " << o.max_restarts << " after "
        << failure.cause << ": resuming "
        << (newest.checkpoint ? "from step " + std::to_string(newest.checkpoint->step) + " (" +
                                    newest.file.string() + ")"
                              : std::string("from step 0 (no checkpoint yet)"))
        << " on " << ranks << (ranks == 1 ? " rank" : " ranks") << dropped << "\n"
        << std::flush;
  }
}

}  // namespace cohort::cli
