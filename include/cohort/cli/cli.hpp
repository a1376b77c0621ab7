// The `cohort` command line: argument parsing (CLI11) from one option table that also gives the
// job config's schema, every input checked before anything runs, progress on the terminal, the
// summary table and the JSON files. A thin shell over train::Trainer; it never trains by itself.
#pragma once

#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "cohort/checkpoint/checkpoint.hpp"
#include "cohort/config/job_config.hpp"
#include "cohort/data/dataset.hpp"

namespace cohort::cli {

// Exit codes (README): 0 success, 1 internal error, 2 bad input or usage, 74 a file that could
// not be written once work had started (sysexits.h's EX_IOERR: a full disk, a failed rename; the
// inputs were fine), 130 stopped by Ctrl-C (SIGINT), 143 by SIGTERM (after the step in progress,
// and a checkpoint if --save is set; several ranks: on every rank, 143 if any rank had SIGTERM).
inline constexpr int kExitOk = 0;
inline constexpr int kExitInternal = 1;
inline constexpr int kExitBadInput = 2;
inline constexpr int kExitWriteFailed = 74;
inline constexpr int kExitInterrupted = 130;  // 128 + SIGINT
inline constexpr int kExitTerminated = 143;   // 128 + SIGTERM

// What the `cohort` executable does first, while it has one thread (before MPI starts its
// own): opens /dev/null on any of descriptors 0-2 that is closed (a file opened later, e.g.
// --metrics, would take it and receive what is printed there), ignores SIGPIPE (a reader that
// went away fails the write instead: progress stops, training goes on), and takes SIGINT and
// SIGTERM on a thread of its own (a run stops after the current step). Once per process.
void prepare_process();

// Runs `cohort <args>`; human output to `out`, errors to `err`. Never throws.
int run(int argc, const char* const* argv, std::ostream& out, std::ostream& err);

// Where `cohort train` gets its inputs: the job config named by --config (as flags), the data
// folder and the checkpoint to resume. Each throws InputError naming the path for a bad input.
// disk_loaders() reads the files; a fuzzer or a test injects cheaper or safer ones.
struct Loaders {
  // The file's keys as flags, read against `schema` (config::job_config_flags).
  std::function<std::vector<std::string>(const std::string& path, const config::Schema& schema)>
      config;
  // text_block: the block of a language model (--model gpt:...), whose text is read as windows
  // of block + 1 tokens; 0 for other models (data::load_data_folder).
  std::function<std::shared_ptr<const data::Splits>(const std::string& dir, std::size_t text_block)>
      data;
  std::function<checkpoint::Checkpoint(const std::string& path)> checkpoint;
};
Loaders disk_loaders();

// `cohort train <args> --dry-run` with these loaders: parses the flags (and the config they
// name), checks every input as a real run would before its first step — table ranges, the data,
// the model against the data, train::validate, output paths, the checkpoint to resume — prints
// the effective config and returns kExitOk, or prints the problem and returns kExitBadInput.
// Trains nothing, writes no file, sizes nothing from an unchecked value. Never throws; any other
// outcome (kExitInternal) is a bug.
int check_train(const std::vector<std::string>& args, std::ostream& out, std::ostream& err,
                const Loaders& loaders = disk_loaders());

// `cohort --version`: cohort's version (project(VERSION) in CMakeLists.txt) and the oneDNN and
// oneTBB libraries it runs on, one a line.
std::string version_text();

// The job config's schema: the rows of `cohort train`'s option table that have a TOML key.
const config::Schema& train_schema();

}  // namespace cohort::cli
