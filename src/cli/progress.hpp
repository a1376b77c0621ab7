// What `cohort train` shows while and after it runs: progress lines (or one rewritten line on a
// terminal) and the JSON Lines metrics file as an Observer, the Ctrl-C handling it polls, and
// the summary table. Not the files written at the end (output.hpp).
#pragma once

#include <signal.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <optional>

#include "cohort/train/trainer.hpp"
#include "output.hpp"

namespace cohort::cli {

// SIGINT (Ctrl-C) and SIGTERM (a batch scheduler's notice). take() blocks them in the calling
// thread, so in every thread created after it (threads inherit the mask: main calls it before MPI
// starts its threads, any of which would otherwise take a signal's default action and end the
// process), and takes them on one thread of its own in sigwait: a SIGINT delivered
// asynchronously into the compute threads can corrupt the heap even with an empty handler
// (oneDNN, OpenMP and TBB are not async-signal-safe), so no compute thread is ever interrupted.
//
// While a StopSignals exists (a training run), the first signal asks the run to stop after the
// current step (and save, if saving is on; several ranks stop together, at the step where any
// asked) and received() names it; a SIGINT after it (a second Ctrl-C) ends the process at once
// with status 130, a SIGTERM after it changes nothing (mpirun turns a signal of its own into a
// SIGTERM to every rank, which a scheduler may have signalled already). With no StopSignals
// (before a run, e.g. while the data loads) a signal ends the process at once with status 128 +
// its number: nothing is lost that a stop would have saved.
//
// Thread-safety: take() from any thread (the first call counts; call it before other threads
// exist); construct and destroy on the thread that will create the trainer, before it does;
// requested() and received() from any thread.
// Memory ordering: signal_ publishes no other data (relaxed: the run polls it between steps);
// the constructor resets it before it arms (release), and the waiter reads armed_ (acquire)
// before it records the first signal, so a new run never sees an earlier run's signal.
class StopSignals {
 public:
  StopSignals();  // take()s the signals if not yet taken
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  static void take();
  static bool requested() { return received() != 0; }
  // The first signal of the run (SIGINT or SIGTERM), 0 if none.
  static int received() { return signal_.load(std::memory_order_relaxed); }

 private:
  static inline std::atomic<int> signal_{0};
  static inline std::atomic<bool> armed_{false};
};

// Progress on the terminal (one rewritten line on a TTY, periodic lines otherwise) and the
// JSON Lines metrics file. Called on the thread that runs Trainer::run.
// `every_step(step)` (the periodic save, the watchdog's beat) runs after that step's lines are
// written, and for an epoch's last step (or the run's, or one --eval-every evaluates after)
// after the epoch's (evaluation's) line: a checkpoint is never ahead of the metrics, so a run
// resumed from it (continue_metrics) finds every line up to its step.
class Progress final : public train::Observer {
 public:
  Progress(std::ostream& out, bool quiet, bool tty, std::size_t log_every, std::ostream* metrics,
           std::size_t epochs_planned, std::function<void(std::uint64_t)> every_step = {})
      : out_(out),
        quiet_(quiet),
        tty_(tty),
        log_every_(log_every),
        metrics_(metrics),
        epochs_planned_(epochs_planned),
        every_step_(std::move(every_step)) {}

  // Fields every epoch line of the metrics carries (e.g. the precision), so curves of runs in
  // different precisions are told apart.
  void tag_epochs(json fields) { epoch_tags_ = std::move(fields); }
  // A resumed run's metrics continue a file whose last line had elapsed_s = `seconds`: its own
  // lines' elapsed_s count on from there.
  void continue_after(double seconds) { elapsed_before_ = seconds; }
  // A language model: its samples are windows of `tokens` positions; rates are tokens/s, and
  // the epoch lines carry val_loss, val_bpc and tokens_per_second.
  void count_tokens(std::size_t tokens) { tokens_per_sample_ = tokens; }
  // --eval-every: a step that ends with an evaluation runs every_step after its line.
  void evaluate_every(std::size_t steps) { eval_every_ = steps; }

  // A listener of every line (TrainHooks::on_line): each step's as the metrics file would have
  // it with --log-every 1, each epoch's and evaluation's; false from it stops the run (after the
  // step; after an epoch's line, before the next epoch). `stop`: polled after every step.
  void listen(std::function<bool(const json&)> on_line, std::function<bool()> stop) {
    on_line_ = std::move(on_line);
    stop_ = std::move(stop);
  }

  bool stop_requested() override {
    return StopSignals::requested() || listener_stopped_ || (stop_ && stop_());
  }
  void on_step(const train::StepEvent& e) override;
  void on_epoch(const train::EpochResult& r) override;
  void on_eval(const train::EvalResult& r) override;

 private:
  void report_step(const train::StepEvent& e);
  void run_pending_step();  // the every_step held back for an epoch's or evaluation's line
  void write_metrics(const json& line);
  json step_line(const train::StepEvent& e, double loss) const;  // a "step" line's fields
  void tell(const json& line);                                   // to the listener, if any

  std::function<bool(const json&)> on_line_;
  std::function<bool()> stop_;
  bool listener_stopped_ = false;

  std::ostream& out_;
  bool quiet_, tty_;
  std::size_t log_every_;
  std::ostream* metrics_;
  std::size_t epochs_planned_;
  std::function<void(std::uint64_t)> every_step_;
  json epoch_tags_ = json::object();
  double elapsed_before_ = 0;
  std::size_t tokens_per_sample_ = 0;
  bool epoch_cut_short_ = false;  // the last step was not its epoch's last (--steps, or a stop)
  std::size_t eval_every_ = 0;
  std::optional<std::uint64_t> after_epoch_;  // an epoch's last step, whose every_step waits
  // The mean loss over a window of steps.
  struct LossWindow {
    double sum = 0;
    std::uint64_t steps = 0;
    void add(double loss) {
      sum += loss;
      ++steps;
    }
    double take() {  // the mean so far; starts a new window
      const double mean = sum / double(steps);
      sum = 0;
      steps = 0;
      return mean;
    }
  };
  LossWindow metrics_window_, print_window_;
  double last_print_ = 0;
  std::uint64_t last_step_ = 0, first_step_ = 0;
};

// The table printed at the end of a run: figures, then where the time went.
void print_summary(std::ostream& out, const train::Summary& s);

}  // namespace cohort::cli
