// cohort's commands as calls, for programs that embed the engine (the Python module, python/):
// each keeps its command's promises — every input checked before work, the same messages
// (InputError for bad input, the CLI's exit 2; OutputError for a file that could not be written,
// exit 74), the same files, the same weights. One process: several ranks stay `cohort train`'s.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>
#include <vector>

#include "cohort/checkpoint/checkpoint.hpp"
#include "cohort/cli/cli.hpp"
#include "cohort/data/dataset.hpp"

namespace cohort::cli {

// What a program adds to `cohort train`.
struct TrainHooks {
  // Every step's line as `--metrics` writes it with `--log-every 1` ("step", or "skip" for a
  // skipped step) and every epoch's and evaluation's ("epoch", "eval"), on the thread that
  // trains. false stops the run as a signal does: after that step (after an epoch's line, before
  // the next epoch), with the final save.
  std::function<bool(const nlohmann::json& line)> on_line;
  // Polled after every step; true stops the run there, as on_line's false does.
  std::function<bool()> stop;
  // true: SIGINT and SIGTERM stop the run, as in `cohort train` (StopSignals). false: the
  // program keeps its own handling of them and asks for a stop through `stop`.
  bool take_signals = true;
  // Where `loaders.data` does not read --data (arrays in memory): what the effective config and
  // the summary name as the data ("" keeps --data's folder).
  std::string data_name;
};

struct TrainOutcome {
  nlohmann::json summary;  // the --summary file's object (also for a stopped run)
  bool stopped = false;    // by a hook (or a signal, with take_signals)
};

// `cohort train ARGS` (ARGS: the flags after `train`; the config file of --config is read through
// `loaders.config`, the data through `loaders.data`): progress to `out`, warnings to `err`, the
// files the flags ask for. Throws InputError or OutputError; a --dry-run returns a null summary.
TrainOutcome train(const std::vector<std::string>& args, const Loaders& loaders,
                   const TrainHooks& hooks, std::ostream& out, std::ostream& err);

// `cohort eval`'s figures: a checkpoint's loss and accuracy on `data`'s test (validation) split
// and its weights digest. `name` names the checkpoint in messages; workers 0: one per core.
struct Evaluation {
  double loss = 0, accuracy = 0;
  std::string digest;
  bool language_model = false;  // loss and accuracy are per token, on the validation split
};
Evaluation evaluate(const checkpoint::Checkpoint& ck, const std::string& name,
                    const data::Splits& data, std::size_t workers = 0);

// The logits (rows.count, classes) of a classifier's checkpoint for the samples of `rows` (their
// labels unused), as `cohort eval --logits` computes them (the run's --augment normalization,
// inference mode). InputError for a language model's checkpoint or rows of another sample shape.
std::vector<float> logits(const checkpoint::Checkpoint& ck, const std::string& name,
                          const data::Dataset& rows);

// The text `cohort sample --checkpoint PATH --prompt PROMPT ...` prints.
struct SampleRequest {
  std::string checkpoint, prompt;
  std::string tokenizer;  // --tokenizer: GPT-2's vocab.json and merges.txt; "" none
  std::size_t tokens = 500;
  double temperature = 1.0;
  std::size_t top_k = 0;  // 0: every token
  std::uint64_t seed = 1;
};
std::string sample(const SampleRequest& request);

}  // namespace cohort::cli
