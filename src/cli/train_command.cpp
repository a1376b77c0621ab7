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
#include <thread>

#include "cohort/core/atomic_file.hpp"
#include "cohort/core/error.hpp"
#include "cohort/data/augment.hpp"
#include "cohort/dist/watchdog.hpp"
#include "cohort/nn/version.hpp"
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
  if (in.resume) {
    train::check_resume(in.config, model, *in.data, *in.resume, ck.resume);
    // --augment lives in the checkpoint's effective config, not its META: a resume with other
    // augmentation would not continue the run the checkpoint started.
    const std::string ours = data::to_string(data::parse_augment(in.config.augment));
    const std::string theirs = recorded_augment(*in.resume, ck.resume);
    auto shown = [](const std::string& spec) { return spec.empty() ? "none" : "'" + spec + "'"; };
    if (ours != theirs)
      throw InputError(ck.resume + ": --augment: this run has " + shown(ours) +
                       ", the checkpoint " + shown(theirs) +
                       " (resume with the checkpoint's value, or start a new run)");
  }
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
      << config_text(config_json(
             train::resolve_defaults(
                 in.config, nn::Model::parse(in.config.model, train::input_shape(in.data->train))),
             o.data_dir));
  if (in.resume)
    out << "  would resume from " << o.checkpoint.resume << " at step " << in.resume->step << "\n";
  return kExitOk;
}

// Several ranks: the workers and micro-batch a single process would take from its cores come
// from this rank's share of its node's cores and from the job's total, so the leaves are those
// of one process with as many cores. The share: the affinity mask if the launcher bound the rank
// to part of the node (Open MPI binds up to 2 ranks to a core each by default), else the mask
// split between the node's ranks (--bind-to none).
void apply_rank_defaults(train::TrainConfig& c, dist::Comm& comm) {
  const auto local = static_cast<std::size_t>(comm.local_size());
  const std::size_t mask = dist::affinity_cores();
  const bool bound = mask < std::max(1u, std::thread::hardware_concurrency());
  const std::size_t mine = std::max<std::size_t>(1, bound ? mask : mask / local);
  const std::uint64_t total = comm.sum(mine);
  if (c.workers == 0) c.workers = mine;
  c.job_cores = static_cast<std::size_t>(total);  // the default micro-batch's divisor
  // The job's smallest L2 (the conv micro-batch's bound), found bit by bit from sums: every
  // rank agrees on the same value, whatever its own.
  const std::uint64_t l2 = train::l2_cache_bytes();
  const auto ranks = static_cast<std::uint64_t>(comm.size());
  std::uint64_t least = 0;
  for (int bit = 40; bit-- > 0;)
    if (const std::uint64_t v = least | (std::uint64_t{1} << bit); comm.sum(l2 >= v) == ranks)
      least = v;
  // Unknown on some rank: no bound (as a single process that cannot tell).
  c.job_l2_bytes = least != 0 ? static_cast<std::size_t>(least) : SIZE_MAX;
}

// Several ranks: every rank checks its own inputs, then all agree before anything else is
// exchanged. Rank 0's problem is the one printed; if only other ranks failed, each prints its
// own (as RankInputError) and rank 0 says how many.
Checked agreed_inputs(const TrainOptions& o, const Loaders& loaders, dist::Comm& comm) {
  if (comm.size() == 1) return check_inputs(o, loaders);
  std::optional<Checked> in;
  std::optional<std::string> problem;
  try {
    in = check_inputs(o, loaders);
  } catch (const InputError& e) {
    problem = e.what();
  }
  const std::uint64_t failed = problem ? 1 : 0;
  const std::uint64_t total = comm.sum(comm.rank() == 0 ? failed << 32 : failed);
  const bool rank0_failed = (total >> 32) != 0;
  const std::uint64_t others = total & 0xffffffffu;
  if (!rank0_failed && others == 0) return std::move(*in);
  if (comm.rank() == 0)
    throw InputError(problem ? *problem
                             : std::to_string(others) +
                                   " other rank(s) refused their inputs (their messages follow)");
  if (problem && !rank0_failed)
    throw RankInputError("rank " + std::to_string(comm.rank()) + ": " + *problem);
  throw PeerInputError();
}

int train_checked(const TrainOptions& o, const Checked& in, std::ostream& all_out,
                  dist::Comm& comm) {
  const bool writer = comm.rank() == 0;  // prints and writes files
  std::ostream null_out(nullptr);
  std::ostream& out = writer ? all_out : null_out;
  const CheckpointOptions& ck = o.checkpoint;
  StopSignals signals;  // before any thread exists, so every thread inherits the blocked mask
  // Validates again, then builds the replicas.
  train::Trainer trainer(in.config, *in.data, &comm);
  const auto& c = trainer.config();
  if (in.resume) trainer.restore(*in.resume, ck.resume);
  const json effective_json = config_json(c, o.data_dir);
  const std::string effective = effective_json.dump();
  auto save = [&] {
    checkpoint::Checkpoint snapshot = trainer.checkpoint(effective);  // every rank: a collective
    if (writer) checkpoint::save_checkpoint(ck.save, snapshot, ck.keep);
  };
  if (!o.quiet)
    out << "cohort train: " << c.model << " on " << o.data_dir << " (" << in.data->train.count
        << " train, " << in.data->test.count << " test samples of "
        << in.data->train.describe_shape() << ", loaded in " << std::fixed << std::setprecision(2)
        << in.load_seconds << " s)\n"
        << (comm.size() > 1 ? "  " + comm.describe() + ", " + std::to_string(c.workers) +
                                  " workers per rank; rank 0 reports for all\n"
                            : "")
        << config_text(effective_json) << "  oneDNN dispatches " << nn::onednn_isa()
        << (c.precision == nn::Precision::kBf16 && nn::bf16_support() == nn::Bf16Support::kEmulated
                ? " (no AVX512_BF16: bf16 is emulated)\n"
                : "\n")
        << (in.resume ? "  resumed from " + ck.resume + " at step " +
                            std::to_string(in.resume->step) + "\n"
                      : "");
  // Several ranks: a peer that hangs leaves this rank waiting where no error reaches it.
  std::optional<dist::Watchdog> watchdog;
  if (comm.size() > 1)
    watchdog.emplace(std::chrono::duration<double>(o.stall_timeout), [&comm](double idle) {
      std::cerr << "cohort: rank " << comm.rank() << " of " << comm.size()
                << ": no step finished in " << std::fixed << std::setprecision(0) << idle
                << " s (--stall-timeout); ending the job\n"
                << std::flush;
      comm.abort(kExitInternal);
    });
  std::optional<std::ofstream> metrics;
  if (writer && !o.metrics_path.empty()) {
    metrics.emplace(o.metrics_path, std::ios::trunc);
    if (!*metrics) throw InputError("--metrics " + o.metrics_path + ": cannot open for writing");
  }
  const std::size_t train_count = in.data->train.count;
  const std::size_t steps_per_epoch =
      c.drop_last ? train_count / c.batch : (train_count + c.batch - 1) / c.batch;
  const std::size_t epochs_planned =
      c.steps ? (c.steps + steps_per_epoch - 1) / steps_per_epoch : c.epochs;
  auto every_step = [&](std::uint64_t step) {
    if (watchdog) watchdog->beat();
    if (ck.save_every != 0 && step % ck.save_every == 0) save();
  };
  Progress progress(out, o.quiet, &out == &std::cout && ::isatty(STDOUT_FILENO), o.log_every,
                    metrics ? &*metrics : nullptr, epochs_planned, every_step);
  progress.tag_epochs({{"precision", std::string(name_of(nn::kPrecisionNames, c.precision))}});
  train::Summary s;
  try {
    s = trainer.run(progress);
  } catch (...) {
    if (writer && !o.trace_path.empty())
      write_trace(o.trace_path, trainer, effective_json);  // to the fault
    throw;
  }
  if (writer && !o.trace_path.empty()) write_trace(o.trace_path, trainer, effective_json);
  if (!ck.save.empty()) save();  // the final weights (also after Ctrl-C: a whole step's)
  if (s.stopped) {
    out << "\nstopped by a signal after step " << s.steps
        << (ck.save.empty() ? "" : "; checkpoint " + ck.save) << "\n";
    return kExitInterrupted;
  }
  if (!o.quiet) print_summary(out, s);
  if (writer && !o.summary_path.empty())
    write_file_atomically(o.summary_path, summary_json(s, effective_json).dump(2) + "\n");
  return kExitOk;
}

}  // namespace

int train_command(const TrainOptions& given, const Loaders& loaders, std::ostream& out,
                  dist::Comm& comm) {
  TrainOptions o = given;
  if (comm.size() > 1) apply_rank_defaults(o.config, comm);
  const Checked in = agreed_inputs(o, loaders, comm);
  if (o.dry_run) return dry_run(o, in, out);
  if (comm.size() == 1) return train_checked(o, in, out, comm);
  // From here every rank is in the job's collectives: a failure on one rank must end them all.
  try {
    return train_checked(o, in, out, comm);
  } catch (const std::exception& e) {
    std::cerr << "cohort: rank " << comm.rank() << " of " << comm.size() << ": "
              << (dynamic_cast<const InputError*>(&e) ? "error: " : "internal error: ") << e.what()
              << "; ending the job\n"
              << std::flush;
    comm.abort(dynamic_cast<const InputError*>(&e) ? kExitBadInput : kExitInternal);
  }
  return kExitInternal;  // not reached: abort ends the process
}

}  // namespace cohort::cli
