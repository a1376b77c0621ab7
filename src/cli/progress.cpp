// Progress lines, the metrics stream, Ctrl-C / SIGTERM handling (and the rest of the process's
// preparation: descriptors 0-2, SIGPIPE) and the summary table of `cohort train`.
// Not the trainer's timing (train/ measures; this file only prints) and not the files written
// at the end of a run (output.cpp).
#include "progress.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <iomanip>
#include <mutex>
#include <numbers>
#include <ostream>
#include <sstream>
#include <thread>

#include "cohort/cli/cli.hpp"

namespace cohort::cli {

namespace {

constexpr const char* kClearToEnd = "\x1b[K";  // erase the rest of a rewritten line

// Nats as bits, "1.234".
std::string bits(double nats) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(3) << nats / std::numbers::ln2;
  return s.str();
}

std::string rate(double samples_per_second) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(1) << samples_per_second / 1000.0 << "k";
  return s.str();
}

std::string bar(double fraction) {
  constexpr int kWidth = 24;
  const int done = static_cast<int>(std::clamp(fraction, 0.0, 1.0) * kWidth);
  return "[" + std::string(done, '#') + std::string(kWidth - done, '.') + "]";
}

std::string clock_text(double seconds) {
  const auto total = static_cast<long long>(std::max(0.0, seconds) + 0.5);
  char text[32];
  std::snprintf(text, sizeof text, "%lld:%02lld:%02lld", total / 3600, total / 60 % 60, total % 60);
  return text;
}

}  // namespace

void prepare_process() {
  for (int fd = 0; fd <= 2; ++fd)
    if (::fcntl(fd, F_GETFD) < 0 && errno == EBADF) {
      // The lowest free descriptor: fd itself (those below it are open by now).
      const int null = ::open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
      if (null >= 0 && null != fd) {
        ::dup2(null, fd);
        ::close(null);
      }
    }
  ::signal(SIGPIPE, SIG_IGN);  // see Progress::on_step
  StopSignals::take();
}

void StopSignals::take() {
  static std::once_flag once;
  std::call_once(once, [] {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    // Lives as long as the process (blocked in sigwait when the process exits).
    std::thread([set] {
      for (;;) {
        int sig = 0;
        if (sigwait(&set, &sig) != 0) continue;
        // acquire: pairs with the constructor's release, so signal_ is this run's (0).
        if (!armed_.load(std::memory_order_acquire)) ::_exit(128 + sig);
        int none = 0;
        if (signal_.compare_exchange_strong(none, sig, std::memory_order_relaxed)) continue;
        if (sig == SIGINT) ::_exit(128 + sig);  // a second Ctrl-C
        // A SIGTERM after the first signal changes nothing: a scheduler may signal both mpirun
        // and the ranks, and mpirun passes its own signal on to the ranks as SIGTERM.
      }
    }).detach();
  });
}

StopSignals::StopSignals() {
  take();
  signal_.store(0, std::memory_order_relaxed);
  armed_.store(true, std::memory_order_release);
}

StopSignals::~StopSignals() { armed_.store(false, std::memory_order_relaxed); }

void Progress::on_step(const train::StepEvent& e) {
  report_step(e);
  epoch_cut_short_ = e.step_in_epoch < e.steps_per_epoch;  // read by on_epoch at the run's end
  if (!every_step_) return;
  const bool evaluated_here = eval_every_ != 0 && e.step % eval_every_ == 0;
  if (e.step_in_epoch == e.steps_per_epoch || e.step == e.total_steps || evaluated_here)
    after_epoch_ = e.step;  // on_epoch or on_eval calls it, once its line is written
  else
    every_step_(e.step);
}

void Progress::report_step(const train::StepEvent& e) {
  if (first_step_ == 0) {  // a resumed run starts past 1
    first_step_ = e.step;
    last_step_ = e.step - 1;
  }
  if (e.skipped) {
    const json line{{"kind", "skip"},
                    {"step", e.step},
                    {"epoch", e.epoch},
                    {"reason", e.skip_reason},
                    {"skipped_total", e.skipped_total}};
    write_metrics(line);
    tell(line);
    if (!quiet_)
      out_ << (tty_ ? "\r" : "") << "step " << e.step << " skipped: " << e.skip_reason << " ("
           << e.skipped_total << " skipped so far)" << (tty_ ? kClearToEnd : "") << "\n";
    return;
  }
  // Two windows: the metrics line's loss is the mean since the previous metrics line, the
  // printed one's since the previous printed line (on a TTY those come at their own pace).
  metrics_window_.add(e.loss);
  print_window_.add(e.loss);
  if (metrics_ && log_every_ && e.step % log_every_ == 0)
    write_metrics(step_line(e, metrics_window_.take()));
  if (on_line_) tell(step_line(e, e.loss));
  const bool line_due =
      tty_ ? (e.elapsed - last_print_ > 0.2 || e.step_in_epoch == e.steps_per_epoch)
           : (log_every_ && e.step % log_every_ == 0);
  // A reader that went away (`cohort train ... | head -1`): SIGPIPE is ignored (prepare_process),
  // so the write fails with EPIPE and the stream goes bad; from then on nothing more is printed
  // and training goes on to its end, saving as usual. The reader of a pipe chooses what it reads,
  // not how long the run lasts: stopping (as Ctrl-C does) would end a long run that was piped
  // into `head` for a glance at its first lines.
  if (quiet_ || !out_ || !line_due || print_window_.steps == 0) return;
  const double rate_now =
      double(e.samples) * double(e.step - last_step_) / (e.elapsed - last_print_);
  // ETA from this run's mean step time (training steps only; evaluation adds to it).
  const double per_step = e.elapsed / double(e.step - first_step_ + 1);
  const double eta = per_step * double(e.total_steps - e.step);
  std::ostringstream line;
  if (tty_) line << bar(double(e.step) / double(e.total_steps)) << " ";
  // A run that ends inside its first epoch (a language model's recipe: 2,000 steps of an epoch of
  // 80,000) counts its own steps; a run of whole epochs counts each epoch's.
  if (e.total_steps < e.steps_per_epoch)
    line << "step " << e.step << "/" << e.total_steps;
  else
    line << "epoch " << e.epoch + 1 << "/" << epochs_planned_ << "  step " << e.step_in_epoch << "/"
         << e.steps_per_epoch;
  line << "  loss " << std::fixed << std::setprecision(4) << print_window_.take() << "  "
       << rate(rate_now * double(std::max<std::size_t>(1, tokens_per_sample_)))
       << (tokens_per_sample_ ? " tokens/s" : " samples/s") << "  ETA " << clock_text(eta);
  if (tty_)
    out_ << "\r" << line.str() << kClearToEnd << std::flush;
  else
    out_ << line.str() << "\n";
  last_print_ = e.elapsed;
  last_step_ = e.step;
}

json Progress::step_line(const train::StepEvent& e, double loss) const {
  json line{{"kind", "step"}, {"step", e.step}, {"epoch", e.epoch}, {"loss", loss}, {"lr", e.lr}};
  if (std::isfinite(e.grad_norm)) line["grad_norm"] = e.grad_norm;
  line["elapsed_s"] = elapsed_before_ + e.elapsed;
  return line;
}

void Progress::tell(const json& line) {
  if (on_line_ && !on_line_(line)) listener_stopped_ = true;
}

void Progress::on_epoch(const train::EpochResult& r) {
  json line{{"kind", "epoch"},
            {"epoch", r.epoch + 1},
            {"step", r.steps},
            {"train_loss", r.train_loss},
            {"test_loss", r.test_loss},
            {"test_accuracy", r.test_accuracy},
            {"samples_per_second", r.samples_per_second},
            {"elapsed_s", elapsed_before_ + r.elapsed}};
  if (tokens_per_sample_ != 0)
    language_model_figures(line, r.samples_per_second, r.test_loss, tokens_per_sample_);
  line.update(epoch_tags_);
  write_metrics(line);
  tell(line);
  run_pending_step();
  if (quiet_) return;
  if (tty_) out_ << "\r";
  if (epoch_cut_short_)
    out_ << "step " << r.steps << " (end of run): train loss ";
  else
    out_ << "epoch " << r.epoch + 1 << " done: train loss ";
  out_ << std::fixed << std::setprecision(4) << r.train_loss
       << (tokens_per_sample_ ? "  val loss " : "  test loss ") << r.test_loss
       << (tokens_per_sample_ ? " (" + bits(r.test_loss) + " bits/token)" : std::string())
       << (tokens_per_sample_ ? "  next-token accuracy " : "  test accuracy ")
       << std::setprecision(4) << r.test_accuracy << "  "
       << rate(r.samples_per_second * double(std::max<std::size_t>(1, tokens_per_sample_)))
       << (tokens_per_sample_ ? " tokens/s" : " samples/s") << (tty_ ? kClearToEnd : "") << "\n";
}

void Progress::run_pending_step() {
  if (!after_epoch_) return;
  const std::uint64_t step = *after_epoch_;
  after_epoch_.reset();
  every_step_(step);
}

void Progress::on_eval(const train::EvalResult& r) {
  json line{{"kind", "eval"},
            {"step", r.step},
            {"test_loss", r.test_loss},
            {"test_accuracy", r.test_accuracy},
            {"elapsed_s", elapsed_before_ + r.elapsed}};
  if (tokens_per_sample_ != 0) {
    line["val_loss"] = r.test_loss;
    line["val_bpc"] = r.test_loss / std::numbers::ln2;
  }
  write_metrics(line);
  tell(line);
  run_pending_step();
  if (quiet_) return;
  if (tty_) out_ << "\r";
  out_ << "step " << r.step << ": " << (tokens_per_sample_ ? "val loss " : "test loss ")
       << std::fixed << std::setprecision(4) << r.test_loss
       << (tokens_per_sample_ ? " (" + bits(r.test_loss) + " bits/token)" : std::string())
       << (tokens_per_sample_ ? "  next-token accuracy " : "  test accuracy ") << r.test_accuracy
       << (tty_ ? kClearToEnd : "") << "\n";
}

// One JSON Lines record, flushed so a crash or a reader mid-run sees whole lines only.
void Progress::write_metrics(const json& line) {
  if (!metrics_) return;
  *metrics_ << line.dump() << "\n";
  metrics_->flush();
}

void print_summary(std::ostream& out, const train::Summary& s) {
  const auto& t = s.time;
  const double capacity = t.step * double(s.workers);  // worker-seconds available
  out << "\nsummary\n"
      << "  steps " << s.steps << ", epochs " << std::setprecision(3) << s.epochs << ", "
      << (s.ranks > 1 ? std::to_string(s.ranks) + " ranks x " : std::string()) << "workers "
      << s.workers << ", batch " << s.batch << " (micro-batch " << s.micro_batch << "), "
      << s.parameters << " parameters\n"
      << (s.tokens_per_sample ? "  tokens/s " : "  samples/s ") << std::fixed
      << std::setprecision(0)
      << s.samples_per_second * double(std::max<std::size_t>(1, s.tokens_per_sample))
      << "   train loss " << std::setprecision(4) << s.train_loss
      << (s.tokens_per_sample ? "   val loss " : "   test loss ") << s.test_loss
      << (s.tokens_per_sample ? " (" + bits(s.test_loss) + " bits/token)" : std::string())
      << (s.tokens_per_sample ? "   next-token accuracy " : "   test accuracy ") << s.test_accuracy
      << "\n"
      << "  weights digest " << s.weights_digest << "\n\n"
      << "  time of " << s.steps << " steps: " << std::setprecision(3) << t.step << " s wall x "
      << s.workers << " workers = " << capacity << " worker-s\n";
  auto row = [&](const char* name, double v, double of) {
    out << "    " << std::left << std::setw(28) << name << std::right << std::setw(9)
        << std::setprecision(3) << v << " s " << std::setw(6) << std::setprecision(1)
        << 100.0 * v / of << "%\n";
  };
  row("compute", t.compute, capacity);
  row("  matmul, conv (oneDNN)", t.matmul, capacity);
  if (t.weight_grad > 0) row("    of which root weight GEMMs", t.weight_grad, capacity);
  if (t.attention > 0) row("  attention (fused kernel)", t.attention, capacity);
  row("  relu, gelu, softmax", t.eltwise, capacity);
  row("  softmax cross-entropy", t.loss, capacity);
  row("  norms, pooling, the rest", t.other, capacity);
  row("batch assembly", t.data, capacity);
  if (const double rows = s.samples_per_second * t.step; s.rows_staged_ahead > 0 && rows > 0)
    out << "    rows staged ahead (by a replica waiting for the last leaf): "
        << std::setprecision(1) << 100.0 * static_cast<double>(s.rows_staged_ahead) / rows << "%\n";
  row("reduce + optimizer", t.reduce, capacity);
  row("  optimizer alone", t.optimizer, capacity);
  row("idle / wait", t.idle, capacity);
  row("root, critical path (wall)", t.reduce_critical, t.step);
  if (s.ranks > 1) row("rank exchange, waits (wall)", t.exchange, t.step);
  const train::Roofline& r = s.roofline;
  if (r.step_seconds > 0) {
    // A part timed alone above the run's own time for it is the run's own (train/roofline.hpp).
    auto alone = [&](double seconds) {
      out << " (timed alone " << std::setprecision(3) << seconds * 1e3 << " ms, slower)";
    };
    out << "  roofline a step: GEMMs " << std::fixed << std::setprecision(3);
    if (r.gemm_seconds < r.gemm_alone_seconds) {
      out << "as the run ran them " << r.gemm_seconds * 1e3 << " ms";
      alone(r.gemm_alone_seconds);
    } else {
      out << "at oneDNN's rate " << r.gemm_seconds * 1e3 << " ms";
    }
    out << " + root " << (r.root_seconds < r.sweep_seconds ? "as the run ran it, " : "sweep of ")
        << std::setprecision(2) << r.root_bytes / 1e6 << " MB " << std::setprecision(3)
        << r.root_seconds * 1e3 << " ms";
    if (r.root_seconds < r.sweep_seconds) alone(r.sweep_seconds);
    out << " = " << std::setprecision(3) << r.floor_seconds * 1e3 << " ms; step "
        << r.step_seconds * 1e3 << " ms: " << std::setprecision(1) << 100 * r.fraction
        << "% of the roofline\n";
  }
  if (r.first_step_seconds > 0)
    out << "    (step: the mean after the first step; the first, which creates the primitives, "
        << std::setprecision(1) << r.first_step_seconds * 1e3 << " ms)\n";
  const train::MemoryBreakdown& m = s.memory;
  auto mb = [](std::size_t bytes) { return static_cast<double>(bytes) / 1e6; };
  out << "  memory (MB): weights " << std::setprecision(1) << mb(m.weights) << ", optimizer state "
      << mb(m.optimizer_state) << ", gradient buffers " << mb(m.gradients)
      << ", the replicas' plans " << mb(m.plans) << " (logits " << mb(m.logits)
      << ", weight copies " << mb(m.weight_copies) << "); peak RSS " << mb(m.peak_rss) << "\n";
}

}  // namespace cohort::cli
