// `cohort eval`, `cohort plot` and `cohort export`: their few options and what they do. Not `cohort
// train` (train_command.cpp, with its option table in options.cpp).
#include "commands.hpp"

#include <algorithm>
#include <filesystem>
#include <iomanip>
#include <memory>
#include <numbers>
#include <optional>
#include <ostream>
#include <tuple>

#include "cohort/core/atomic_file.hpp"
#include "cohort/core/error.hpp"
#include "cohort/data/augment.hpp"
#include "cohort/data/dataset.hpp"
#include "cohort/data/text.hpp"
#include "cohort/export/export.hpp"
#include "cohort/nn/net.hpp"
#include "cohort/report/plot.hpp"
#include "cohort/train/trainer.hpp"
#include "options.hpp"
#include "output.hpp"

namespace cohort::cli {

namespace fs = std::filesystem;

CLI::App* add_eval_command(CLI::App& app, EvalOptions& o) {
  CLI::App* cmd =
      app.add_subcommand("eval", "evaluate a checkpoint on the test (validation) split");
  cmd->add_option("--checkpoint", o.checkpoint, "the checkpoint to evaluate");
  cmd->add_option("--init-from", o.init_from,
                  "instead of a checkpoint, the weights of a safetensors file (as train "
                  "--init-from reads them) for the model --model names");
  cmd->add_option("--model", o.model, "with --init-from: the model spec, as train --model");
  cmd->add_option("--data", o.data_dir,
                  "the data folder, as for train --data (text for a language model's checkpoint)")
      ->capture_default_str();
  cmd->add_option("--summary", o.summary_path, "write a JSON summary to this file");
  cmd->add_option("--logits", o.logits_path,
                  "write the test set's logits to this .npy file (float32, (N, classes))");
  cmd->add_option("--workers", o.workers, "worker replicas (0: one per core)")
      ->transform(unsigned_decimal());
  cmd->add_flag("--quiet", o.quiet, "print nothing (write only the --summary file)");
  return cmd;
}

namespace {

// The logits of `set`'s rows, forward in inference mode over chunks of 500 rows: (N, classes).
// `augment` (may be null): the run's --augment, whose normalization the rows get.
std::vector<float> forward_logits(const nn::Model& model, const float* weights,
                                  const float* running_stats, const data::Dataset& set,
                                  const data::Augmenter* augment) {
  constexpr std::size_t kChunk = 500;
  const auto classes = static_cast<std::size_t>(model.num_classes());
  std::vector<float> out;
  out.reserve(set.count * classes);
  nn::Net net(model);
  std::vector<float> x(kChunk * static_cast<std::size_t>(model.input_features()));  // (n, C, H, W)
  std::vector<std::int32_t> y(kChunk);
  std::vector<std::uint32_t> ids(kChunk);
  for (std::size_t first = 0; first < set.count; first += kChunk) {
    const std::size_t n = std::min(kChunk, set.count - first);
    for (std::size_t i = 0; i < n; ++i) ids[i] = static_cast<std::uint32_t>(first + i);
    if (augment)
      augment->assemble(set, std::span(ids).first(n), 0, /*train=*/false, x.data(), y.data());
    else
      data::assemble_batch(set, std::span(ids).first(n), x.data(), y.data());
    const float* logits = net.forward(weights, x.data(), static_cast<std::int64_t>(n),
                                      model.stats_layout().total() != 0 ? running_stats : nullptr);
    out.insert(out.end(), logits, logits + n * classes);
  }
  return out;
}

// Logits as a NumPy .npy file (version 1.0: magic, header dict padded to 64 bytes, then
// (N, classes) float32 '<f4').
std::string logits_npy(const std::vector<float>& logits, std::size_t rows, std::size_t classes) {
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" +
                       std::to_string(rows) + ", " + std::to_string(classes) + "), }";
  header.append(63 - (10 + header.size()) % 64, ' ');
  header += '\n';
  std::string file = std::string("\x93NUMPY\x01\x00", 8);
  file += static_cast<char>(header.size() & 0xff);
  file += static_cast<char>(header.size() >> 8);
  file += header;
  file.append(reinterpret_cast<const char*>(logits.data()), logits.size() * sizeof(float));
  return file;
}

// A trainer holding checkpoint `ck`'s weights for evaluation on `data` (which it keeps a
// reference to), and the config it was built with. Checks that the data suits the model: text
// for a language model, images or tables for a classifier.
struct Restored {
  train::TrainConfig config;
  std::unique_ptr<train::Trainer> trainer;
};
Restored restore_for_eval(checkpoint::Checkpoint ck, const std::string& name,
                          const data::Splits& data, std::size_t workers) {
  const auto block = static_cast<std::size_t>(nn::spec_window(ck.model));
  if (block != 0 && !data.train.text())
    throw InputError(
        "--data: expected text (input.txt, or train_tokens.npy and val_tokens.npy) "
        "for " +
        name + "'s language model '" + ck.model + "', found " + data.train.describe_shape());
  if (block == 0 && data.train.text())
    throw InputError("--data: expected images or tables for " + name + "'s model '" + ck.model +
                     "', found text (a language model's data)");
  Restored r;
  train::TrainConfig& config = r.config;
  config.model = ck.model;
  config.seed = ck.seed;
  config.batch = ck.batch;
  config.micro_batch = ck.micro_batch;
  config.drop_last = ck.drop_last;
  config.workers = workers;
  config.augment = recorded_augment(ck, name);  // the test rows get its normalization
  // The optimizer only shapes the state the checkpoint must match; evaluation never steps.
  config.optimizer.kind = optim::parse_kind(ck.optimizer, name + ": optimizer");
  if (config.optimizer.kind == optim::Kind::kSgd)
    config.optimizer.momentum = ck.state.empty() ? 0.0f : config.optimizer.momentum;
  // Evaluation reads the weights, not the training split, whose size may differ from the run's
  // (a text folder with its own val.txt trains on all of input.txt, a folder may hold fewer
  // training rows than the run's batch): the split and the batch drawn from it go unchecked.
  ck.train_count = data.train.count;
  ck.batch = config.batch =
      std::min<std::uint64_t>(ck.batch, std::max<std::size_t>(1, data.train.count));
  ck.micro_batch = config.micro_batch = std::min<std::uint64_t>(ck.micro_batch, ck.batch);
  r.trainer = std::make_unique<train::Trainer>(config, data);
  r.trainer->restore(ck, name);
  return r;
}

Evaluation evaluate_restored(train::Trainer& trainer, std::size_t params) {
  Evaluation e;
  std::tie(e.loss, e.accuracy) = trainer.evaluate_test();
  e.digest = train::weights_digest(trainer.weights(), params, trainer.running_stats(),
                                   trainer.model().stats_layout().total());
  e.language_model = trainer.model().kind().window() > 0;
  return e;
}

// `cohort eval`'s line and --summary file for weights from `source` (`key`: "checkpoint" or
// "init_from") of `model` after `step` steps. A language model's split is its validation text;
// its loss is per token, shown in bits too.
void report_evaluation(const EvalOptions& o, const char* key, const std::string& source,
                       const std::string& model, std::uint64_t step, const Evaluation& e,
                       std::ostream& out) {
  if (!o.quiet) {
    out << "cohort eval: " << source << " (" << model << ", step " << step << ") on " << o.data_dir
        << std::fixed << std::setprecision(4);
    if (e.language_model)
      out << ": val loss " << e.loss << " (" << std::setprecision(3) << e.loss / std::numbers::ln2
          << " bits/token), next-token accuracy " << std::setprecision(4) << e.accuracy;
    else
      out << ": test loss " << e.loss << ", test accuracy " << e.accuracy;
    out << ", weights digest " << e.digest << "\n";
  }
  create_output_folders({o.summary_path, o.logits_path});
  if (o.summary_path.empty()) return;
  json summary{{key, source},
               {"model", model},
               {"step", step},
               {"test_loss", e.loss},
               {"test_accuracy", e.accuracy},
               {"weights_digest", e.digest}};
  if (e.language_model) {
    summary["val_loss"] = e.loss;
    summary["val_bpc"] = e.loss / std::numbers::ln2;
  }
  write_file_atomically(o.summary_path, summary.dump(2) + "\n");
}

}  // namespace

Evaluation evaluate(const checkpoint::Checkpoint& ck, const std::string& name,
                    const data::Splits& data, std::size_t workers) {
  Restored r = restore_for_eval(ck, name, data, workers);
  return evaluate_restored(*r.trainer, ck.weights.size());
}

std::vector<float> logits(const checkpoint::Checkpoint& ck, const std::string& name,
                          const data::Dataset& rows) {
  if (nn::spec_window(ck.model) != 0)
    throw InputError(name + ": expected a classifier's checkpoint, found a language model's ('" +
                     ck.model + "': its logits are per position; sample() draws from them)");
  if (!recorded_augment(ck, name).empty())
    throw InputError(name + ": its run normalized rows by its training split (--augment '" +
                     recorded_augment(ck, name) +
                     "'), which logits() does not have: evaluate() on the data folder instead");
  const nn::SampleShape input{static_cast<std::int64_t>(ck.input[0]),
                              static_cast<std::int64_t>(ck.input[1]),
                              static_cast<std::int64_t>(ck.input[2])};
  const nn::SampleShape found = train::input_shape(rows);
  if (found.C != input.C || found.H != input.H || found.W != input.W)
    throw InputError("x: expected samples of shape " + input.str() + " (" + name +
                     "'s model's input), found " + found.str());
  // Both splits are the rows; their labels are unused, the class count is the model's.
  data::Splits both{rows, rows, {}};
  const nn::Model model = nn::Model::parse(ck.model, input, static_cast<std::int64_t>(ck.vocab));
  for (data::Dataset* d : {&both.train, &both.test}) {
    d->num_classes = static_cast<std::size_t>(model.num_classes());
    std::fill(d->labels.begin(), d->labels.end(), 0u);
  }
  Restored r = restore_for_eval(ck, name, both, 0);
  return forward_logits(r.trainer->model(), r.trainer->weights(), r.trainer->running_stats(),
                        both.test, nullptr);
}

namespace {

// `cohort eval --init-from FILE --model SPEC`: the weights of a safetensors file on the data's
// test split, without a checkpoint.
int eval_weights(const EvalOptions& o, std::ostream& out) {
  std::int64_t folder_vocab = 0;
  const std::string spec = folder_model(o.init_from, o.model, folder_vocab);
  if (spec.empty())
    throw InputError(
        "--init-from: expected --model SPEC as well (a file of weights names no "
        "model), found none");
  if (!o.logits_path.empty())
    throw InputError("--logits: expected --checkpoint (a classifier's), found --init-from");
  check_output_path("--summary", o.summary_path);
  check_outputs_apart({{"--summary", o.summary_path}}, {{"--init-from", o.init_from}}, o.data_dir);
  const auto block = static_cast<std::size_t>(nn::spec_window(spec));
  const data::Splits data = data::load_data_folder(o.data_dir, 10, block);
  check_folder_vocab(o.init_from, folder_vocab, data.train);
  train::TrainConfig config;
  config.model = spec;
  config.workers = o.workers;
  // No step trains: one sample a batch, so that the trainer's leaf gradient buffers (which a
  // training batch of a large model would make many) are one.
  config.batch = 1;
  const nn::Model model = nn::Model::parse(spec, train::input_shape(data.train),
                                           static_cast<std::int64_t>(data.train.num_classes));
  train::validate(config, model, data);
  const exporting::InitialWeights w = exporting::read_weights(o.init_from, model);
  train::Trainer trainer(config, data);
  trainer.start_from(w.params.data(), w.stats.empty() ? nullptr : w.stats.data());
  report_evaluation(o, "init_from", o.init_from, spec, 0,
                    evaluate_restored(trainer, model.layout().total()), out);
  return kExitOk;
}

}  // namespace

int eval_command(const EvalOptions& o, std::ostream& out) {
  if (!o.init_from.empty() && !o.checkpoint.empty())
    throw InputError("--init-from: expected either --checkpoint or --init-from, found both");
  if (!o.init_from.empty()) return eval_weights(o, out);
  if (o.checkpoint.empty())
    throw InputError(
        "--checkpoint: expected a checkpoint to evaluate (or --init-from FILE with "
        "--model SPEC), found none");
  if (!o.model.empty())
    throw InputError("--model: expected it with --init-from only (a checkpoint names its model)");
  check_output_path("--summary", o.summary_path);
  check_output_path("--logits", o.logits_path);
  check_outputs_apart({{"--summary", o.summary_path}, {"--logits", o.logits_path}},
                      {{"--checkpoint", o.checkpoint}}, o.data_dir);
  const checkpoint::Checkpoint ck = checkpoint::load_checkpoint(o.checkpoint);
  const auto block = static_cast<std::size_t>(nn::spec_window(ck.model));
  if (block != 0 && !o.logits_path.empty())
    throw InputError("--logits: expected a classifier's checkpoint, found a language model's ('" +
                     ck.model + "': its logits are per position; `cohort sample` draws from them)");
  if (block == 0 && data::is_text_folder(o.data_dir))
    throw InputError("--data: expected images or tables for " + o.checkpoint + "'s model '" +
                     ck.model + "', found text in " + o.data_dir +
                     " (input.txt or token arrays, a language model's data)");
  const data::Splits data = data::load_data_folder(o.data_dir, 10, block);
  if (block != 0 && !data.train.text())
    throw InputError(
        "--data: expected text (input.txt, or train_tokens.npy and val_tokens.npy) for " +
        o.checkpoint + "'s language model '" + ck.model + "', found " + o.data_dir + " with " +
        data.train.describe_shape());
  Restored r = restore_for_eval(ck, o.checkpoint, data, o.workers);
  report_evaluation(o, "checkpoint", o.checkpoint, ck.model, ck.step,
                    evaluate_restored(*r.trainer, ck.weights.size()), out);
  if (!o.logits_path.empty()) {
    std::optional<data::Augmenter> augment;
    if (!r.config.augment.empty())
      augment.emplace(data::parse_augment(r.config.augment), data.train, r.config.seed);
    const train::Trainer& t = *r.trainer;
    write_file_atomically(
        o.logits_path,
        logits_npy(forward_logits(t.model(), t.weights(), t.running_stats(), data.test,
                                  augment ? &*augment : nullptr),
                   data.test.count, static_cast<std::size_t>(t.model().num_classes())));
  }
  return kExitOk;
}

CLI::App* add_plot_command(CLI::App& app, PlotOptions& o) {
  CLI::App* cmd =
      app.add_subcommand("plot", "draw loss and accuracy curves of --metrics files as an SVG");
  cmd->add_option("metrics", o.files, "JSON Lines files written by train --metrics")->required();
  cmd->add_option("-o,--output", o.output, "the SVG file to write")->required();
  cmd->add_option("--title", o.title, "a title above the curves");
  cmd->add_option("--width", o.width, "image width in pixels")->capture_default_str();
  cmd->add_flag("--quiet", o.quiet, "print nothing");
  return cmd;
}

// Every file is read and checked before the SVG is written (atomically). Runs whose files share
// a name are labelled by their folder too.
int plot_command(const PlotOptions& o, std::ostream& out) {
  if (o.output.empty()) throw InputError("-o/--output: expected a file name, found ''");
  check_output_path("--output", o.output);
  std::vector<NamedPath> inputs;
  for (const std::string& f : o.files) inputs.push_back({"the metrics file", f});
  check_outputs_apart({{"--output", o.output}}, inputs);
  if (o.width < 600)
    throw InputError("--width: expected at least 600 (pixels), found " + std::to_string(o.width));
  std::vector<report::Series> runs;
  for (const std::string& f : o.files) runs.push_back(report::read_metrics(f));
  for (std::size_t i = 0; i < runs.size(); ++i)
    for (std::size_t j = 0; j < runs.size(); ++j)
      if (i != j && runs[i].label == fs::path(o.files[j]).filename().string())
        runs[i].label = fs::path(o.files[i]).lexically_normal().string();
  create_output_folders({o.output});
  write_file_atomically(o.output, report::render_svg(runs, {.width = o.width, .title = o.title}));
  if (!o.quiet)
    out << "cohort plot: " << runs.size() << (runs.size() == 1 ? " run" : " runs") << " -> "
        << o.output << "\n";
  return kExitOk;
}

CLI::App* add_export_command(CLI::App& app, ExportOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "export", "write a checkpoint's weights for PyTorch (safetensors) or ONNX runtimes");
  cmd->add_option("--checkpoint", o.checkpoint, "the checkpoint to export")->required();
  cmd->add_option("--format", o.format, names_text(exporting::kFormatNames))->required();
  cmd->add_option("-o,--output", o.output, "the file to write (--layout hf: the folder)")
      ->required();
  cmd->add_option("--layout", o.layout,
                  "a language model's safetensors: nanogpt (its names, one file) or hf (Hugging "
                  "Face's GPT-2 folder: model.safetensors and config.json)")
      ->check(CLI::IsMember({"nanogpt", "hf"}))
      ->capture_default_str();
  cmd->add_flag("--quiet", o.quiet, "print nothing");
  return cmd;
}

int export_command(const ExportOptions& o, std::ostream& out) {
  const exporting::Format format = exporting::parse_format(o.format);
  exporting::export_checkpoint(o.checkpoint, format, o.output,
                               parse_name(exporting::kLayoutNames, o.layout, "--layout"));
  if (!o.quiet)
    out << "cohort export: " << o.checkpoint << " -> " << o.output << " ("
        << exporting::to_string(format) << ")\n";
  return kExitOk;
}

}  // namespace cohort::cli
