// `cohort train` after parsing: every input checked before anything is built (all a dry run
// does), then the trainer with progress, Ctrl-C handling, checkpoints and the files asked for.
// Not the flags (options.cpp) and not the training (train::Trainer).
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>
#include <optional>

#include "cohort/core/atomic_file.hpp"
#include "cohort/core/error.hpp"
#include "commands.hpp"
#include "output.hpp"
#include "progress.hpp"

namespace cohort::cli {

namespace {

// The inputs of a run, each one checked. Nothing in here is sized from the flags: the model is
// parsed (shapes only) and validated against the data, never allocated.
struct Checked {
  train::TrainConfig config;
  std::shared_ptr<const data::Splits> data;
  std::size_t parameters = 0;
  std::optional<checkpoint::Checkpoint> resume;
  double load_seconds = 0;  // reading the data
};

// Checks what the option table cannot check alone: flags that need each other, the checkpoint
// to resume, the data, and the model and config against the data (train::validate). The paths
// and ranges of the flags given were checked after parsing (check_train_flags).
Checked check_inputs(const TrainOptions& o, const Loaders& loaders) {
  Checked in;
  in.config = o.train_config();
  const CheckpointOptions& ck = o.checkpoint;
  if (ck.save_every != 0 && ck.save.empty())
    throw InputError("--save-every: expected --save FILE as well, found none");
  if (!ck.resume.empty()) in.resume = loaders.checkpoint(ck.resume);  // all checked, none used
  const auto t_load = std::chrono::steady_clock::now();
  in.data = loaders.data(o.data_dir);
  in.load_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
  const data::Dataset& train_set = in.data->train;
  const nn::Model model = nn::Model::parse(in.config.model, train::input_shape(train_set));
  train::validate(in.config, model, *in.data);
  if (in.resume) train::check_resume(in.config, model, *in.data, *in.resume, ck.resume);
  in.parameters = model.layout().numel();
  return in;
}

// --dry-run: what was checked and the config a run would start with on this machine (workers
// and micro_batch resolved as the trainer resolves them).
int dry_run(const TrainOptions& o, const Checked& in, std::ostream& out) {
  out << "cohort train --dry-run: " << in.config.model << " (" << in.parameters
      << " parameters) on " << o.data_dir << " (" << in.data->train.count << " train, "
      << in.data->test.count << " test samples of " << in.data->train.describe_shape()
      << "): every input checked, nothing trained or written\n"
      << config_text(config_json(train::resolve_defaults(in.config), o.data_dir));
  if (in.resume)
    out << "  would resume from " << o.checkpoint.resume << " at step " << in.resume->step << "\n";
  return kExitOk;
}

}  // namespace

int train_command(const TrainOptions& o, const Loaders& loaders, std::ostream& out) {
  const Checked in = check_inputs(o, loaders);
  if (o.dry_run) return dry_run(o, in, out);
  const CheckpointOptions& ck = o.checkpoint;
  StopSignals signals;  // before any thread exists, so every thread inherits the blocked mask
  train::Trainer trainer(in.config, *in.data);  // validates again, then builds the replicas
  const auto& c = trainer.config();
  if (in.resume) trainer.restore(*in.resume, ck.resume);
  const json effective_json = config_json(c, o.data_dir);
  const std::string effective = effective_json.dump();
  auto save = [&] { checkpoint::save_checkpoint(ck.save, trainer.checkpoint(effective), ck.keep); };
  if (!o.quiet)
    out << "cohort train: " << c.model << " on " << o.data_dir << " (" << in.data->train.count
        << " train, " << in.data->test.count << " test samples of "
        << in.data->train.describe_shape() << ", loaded in " << std::fixed << std::setprecision(2)
        << in.load_seconds << " s)\n"
        << config_text(effective_json)
        << (in.resume ? "  resumed from " + ck.resume + " at step " +
                            std::to_string(in.resume->step) + "\n"
                      : "");
  std::optional<std::ofstream> metrics;
  if (!o.metrics_path.empty()) {
    metrics.emplace(o.metrics_path, std::ios::trunc);
    if (!*metrics) throw InputError("--metrics " + o.metrics_path + ": cannot open for writing");
  }
  const std::size_t train_count = in.data->train.count;
  const std::size_t steps_per_epoch =
      c.drop_last ? train_count / c.batch : (train_count + c.batch - 1) / c.batch;
  const std::size_t epochs_planned =
      c.steps ? (c.steps + steps_per_epoch - 1) / steps_per_epoch : c.epochs;
  auto every_step = [&](std::uint64_t step) {
    if (ck.save_every != 0 && step % ck.save_every == 0) save();
  };
  Progress progress(out, o.quiet, &out == &std::cout && ::isatty(STDOUT_FILENO), o.log_every,
                    metrics ? &*metrics : nullptr, epochs_planned, every_step);
  train::Summary s;
  try {
    s = trainer.run(progress);
  } catch (...) {
    if (!o.trace_path.empty()) write_trace(o.trace_path, trainer, effective_json);  // to the fault
    throw;
  }
  if (!o.trace_path.empty()) write_trace(o.trace_path, trainer, effective_json);
  if (!ck.save.empty()) save();  // the final weights (also after Ctrl-C: a whole step's)
  if (s.stopped) {
    out << "\nstopped by a signal after step " << s.steps
        << (ck.save.empty() ? "" : "; checkpoint " + ck.save) << "\n";
    return kExitInterrupted;
  }
  if (!o.quiet) print_summary(out, s);
  if (!o.summary_path.empty())
    write_file_atomically(o.summary_path, summary_json(s, effective_json).dump(2) + "\n");
  return kExitOk;
}

}  // namespace cohort::cli
