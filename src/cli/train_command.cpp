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

#include "agreement.hpp"
#include "cohort/core/atomic_file.hpp"
#include "cohort/core/error.hpp"
#include "cohort/data/augment.hpp"
#include "cohort/dist/watchdog.hpp"
#include "cohort/export/export.hpp"
#include "cohort/nn/version.hpp"
#include "cohort/version.hpp"
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
  std::string resume_path;  // the file `resume` came from
  // --init-from's weights, read and checked against the model (unused when a checkpoint resumes).
  std::optional<exporting::InitialWeights> initial;
  std::int64_t folder_vocab = 0;            // --init-from DIR: config.json's vocab_size
  std::vector<std::string> resume_skipped;  // --resume auto: files passed over, and why
  double load_seconds = 0;                  // reading the data
};

// Checks what the option table cannot check alone: flags that need each other, the checkpoint
// to resume, the data, and the model and config against the data (train::validate). The paths
// and ranges of the flags given were checked after parsing (check_train_flags). In two halves:
// what this process alone decides (check_own), and what needs the config's defaults, which
// several ranks take from the whole job (check_config).
Checked check_own(const TrainOptions& o, const Loaders& loaders) {
  Checked in;
  in.config = o.train_config();
  // --init-from DIR: its config.json gives the model (or checks the one given).
  in.config.model =
      folder_model(in.config.init_from, o.model_given ? in.config.model : "", in.folder_vocab);
  if (in.config.model.empty()) in.config.model = o.train_config().model;
  const CheckpointOptions& ck = o.checkpoint;
  if (ck.save_every != 0 && ck.save.empty())
    throw InputError("--save-every: expected --save FILE as well, found none");
  if (ck.resume == kResumeAuto) {
    if (ck.save.empty())
      throw InputError(
          "--resume auto: expected --save FILE as well (the checkpoints it resumes "
          "from), found none");
    checkpoint::Newest newest = checkpoint::newest_checkpoint(
        ck.save, [&loaders](const std::filesystem::path& p) { return loaders.checkpoint(p); });
    in.resume = std::move(newest.checkpoint);
    in.resume_path = newest.file.string();
    in.resume_skipped = std::move(newest.skipped);
  } else if (!ck.resume.empty()) {
    in.resume = loaders.checkpoint(ck.resume);  // all checked, none used
    in.resume_path = ck.resume;
  }
  const auto t_load = std::chrono::steady_clock::now();
  // A language model's windows are its block + 1 tokens: the data is read for that block.
  const auto block = static_cast<std::size_t>(nn::spec_window(in.config.model));
  in.data = loaders.data(o.data_dir, block);
  in.load_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
  return in;
}

nn::Model model_of(const Checked& in) {
  return nn::Model::parse(in.config.model, train::input_shape(in.data->train),
                          static_cast<std::int64_t>(in.data->train.num_classes));
}

void check_config(Checked& in) {
  const nn::Model model = model_of(in);
  train::validate(in.config, model, *in.data);
  train::check_training_memory(in.config, model);
  if (in.resume) {
    train::check_resume(in.config, model, *in.data, *in.resume, in.resume_path);
    // --augment lives in the checkpoint's effective config, not its META: a resume with other
    // augmentation would not continue the run the checkpoint started.
    const std::string ours = data::to_string(data::parse_augment(in.config.augment));
    const std::string theirs = recorded_augment(*in.resume, in.resume_path);
    auto shown = [](const std::string& spec) { return spec.empty() ? "none" : "'" + spec + "'"; };
    if (ours != theirs)
      throw InputError(in.resume_path + ": --augment: this run has " + shown(ours) +
                       ", the checkpoint " + shown(theirs) +
                       " (resume with the checkpoint's value, or start a new run)");
  }
  in.parameters = model.layout().numel();
  if (!in.config.init_from.empty()) {
    check_folder_vocab(in.config.init_from, in.folder_vocab, in.data->train);
    in.initial = exporting::read_weights(in.config.init_from, model);
  }
}

Checked check_inputs(const TrainOptions& o, const Loaders& loaders) {
  Checked in = check_own(o, loaders);
  check_config(in);
  return in;
}

// The header's line when --kernels names another kernel set than this machine's ("" if none).
std::string kernels_notice(const TrainOptions& o) {
  const std::string here = nn::kernel_set();
  if (o.kernels.empty() || o.kernels == here) return "";
  return "  note: the config was written where the kernels were " + o.kernels +
         "; this machine's are " + here +
         ": the weights may differ from that run's in their last bits\n";
}

// --dry-run: what was checked and the config a run would start with on this machine (workers
// and micro_batch resolved as the trainer resolves them).
int dry_run(const TrainOptions& o, const Checked& in, std::ostream& out) {
  out << "cohort train --dry-run: " << in.config.model << " (" << in.parameters
      << " parameters) on " << o.data_dir << " (" << in.data->train.count << " train, "
      << in.data->test.count << " test samples of " << in.data->train.describe_shape()
      << "): every input checked, nothing trained or written\n"
      << config_text(config_json(train::resolve_defaults(in.config, model_of(in)), o.data_dir))
      << kernels_notice(o);
  if (in.resume)
    out << "  would resume from " << in.resume_path << " at step " << in.resume->step << "\n";
  else if (o.checkpoint.resume == kResumeAuto)
    out << "  would start at step 0: no checkpoint of " << o.checkpoint.save << " to resume\n";
  return kExitOk;
}

// Several ranks: the workers a single process would take from its cores come from this rank's
// share of its node's cores. The share: the affinity mask if the launcher bound the rank to part of
// the node (Open MPI binds up to 2 ranks to a core each by default), else the mask split between
// the node's ranks (--bind-to none).
std::size_t core_share(const dist::Comm& comm) {
  const auto local = static_cast<std::size_t>(comm.local_size());
  const std::size_t mask = dist::affinity_cores();
  const bool bound = mask < std::max(1u, std::thread::hardware_concurrency());
  return std::max<std::size_t>(1, bound ? mask : mask / local);
}

// The first agreement's stand before this rank's checks: the facts every rank fills in the same
// order (unknown until its checks get there).
Stand first_stand() {
  Stand s;
  s.facts.resize(4);
  s.facts[0] = {.what = "cohort's version",
                .known = true,
                .digest = digest_of(COHORT_VERSION),
                .shown = COHORT_VERSION};
  s.facts[1].what = "the training split (--data)";
  s.facts[2].what = "the test split (--data)";
  s.facts[3].what = "the checkpoint resumed (--resume)";
  return s;
}

// Several ranks, before any other collective: check_inputs in two agreements (agreement.hpp).
// The first follows this rank's own checks (a rank whose command line failed joins it from
// run_args instead: refuse_train) and compares cohort's version, each split's bytes and the
// checkpoint resumed. The second follows the checks that depend on the machine (its memory,
// bf16), and compares the effective config, less what is each rank's own (--workers, the --data
// path). Either throws JobInputError on every rank.
Checked agreed_inputs(const TrainOptions& o, const Loaders& loaders, dist::Comm& comm) {
  Stand first = first_stand();
  Checked in;
  try {
    in = check_own(o, loaders);
    auto split = [](const data::Dataset& set, Fact& f) {
      f.known = true;
      f.digest = digest_of(set);
      f.shown = std::to_string(set.count) + " samples of " + set.describe_shape();
    };
    split(in.data->train, first.facts[1]);
    split(in.data->test, first.facts[2]);
    Fact& resumed = first.facts[3];
    resumed.known = true;
    resumed.digest = in.resume ? digest_of(*in.resume) : 0;
    resumed.shown =
        in.resume ? "step " + std::to_string(in.resume->step) + " of '" + in.resume->model + "'"
                  : "none";
  } catch (...) {
    first.problem = current_problem();
  }
  agree(comm, first);
  if (in.config.workers == 0) in.config.workers = core_share(comm);

  Stand second;
  second.facts.resize(1);
  second.facts[0].what = "the effective config";
  second.facts[0].json_object = true;
  try {
    json shared = config_json(train::resolve_defaults(in.config, model_of(in)), o.data_dir);
    shared.erase("data");
    shared.erase("workers");
    shared.erase("kernels");  // each rank's machine's; a job may span machines
    // What decides the collectives of a run besides the config: saves are gathered by every
    // rank, and a dry run does none.
    shared["save"] = !o.checkpoint.save.empty();
    shared["save_every"] = o.checkpoint.save_every;
    shared["dry_run"] = o.dry_run;
    second.facts[0].known = true;
    second.facts[0].shown = shared.dump();
    second.facts[0].digest = digest_of(second.facts[0].shown);
    check_config(in);
  } catch (...) {
    second.problem = current_problem();
  }
  agree(comm, second);
  return in;
}

int train_checked(const TrainOptions& o, const Checked& in, std::ostream& all_out, dist::Comm& comm,
                  const TrainHooks& hooks, TrainOutcome* outcome) {
  const bool writer = comm.rank() == 0;  // prints and writes files
  std::ostream null_out(nullptr);
  std::ostream& out = writer ? all_out : null_out;
  const CheckpointOptions& ck = o.checkpoint;
  // From here the first SIGINT or SIGTERM stops the run after a step (unless a program that
  // embeds cohort handles them: hooks.stop).
  std::optional<StopSignals> signals;
  if (hooks.take_signals) signals.emplace();
  if (writer) create_output_folders({ck.save, o.summary_path, o.metrics_path, o.trace_path});
  // Validates again, then builds the replicas.
  train::Trainer trainer(in.config, *in.data, &comm);
  const auto& c = trainer.config();
  if (in.resume)
    trainer.restore(*in.resume, in.resume_path);
  else if (in.initial)
    trainer.start_from(in.initial->params.data(),
                       in.initial->stats.empty() ? nullptr : in.initial->stats.data());
  const json effective_json = config_json(c, o.data_dir);
  const std::string effective = effective_json.dump();
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
  // Rank 0 writes a file of the run (a checkpoint, the trace, the summary) while every other
  // rank waits for it: here, in a collective that ends the write, rather than in the next step's
  // exchange. Neither is a stall, however slow the filesystem: rank 0's watchdog pauses while it
  // writes, the others' while they wait. Rank 0 joins the collective with its watchdog counting
  // again (the others are there already; one that is not has hung). Every rank calls this alike,
  // whatever its own output flags (only rank 0's decide what is written): the collectives match.
  auto rank0_writes = [&](const auto& write) {
    dist::Watchdog* const dog = watchdog ? &*watchdog : nullptr;
    if (writer) {
      const dist::WatchdogPause writing(dog);
      write();
    }
    if (comm.size() == 1) return;
    const dist::WatchdogPause waiting(writer ? nullptr : dog);
    comm.sum(0);
  };
  // At most one save per step: a second would rotate a copy of the first in and push a distinct
  // checkpoint out of --keep's files.
  std::optional<std::uint64_t> saved_step;
  SaveAccount saves;  // what the saves cost the run, which waits for each
  auto save = [&] {
    if (saved_step == trainer.steps_done()) return;
    const auto t0 = std::chrono::steady_clock::now();
    checkpoint::Checkpoint snapshot = trainer.checkpoint(effective);  // every rank: a collective
    rank0_writes([&] { checkpoint::save_checkpoint(ck.save, snapshot, ck.keep); });
    saved_step = trainer.steps_done();
    ++saves.count;
    saves.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  if (!o.quiet)
    out << "cohort train: " << c.model << " on " << o.data_dir << " (" << in.data->train.count
        << " train, " << in.data->test.count << " test samples of "
        << in.data->train.describe_shape() << ", loaded in " << std::fixed << std::setprecision(2)
        << in.load_seconds << " s)\n"
        << (comm.size() > 1 ? "  " + comm.describe() + ", " + std::to_string(c.workers) +
                                  " workers per rank; rank 0 reports for all\n"
                            : "")
        << config_text(effective_json) << kernels_notice(o) << "  oneDNN dispatches "
        << nn::onednn_isa()
        << (c.precision == nn::Precision::kBf16 && nn::bf16_support() == nn::Bf16Support::kEmulated
                ? " (no AVX512_BF16: bf16 is emulated)\n"
                : "\n")
        << (in.resume ? "  resumed from " + in.resume_path + " at step " +
                            std::to_string(in.resume->step) + "\n"
            : ck.resume == kResumeAuto ? "  --resume auto: no checkpoint of " + ck.save +
                                             " to resume; starting at step 0\n"
                                       : "");
  std::optional<std::ofstream> metrics;
  double elapsed_before = 0;  // a resumed run: the metrics file's time so far
  if (writer && !o.metrics_path.empty()) {
    if (in.resume) elapsed_before = continue_metrics(o.metrics_path, in.resume->step);
    metrics.emplace(o.metrics_path, in.resume ? std::ios::app : std::ios::trunc);
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
  progress.continue_after(elapsed_before);
  progress.evaluate_every(c.eval_every);
  if (const std::int64_t window = trainer.model().kind().window(); window > 0)
    progress.count_tokens(static_cast<std::size_t>(window));
  progress.tag_epochs({{"precision", std::string(name_of(nn::kPrecisionNames, c.precision))}});
  progress.listen(hooks.on_line, hooks.stop);
  train::Summary s;
  try {
    s = trainer.run(progress);
  } catch (...) {
    if (writer && !o.trace_path.empty()) {
      // To the fault. Only this rank's watchdog pauses: the others, wherever this fault left
      // them, cannot know of the write.
      const dist::WatchdogPause writing(watchdog ? &*watchdog : nullptr);
      write_trace(o.trace_path, trainer, effective_json);
    }
    throw;
  }
  rank0_writes([&] {
    if (!o.trace_path.empty()) write_trace(o.trace_path, trainer, effective_json);
  });
  if (!ck.save.empty()) save();  // the final weights (also after Ctrl-C: a whole step's), once
  if (outcome) {
    outcome->summary = summary_json(s, effective_json, saves);
    outcome->stopped = s.stopped;
  }
  if (s.stopped) {
    // Every rank stopped at the same step, some for a signal of their own: all exit alike, 143
    // if any had SIGTERM (a scheduler ending the job), else 130; 0 if only a hook asked (the
    // program that embeds cohort reads outcome->stopped).
    const int signal = StopSignals::received();
    const bool term = comm.sum(signal == SIGTERM ? 1 : 0) > 0;
    const bool signalled = term || comm.sum(signal != 0 ? 1 : 0) > 0;
    out << "\nstopped "
        << (!signalled ? ""
            : term     ? "by SIGTERM "
                       : "by SIGINT ")
        << "after step " << s.steps << (ck.save.empty() ? "" : "; checkpoint " + ck.save) << "\n";
    return !signalled ? kExitOk : term ? kExitTerminated : kExitInterrupted;
  }
  if (!o.quiet) {
    print_summary(out, s);
    if (saves.count > 0)
      out << "  checkpoints: " << saves.count << " saved, " << std::fixed << std::setprecision(1)
          << 1e3 * saves.seconds / double(saves.count) << " ms each (the run waits for them)\n";
  }
  rank0_writes([&] {
    if (!o.summary_path.empty())
      write_file_atomically(o.summary_path, summary_json(s, effective_json, saves).dump(2) + "\n");
  });
  return kExitOk;
}

}  // namespace

int train_command(const TrainOptions& o, const Loaders& loaders, std::ostream& out,
                  std::ostream& err, dist::Comm& comm, const TrainHooks& hooks,
                  TrainOutcome* outcome) {
  const Checked in = comm.size() == 1 ? check_inputs(o, loaders) : agreed_inputs(o, loaders, comm);
  if (comm.rank() == 0)
    for (const std::string& line : in.resume_skipped)
      err << "cohort: warning: --resume auto: passed over " << line << "\n";
  if (o.dry_run) return dry_run(o, in, out);
  if (comm.size() == 1) return train_checked(o, in, out, comm, hooks, outcome);
  // From here every rank is in the job's collectives: a failure on one rank must end them all.
  try {
    return train_checked(o, in, out, comm, hooks, outcome);
  } catch (const std::exception& e) {
    const bool input = dynamic_cast<const InputError*>(&e) != nullptr;
    const bool output = dynamic_cast<const OutputError*>(&e) != nullptr;
    std::cerr << "cohort: rank " << comm.rank() << " of " << comm.size() << ": "
              << (input || output ? "error: " : "internal error: ") << e.what()
              << "; ending the job\n"
              << std::flush;
    comm.abort(input ? kExitBadInput : output ? kExitWriteFailed : kExitInternal);
  }
  return kExitInternal;  // not reached: abort ends the process
}

std::vector<std::string> refuse_train(const std::string& problem, dist::Comm& comm) {
  Stand first = first_stand();
  first.problem = problem;
  try {
    agree(comm, first);
  } catch (const JobInputError& e) {
    return e.lines();
  } catch (const std::exception& e) {
    return {problem, std::string("internal error: ") + e.what()};
  }
  return {problem};  // not reached: a rank that failed fails the agreement
}

}  // namespace cohort::cli
