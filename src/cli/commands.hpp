// The commands of `cohort`: each takes its parsed options, checks every input before any work
// and returns an exit code (throwing InputError for bad input). Not the parsing: `train`'s
// options come from the option table (options.hpp); eval's and plot's few are added here.
#pragma once

#include <CLI/CLI.hpp>

#include <iosfwd>
#include <string>
#include <vector>

#include "cohort/cli/cli.hpp"
#include "cohort/cli/session.hpp"
#include "cohort/core/error.hpp"
#include "cohort/dist/comm.hpp"
#include "options.hpp"

namespace cohort::cli {

// `cohort train`: checks every input, then (unless --dry-run) trains with progress, Ctrl-C
// handling, checkpoints and the files asked for. Warnings (the files --resume auto passed over)
// go to `err`.
// With several ranks (`comm`, every rank runs this with the same options, or refuse_train): the
// inputs are checked on every rank and agreed on before any other collective (agreement.hpp:
// JobInputError on every rank if any rank failed or the ranks differ in what they would train);
// only rank 0 prints and writes files; after the agreement any failure ends the whole job
// (Comm::abort) with the rank in its message.
// `hooks` and `outcome`: a program's call (session.hpp's train); one process only.
int train_command(const TrainOptions& o, const Loaders& loaders, std::ostream& out,
                  std::ostream& err, dist::Comm& comm, const TrainHooks& hooks = {},
                  TrainOutcome* outcome = nullptr);

// Several ranks: this rank's `cohort train` failed before train_command (its command line or
// config file): it joins the agreement the other ranks' train_command waits in, so that none
// waits for it. Returns the agreement's lines (JobInputError::lines()). Never throws.
std::vector<std::string> refuse_train(const std::string& problem, dist::Comm& comm);

struct EvalOptions {
  std::string checkpoint;
  std::string init_from, model;  // weights of a safetensors file, for the model --model names
  std::string data_dir = data::kDefaultDataDir;
  std::string summary_path;
  std::string logits_path;
  std::size_t workers = 0;
  bool quiet = false;  // no result line (the --summary file still has it)
};
CLI::App* add_eval_command(CLI::App& app, EvalOptions& o);
// `cohort eval`: a checkpoint's test loss, accuracy and weights digest; with --logits, the test
// set's logits as a .npy file (float32, (N, classes), little-endian).
int eval_command(const EvalOptions& o, std::ostream& out);

struct PlotOptions {
  std::vector<std::string> files;
  std::string output, title;
  int width = 1000;
  bool quiet = false;  // no line naming the SVG written
};
CLI::App* add_plot_command(CLI::App& app, PlotOptions& o);
// `cohort plot`: the curves of --metrics files as one SVG.
int plot_command(const PlotOptions& o, std::ostream& out);

struct ExportOptions {
  std::string checkpoint, format, output;
  std::string layout = "nanogpt";
  bool quiet = false;
};
CLI::App* add_export_command(CLI::App& app, ExportOptions& o);
// `cohort export`: a checkpoint's weights as safetensors or ONNX (cohort/export/export.hpp).
int export_command(const ExportOptions& o, std::ostream& out);

struct SampleOptions {
  std::string checkpoint, prompt;
  std::string tokenizer;  // GPT-2's vocab.json and merges.txt; "" none
  std::size_t tokens = 500;
  double temperature = 1.0;
  std::size_t top_k = 0;  // 0: every token
  std::uint64_t seed = 1;
  bool quiet = false;  // no rate line on stderr
};
CLI::App* add_sample_command(CLI::App& app, SampleOptions& o);
// `cohort sample`: text from a language model's checkpoint (sample_command.cpp): the prompt, then
// `tokens` tokens drawn one at a time (nn::GptGenerator), the same text for the same seed. Its
// rate goes to `err`.
int sample_command(const SampleOptions& o, std::ostream& out, std::ostream& err);

}  // namespace cohort::cli
