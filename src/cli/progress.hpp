// What `cohort train` shows while and after it runs: progress lines (or one rewritten line on a
// terminal) and the JSON Lines metrics file as an Observer, the Ctrl-C handling it polls, and
// the summary table. Not the files written at the end (output.hpp).
#pragma once

#include <signal.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <thread>

#include "cohort/train/trainer.hpp"
#include "output.hpp"

namespace cohort::cli {

// Ctrl-C / SIGTERM: the first asks the run to stop after the current step (and save, if saving
// is on); the second exits at once. The signals are blocked in every thread (the mask is set
// before any worker thread exists, and threads inherit it) and taken by one thread in sigwait:
// measured here, delivering SIGINT asynchronously into the compute threads corrupted the heap in
// about 1 run in 40 even with an empty handler, so no compute thread is ever interrupted.
//
// Thread-safety: construct and destroy on the thread that will create the trainer, before it
// does; requested() may be called from any thread.
// Memory ordering: requests_ is a counter read between steps that publishes no other data
// (relaxed); done_ is stored (release) before the wake-up signal and loaded (acquire) by the
// waiter, so the waiter sees the destructor's request to end.
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  static bool requested() { return requests_.load(std::memory_order_relaxed) > 0; }

 private:
  sigset_t set_{}, old_{};
  std::thread waiter_;
  std::atomic<bool> done_{false};
  static inline std::atomic<int> requests_{0};
};

// Progress on the terminal (one rewritten line on a TTY, periodic lines otherwise) and the
// JSON Lines metrics file. Called on the thread that runs Trainer::run.
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

  bool stop_requested() override { return StopSignals::requested(); }
  void on_step(const train::StepEvent& e) override;
  void on_epoch(const train::EpochResult& r) override;

 private:
  void write_metrics(const json& line);

  std::ostream& out_;
  bool quiet_, tty_;
  std::size_t log_every_;
  std::ostream* metrics_;
  std::size_t epochs_planned_;
  std::function<void(std::uint64_t)> every_step_;
  json epoch_tags_ = json::object();
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
