// `cohort eval`, `cohort plot` and `cohort export`: their few options and what they do. Not `cohort
// train` (train_command.cpp, with its option table in options.cpp).
#include "commands.hpp"

#include <filesystem>
#include <iomanip>
#include <numbers>
#include <optional>
#include <ostream>

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
  cmd->add_option("--checkpoint", o.checkpoint, "the checkpoint to evaluate")->required();
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

// The test set's logits, forward in inference mode over chunks of 500 rows, as a NumPy .npy
// file (version 1.0: magic, header dict padded to 64 bytes, then (N, classes) float32 '<f4').
// `augment` (may be null): the run's --augment, whose normalization the rows get.
std::string logits_npy(const nn::Model& model, const float* weights, const float* running_stats,
                       const data::Dataset& test, const data::Augmenter* augment) {
  constexpr std::size_t kChunk = 500;
  const auto classes = static_cast<std::size_t>(model.num_classes());
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" +
                       std::to_string(test.count) + ", " + std::to_string(classes) + "), }";
  header.append(63 - (10 + header.size()) % 64, ' ');
  header += '\n';
  std::string file = std::string("\x93NUMPY\x01\x00", 8);
  file += static_cast<char>(header.size() & 0xff);
  file += static_cast<char>(header.size() >> 8);
  file += header;
  nn::Net net(model);
  std::vector<float> x(kChunk * static_cast<std::size_t>(model.input_features()));  // (n, C, H, W)
  std::vector<std::int32_t> y(kChunk);
  std::vector<std::uint32_t> ids(kChunk);
  for (std::size_t first = 0; first < test.count; first += kChunk) {
    const std::size_t n = std::min(kChunk, test.count - first);
    for (std::size_t i = 0; i < n; ++i) ids[i] = static_cast<std::uint32_t>(first + i);
    if (augment)
      augment->assemble(test, std::span(ids).first(n), 0, /*train=*/false, x.data(), y.data());
    else
      data::assemble_batch(test, std::span(ids).first(n), x.data(), y.data());
    const float* logits = net.forward(weights, x.data(), static_cast<std::int64_t>(n),
                                      model.stats_layout().total() != 0 ? running_stats : nullptr);
    file.append(reinterpret_cast<const char*>(logits),
                n * classes * sizeof(float));  // (n, classes)
  }
  return file;
}

}  // namespace

int eval_command(const EvalOptions& o, std::ostream& out) {
  check_output_path("--summary", o.summary_path);
  check_output_path("--logits", o.logits_path);
  check_outputs_apart({{"--summary", o.summary_path}, {"--logits", o.logits_path}},
                      {{"--checkpoint", o.checkpoint}}, o.data_dir);
  checkpoint::Checkpoint ck = checkpoint::load_checkpoint(o.checkpoint);
  const auto block = static_cast<std::size_t>(nn::spec_window(ck.model));
  if (block != 0 && !o.logits_path.empty())
    throw InputError("--logits: expected a classifier's checkpoint, found a language model's ('" +
                     ck.model + "': its logits are per position; `cohort sample` draws from them)");
  if (block == 0 && data::is_text_folder(o.data_dir))
    throw InputError("--data: expected images or tables for " + o.checkpoint + "'s model '" +
                     ck.model + "', found text in " + o.data_dir +
                     " (input.txt or token arrays, a language model's data)");
  data::Splits data = data::load_data_folder(o.data_dir, 10, block);
  if (block != 0 && !data.train.text())
    throw InputError(
        "--data: expected text (input.txt, or train_tokens.npy and val_tokens.npy) for " +
        o.checkpoint + "'s language model '" + ck.model + "', found " + o.data_dir + " with " +
        data.train.describe_shape());
  train::TrainConfig config;
  config.model = ck.model;
  config.seed = ck.seed;
  config.batch = ck.batch;
  config.micro_batch = ck.micro_batch;
  config.drop_last = ck.drop_last;
  config.workers = o.workers;
  config.augment = recorded_augment(ck, o.checkpoint);  // the test rows get its normalization
  // The optimizer only shapes the state the checkpoint must match; evaluation never steps.
  config.optimizer.kind = optim::parse_kind(ck.optimizer, o.checkpoint + ": optimizer");
  if (config.optimizer.kind == optim::Kind::kSgd)
    config.optimizer.momentum = ck.state.empty() ? 0.0f : config.optimizer.momentum;
  // Evaluation reads the weights, not the training split, whose size may differ from the run's
  // (a text folder with its own val.txt trains on all of input.txt, a folder may hold fewer
  // training rows than the run's batch): the split and the batch drawn from it go unchecked.
  ck.train_count = data.train.count;
  ck.batch = config.batch =
      std::min<std::uint64_t>(ck.batch, std::max<std::size_t>(1, data.train.count));
  ck.micro_batch = config.micro_batch = std::min<std::uint64_t>(ck.micro_batch, ck.batch);
  train::Trainer trainer(config, data);
  trainer.restore(ck, o.checkpoint);
  auto [loss, accuracy] = trainer.evaluate_test();
  const std::string digest =
      train::weights_digest(trainer.weights(), ck.weights.size(), trainer.running_stats(),
                            trainer.model().stats_layout().total());
  // A language model's split is its validation text; its loss is per token, shown in bits too.
  if (!o.quiet) {
    out << "cohort eval: " << o.checkpoint << " (" << ck.model << ", step " << ck.step << ") on "
        << o.data_dir << std::fixed << std::setprecision(4);
    if (block != 0)
      out << ": val loss " << loss << " (" << std::setprecision(3) << loss / std::numbers::ln2
          << " bits/token), next-token accuracy " << std::setprecision(4) << accuracy;
    else
      out << ": test loss " << loss << ", test accuracy " << accuracy;
    out << ", weights digest " << digest << "\n";
  }
  create_output_folders({o.summary_path, o.logits_path});
  if (!o.summary_path.empty()) {
    json summary{
        {"checkpoint", o.checkpoint}, {"model", ck.model},         {"step", ck.step},
        {"test_loss", loss},          {"test_accuracy", accuracy}, {"weights_digest", digest}};
    if (block != 0) {
      summary["val_loss"] = loss;
      summary["val_bpc"] = loss / std::numbers::ln2;
    }
    write_file_atomically(o.summary_path, summary.dump(2) + "\n");
  }
  if (!o.logits_path.empty()) {
    std::optional<data::Augmenter> augment;
    if (!config.augment.empty())
      augment.emplace(data::parse_augment(config.augment), data.train, config.seed);
    write_file_atomically(o.logits_path,
                          logits_npy(trainer.model(), trainer.weights(), trainer.running_stats(),
                                     data.test, augment ? &*augment : nullptr));
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
  cmd->add_option("-o,--output", o.output, "the file to write")->required();
  cmd->add_flag("--quiet", o.quiet, "print nothing");
  return cmd;
}

int export_command(const ExportOptions& o, std::ostream& out) {
  const exporting::Format format = exporting::parse_format(o.format);
  exporting::export_checkpoint(o.checkpoint, format, o.output);
  if (!o.quiet)
    out << "cohort export: " << o.checkpoint << " -> " << o.output << " ("
        << exporting::to_string(format) << ")\n";
  return kExitOk;
}

}  // namespace cohort::cli
