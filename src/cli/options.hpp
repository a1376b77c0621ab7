// `cohort train`'s option table: one row per flag giving its TOML key, type, range, choices
// (from the enums' name tables), help and where the value is stored. The CLI11 options, the
// job config's schema and the checks of command-line values are all built from it, so a flag
// is described once. Not the command itself (commands.hpp) and not the TOML reader (config/).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "cohort/cli/cli.hpp"
#include "cohort/config/job_config.hpp"
#include "cohort/train/trainer.hpp"

namespace cohort::cli {

// --resume's word for the newest checkpoint of --save (checkpoint::newest_checkpoint).
inline constexpr std::string_view kResumeAuto = "auto";

struct CheckpointOptions {
  std::string save, resume;
  std::uint64_t save_every = 0;
  std::size_t keep = 1;
};

// Everything `cohort train` is told, holding the command's defaults until parsing stores over
// them. The table's rows point into it.
struct TrainOptions {
  // config starts as train::TrainConfig{}: the library's defaults are the command's recipe.
  train::TrainConfig config;
  std::string config_path;  // --config: already expanded into flags before parsing
  std::string data_dir = data::kDefaultDataDir;
  std::string summary_path, metrics_path, trace_path;
  CheckpointOptions checkpoint;
  std::size_t log_every = 50;
  double stall_timeout = 300;  // several ranks: seconds without a finished step that end the job
  bool quiet = false;
  bool keep_last = false;      // config.drop_last is its negation
  bool plain_layouts = false;  // config.blocked_layouts is its negation
  bool dry_run = false;
  bool model_given = false;  // --model on the command line or in the config (not the default)
  // --kernels: the kernel set (nn::kernel_set) of the run whose effective config this command
  // repeats; "" none. It changes nothing that runs: where this machine's set differs, the
  // header says the weights may differ in their last bits.
  std::string kernels;

  // `config` with the flags that the table stores elsewhere applied (drop_last,
  // blocked_layouts, trace).
  train::TrainConfig train_config() const;
};

// One row of the table.
struct TrainFlag {
  config::Key key;  // flag, TOML key ("" for a command-line-only flag), type, range, choices
  std::string help;
  // Adds the CLI11 option storing into `o`; --help shows `o`'s value as the default.
  CLI::Option* (*add)(CLI::App& cmd, TrainOptions& o, const TrainFlag& row);
  // The stored value as text (the help's default, messages) and, for numbers, as a double
  // (NaN for other types).
  std::string (*text)(const TrainOptions& o);
  double (*number)(const TrainOptions& o);
};

// The --help group of a row: its TOML section, capitalised ("Optimizer" for optimizer.lr), and
// "Run" for the command-line-only flags (--config, --dry-run).
std::string flag_group(const TrainFlag& row);

// The table. --help lists it by group (data, model, optimizer, schedule, run, output,
// checkpoint), each group's flags in the table's order.
const std::vector<TrainFlag>& train_flags();

// The `train` subcommand of `app` with every row's option, storing into `o` (which must
// outlive the parse). A flag given twice takes its last value.
CLI::App* add_train_command(CLI::App& app, TrainOptions& o);

// For every unsigned option: CLI11 2.1 reads one with strtoull, so "-1" wraps to 2^64 - 1, a
// number past that saturates and "010" is octal. This takes decimal digits that fit in 64 bits
// (leading zeros dropped: an Option::transform, which rewrites the text) and refuses the rest.
CLI::Validator unsigned_decimal();

// After parsing: each flag that was given (on the command line or by the config) checked against
// its row — a number against its range, a path against its type. Throws InputError
// "<flag>: expected ..., found ...". outputs = false: the paths of files written (--summary,
// --save, ...) go unchecked, on a rank that writes none.
void check_train_flags(const CLI::App& cmd, const TrainOptions& o, bool outputs = true);

// `cohort train --config FILE ...`: the file's keys (read by `loaders.config`) become flags
// placed before the command line's own. A key whose flag the command line gives is replaced
// before anything checks it: the file's value is neither checked nor passed on. `outputs`: false
// on a process that writes no files (an MPI rank other than 0), which reads the file's output
// paths as plain strings, unchecked. A second --config is refused (InputError). Other commands'
// arguments are returned unchanged.
std::vector<std::string> with_config_flags(std::vector<std::string> args, const Loaders& loaders,
                                           bool outputs = true);

}  // namespace cohort::cli
