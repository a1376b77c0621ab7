// `cohort train`: flags -> TrainConfig, validation of every input before the first step,
// progress while training, a summary at the end, JSON files written atomically.
#include "cohort/cli/cli.hpp"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <optional>
#include <sstream>
#include <thread>

#include "cohort/config/job_config.hpp"
#include "cohort/core/error.hpp"
#include "cohort/report/plot.hpp"
#include "cohort/train/trainer.hpp"

namespace cohort::cli {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

// An output file must be creatable before training starts, so a typo costs nothing.
void check_output_path(const std::string& flag, const std::string& path) {
  if (path.empty()) return;
  fs::path p(path);
  fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  std::error_code ec;
  if (fs::is_directory(p, ec))
    throw InputError(flag + " " + path + ": expected a file path, found a directory");
  if (!fs::is_directory(dir, ec))
    throw InputError(flag + " " + path + ": expected an existing folder " + dir.string() +
                     ", found none");
  if (::access(dir.c_str(), W_OK) != 0)
    throw InputError(flag + " " + path + ": expected a writable folder " + dir.string() +
                     ", found it read-only");
}

// Writes the whole text to `path` through a temporary file and a rename, so a reader never sees
// half a file and an earlier file survives a crash.
void write_atomically(const std::string& path, const std::string& text) {
  fs::path tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << text;
    f.flush();
    if (!f) throw InputError(path + ": writing failed (disk full?)");
  }
  fs::rename(tmp, path);
}

std::string weight_grads_name(train::TrainConfig::WeightGrads w) {
  return std::string(name_of(train::TrainConfig::kWeightGradsNames, w));
}
train::TrainConfig::WeightGrads parse_weight_grads(const std::string& name) {
  return parse_name(train::TrainConfig::kWeightGradsNames, name, "--weight-grads");
}

json to_json(const train::TimeBreakdown& t) {
  return {{"step", t.step},
          {"compute", t.compute},
          {"matmul", t.matmul},
          {"eltwise", t.eltwise},
          {"loss", t.loss},
          {"other", t.other},
          {"data", t.data},
          {"reduce", t.reduce},
          {"reduce_critical", t.reduce_critical},
          {"optimizer", t.optimizer},
          {"weight_grad", t.weight_grad},
          {"idle", t.idle}};
}

std::string rate(double samples_per_second) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(1) << samples_per_second / 1000.0 << "k";
  return s.str();
}

// Ctrl-C / SIGTERM: the first asks the run to stop after the current step (and save, if saving
// is on); the second exits at once. The signals are blocked in every thread (the mask is set
// before any worker thread exists, and threads inherit it) and taken by one thread in sigwait:
// measured here, delivering SIGINT asynchronously into the compute threads corrupted the heap in
// about 1 run in 40 even with an empty handler, so no compute thread is ever interrupted.
class StopSignals {
 public:
  StopSignals() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGTERM);
    sigaddset(&set_, SIGUSR1);  // our own wake-up at the end
    pthread_sigmask(SIG_BLOCK, &set_, &old_);
    requests_.store(0, std::memory_order_relaxed);
    waiter_ = std::thread([this] {
      for (;;) {
        int sig = 0;
        if (sigwait(&set_, &sig) != 0) continue;
        // acquire: pairs with the release store of done_ before the wake-up signal.
        if (sig == SIGUSR1) {
          if (done_.load(std::memory_order_acquire)) return;
          continue;
        }
        // relaxed: a counter read between steps; it publishes no other data.
        if (requests_.fetch_add(1, std::memory_order_relaxed) >= 1) ::_exit(kExitInterrupted);
      }
    });
  }
  ~StopSignals() {
    done_.store(true, std::memory_order_release);
    pthread_kill(waiter_.native_handle(), SIGUSR1);
    waiter_.join();
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  static bool requested() { return requests_.load(std::memory_order_relaxed) > 0; }

 private:
  sigset_t set_{}, old_{};
  std::thread waiter_;
  std::atomic<bool> done_{false};
  static inline std::atomic<int> requests_{0};
};

struct CheckpointOptions {
  std::string save, resume;
  std::uint64_t save_every = 0;
  std::size_t keep = 1;
};

// Progress on the terminal (one rewritten line on a TTY, periodic lines otherwise) and the
// JSON Lines metrics file.
class Progress final : public train::Observer {
 public:
  Progress(std::ostream& out, bool quiet, bool tty, std::size_t log_every, std::ofstream* metrics,
           std::size_t epochs_planned, std::function<void(std::uint64_t)> every_step = {})
      : out_(out),
        quiet_(quiet),
        tty_(tty),
        log_every_(log_every),
        metrics_(metrics),
        epochs_planned_(epochs_planned),
        every_step_(std::move(every_step)) {}

  bool stop_requested() override { return StopSignals::requested(); }

  void on_step(const train::StepEvent& e) override {
    if (every_step_) every_step_(e.step);
    if (first_step_ == 0) {  // a resumed run starts past 1
      first_step_ = e.step;
      last_step_ = e.step - 1;
    }
    if (e.skipped) {
      write_metrics({{"kind", "skip"},
                     {"step", e.step},
                     {"epoch", e.epoch},
                     {"reason", e.skip_reason},
                     {"skipped_total", e.skipped_total}});
      if (!quiet_)
        out_ << (tty_ ? "\r" : "") << "step " << e.step << " skipped: " << e.skip_reason << " ("
             << e.skipped_total << " skipped so far)" << (tty_ ? kClearToEnd : "") << "\n";
      return;
    }
    // Two windows: the metrics line's loss is the mean since the previous metrics line, the
    // printed one's since the previous printed line (on a TTY those come at their own pace).
    metrics_window_.add(e.loss);
    print_window_.add(e.loss);
    if (metrics_ && log_every_ && e.step % log_every_ == 0) {
      json line{{"kind", "step"},
                {"step", e.step},
                {"epoch", e.epoch},
                {"loss", metrics_window_.take()},
                {"lr", e.lr}};
      if (std::isfinite(e.grad_norm)) line["grad_norm"] = e.grad_norm;
      line["elapsed_s"] = e.elapsed;
      write_metrics(line);
    }
    const bool line_due =
        tty_ ? (e.elapsed - last_print_ > 0.2 || e.step_in_epoch == e.steps_per_epoch)
             : (log_every_ && e.step % log_every_ == 0);
    if (!quiet_ && line_due && print_window_.steps > 0) {
      const double rate_now =
          double(e.samples) * double(e.step - last_step_) / (e.elapsed - last_print_);
      // ETA from this run's mean step time (training steps only; evaluation adds to it).
      const double per_step = e.elapsed / double(e.step - first_step_ + 1);
      const double eta = per_step * double(e.total_steps - e.step);
      std::ostringstream line;
      if (tty_) line << bar(double(e.step) / double(e.total_steps)) << " ";
      line << "epoch " << e.epoch + 1 << "/" << epochs_planned_ << "  step " << e.step_in_epoch
           << "/" << e.steps_per_epoch << "  loss " << std::fixed << std::setprecision(4)
           << print_window_.take() << "  " << rate(rate_now) << " samples/s"
           << "  ETA " << clock_text(eta);
      if (tty_)
        out_ << "\r" << line.str() << kClearToEnd << std::flush;
      else
        out_ << line.str() << "\n";
      last_print_ = e.elapsed;
      last_step_ = e.step;
    }
  }

  void on_epoch(const train::EpochResult& r) override {
    write_metrics({{"kind", "epoch"},
                   {"epoch", r.epoch + 1},
                   {"step", r.steps},
                   {"train_loss", r.train_loss},
                   {"test_loss", r.test_loss},
                   {"test_accuracy", r.test_accuracy},
                   {"samples_per_second", r.samples_per_second},
                   {"elapsed_s", r.elapsed}});
    if (quiet_) return;
    if (tty_) out_ << "\r";
    out_ << "epoch " << r.epoch + 1 << " done: train loss " << std::fixed << std::setprecision(4)
         << r.train_loss << "  test loss " << r.test_loss << "  test accuracy "
         << std::setprecision(4) << r.test_accuracy << "  " << rate(r.samples_per_second)
         << " samples/s" << (tty_ ? kClearToEnd : "") << "\n";
  }

 private:
  static constexpr const char* kClearToEnd = "\x1b[K";  // erase the rest of a rewritten line
  // One JSON Lines record, flushed so a crash or a reader mid-run sees whole lines only.
  void write_metrics(const json& line) {
    if (!metrics_) return;
    *metrics_ << line.dump() << "\n";
    metrics_->flush();
  }
  static std::string bar(double fraction) {
    constexpr int kWidth = 24;
    const int done = static_cast<int>(std::clamp(fraction, 0.0, 1.0) * kWidth);
    return "[" + std::string(done, '#') + std::string(kWidth - done, '.') + "]";
  }
  static std::string clock_text(double seconds) {
    const auto total = static_cast<long long>(std::max(0.0, seconds) + 0.5);
    char text[32];
    std::snprintf(text, sizeof text, "%lld:%02lld:%02lld", total / 3600, total / 60 % 60,
                  total % 60);
    return text;
  }

  std::ostream& out_;
  bool quiet_, tty_;
  std::size_t log_every_;
  std::ofstream* metrics_;
  std::size_t epochs_planned_;
  std::function<void(std::uint64_t)> every_step_;
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

void print_summary(std::ostream& out, const train::Summary& s) {
  const auto& t = s.time;
  const double capacity = t.step * double(s.workers);  // worker-seconds available
  out << "\nsummary\n"
      << "  steps " << s.steps << ", epochs " << std::setprecision(3) << s.epochs << ", workers "
      << s.workers << ", batch " << s.batch << " (micro-batch " << s.micro_batch << "), "
      << s.parameters << " parameters\n"
      << "  samples/s " << std::fixed << std::setprecision(0) << s.samples_per_second
      << "   train loss " << std::setprecision(4) << s.train_loss << "   test loss " << s.test_loss
      << "   test accuracy " << s.test_accuracy << "\n"
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
  row("  relu (oneDNN)", t.eltwise, capacity);
  row("  softmax cross-entropy", t.loss, capacity);
  row("  pool, dropout, reorders", t.other, capacity);
  row("batch assembly", t.data, capacity);
  row("reduce + optimizer", t.reduce, capacity);
  row("  optimizer alone", t.optimizer, capacity);
  row("idle / wait", t.idle, capacity);
  row("root, critical path (wall)", t.reduce_critical, t.step);
}

// The trainer's spans as a Chrome trace (JSON object format: "X" complete events, one thread per
// track, named by "M" metadata events), which Perfetto and chrome://tracing open.
void write_trace(const std::string& path, const train::Trainer& trainer, const json& config) {
  json events = json::array();
  const auto tracks = trainer.trace_tracks();
  for (std::size_t t = 0; t < tracks.size(); ++t) {
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", 1},
                      {"tid", t},
                      {"args", {{"name", tracks[t]}}}});
    events.push_back({{"name", "thread_sort_index"},
                      {"ph", "M"},
                      {"pid", 1},
                      {"tid", t},
                      {"args", {{"sort_index", t}}}});
  }
  for (const train::TraceSpan& s : trainer.trace()) {
    json args{{"step", s.step}};
    if (s.index_name) args[s.index_name] = s.index;
    events.push_back({{"name", s.name},
                      {"ph", "X"},
                      {"pid", 1},
                      {"tid", s.track},
                      {"ts", s.begin_us},
                      {"dur", std::max(0.0, s.end_us - s.begin_us)},
                      {"args", std::move(args)}});
  }
  json trace{
      {"traceEvents", std::move(events)},
      {"displayTimeUnit", "ms"},
      {"otherData",
       {{"tool", "cohort 0.1.0"}, {"truncated", trainer.trace_truncated()}, {"config", config}}}};
  write_atomically(path, trace.dump() + "\n");
}

// A float as the shortest decimal that reads back as it (0.05f prints as 0.05, not as the
// double 0.05000000074505806).
double shortest(float f) {
  char text[32];
  const auto end = std::to_chars(text, text + sizeof text, f).ptr;
  return std::strtod(std::string(text, end).c_str(), nullptr);
}

// The effective configuration (defaults resolved), as printed at the start and stored in the
// summary and the checkpoint.
json config_json(const train::TrainConfig& c, const std::string& data_dir) {
  const auto& o = c.optimizer;
  json optimizer{{"kind", optim::to_string(o.kind)}, {"lr", shortest(o.lr)}};
  if (o.kind == optim::Kind::kSgd)
    optimizer.update(json{{"momentum", shortest(o.momentum)}, {"nesterov", o.nesterov}});
  else
    optimizer.update(
        json{{"beta1", shortest(o.beta1)}, {"beta2", shortest(o.beta2)}, {"eps", shortest(o.eps)}});
  optimizer["weight_decay"] = shortest(o.weight_decay);
  optimizer["clip_norm"] = shortest(c.clip_norm);
  const auto& sc = c.schedule;
  json schedule{{"kind", optim::to_string(sc.kind)},
                {"warmup_steps", sc.warmup_steps},
                {"scale_batch", sc.scale_batch},
                {"base_lr", shortest(optim::scaled_base_lr(sc, o.lr, c.batch))}};
  if (sc.kind == optim::ScheduleKind::kStep)
    schedule.update(json{{"step_every", sc.step_every}, {"gamma", shortest(sc.gamma)}});
  if (sc.kind == optim::ScheduleKind::kCosine) schedule["min_lr"] = shortest(sc.min_lr);
  return {
      {"model", c.model},
      {"data", data_dir},
      {"batch", c.batch},
      {"micro_batch", c.micro_batch},
      {"workers", c.workers},
      {"epochs", c.epochs},
      {"steps", c.steps},
      {"seed", c.seed},
      {"optimizer", optimizer},
      {"schedule", schedule},
      {"on_nonfinite", c.on_nonfinite == train::TrainConfig::OnNonFinite::kSkip ? "skip" : "stop"},
      {"max_skips", c.max_skips},
      {"reducer", reduce::to_string(c.reducer)},
      {"weight_grads", weight_grads_name(c.weight_grads)},
      {"drop_last", c.drop_last},
      {"blocked_layouts", c.blocked_layouts}};
}

int train_command(train::TrainConfig config, const std::string& data_dir,
                  const std::string& summary_path, const std::string& metrics_path,
                  const std::string& trace_path, const CheckpointOptions& ck, std::size_t log_every,
                  bool quiet, std::ostream& out) {
  StopSignals signals;  // before any thread exists, so every thread inherits the blocked mask
  check_output_path("--summary", summary_path);
  check_output_path("--metrics", metrics_path);
  check_output_path("--trace", trace_path);
  config.trace = !trace_path.empty();
  check_output_path("--save", ck.save);
  if (ck.keep == 0) throw InputError("--keep: expected at least 1, found 0");
  if (ck.save_every != 0 && ck.save.empty())
    throw InputError("--save-every: expected --save FILE as well, found none");
  std::optional<checkpoint::Checkpoint> resume;
  if (!ck.resume.empty())
    resume = checkpoint::load_checkpoint(ck.resume);  // all checked, nothing used
  auto t_load = std::chrono::steady_clock::now();
  data::Splits data = data::load_image_folder(data_dir);
  double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
  train::Trainer trainer(config, data);  // validates everything before the first step
  const auto& c = trainer.config();
  if (resume) trainer.restore(*resume, ck.resume);
  const json effective_json = config_json(c, data_dir);
  const std::string effective = effective_json.dump();
  auto save = [&] { checkpoint::save_checkpoint(ck.save, trainer.checkpoint(effective), ck.keep); };
  if (!quiet)
    out << "cohort train: " << c.model << " on " << data_dir << " (" << data.train.count
        << " train, " << data.test.count << " test images, loaded in " << std::fixed
        << std::setprecision(2) << load_s << " s)\n"
        << "  config " << effective << "\n"
        << (resume
                ? "  resumed from " + ck.resume + " at step " + std::to_string(resume->step) + "\n"
                : "");
  std::optional<std::ofstream> metrics;
  if (!metrics_path.empty()) {
    metrics.emplace(metrics_path, std::ios::trunc);
    if (!*metrics) throw InputError("--metrics " + metrics_path + ": cannot open for writing");
  }
  const std::size_t steps_per_epoch =
      c.drop_last ? data.train.count / c.batch : (data.train.count + c.batch - 1) / c.batch;
  const std::size_t epochs_planned =
      c.steps ? (c.steps + steps_per_epoch - 1) / steps_per_epoch : c.epochs;
  auto every_step = [&](std::uint64_t step) {
    if (ck.save_every != 0 && step % ck.save_every == 0) save();
  };
  Progress progress(out, quiet, &out == &std::cout && ::isatty(STDOUT_FILENO), log_every,
                    metrics ? &*metrics : nullptr, epochs_planned, every_step);
  train::Summary s;
  try {
    s = trainer.run(progress);
  } catch (...) {
    if (!trace_path.empty()) write_trace(trace_path, trainer, effective_json);  // up to the fault
    throw;
  }
  if (!trace_path.empty()) write_trace(trace_path, trainer, effective_json);
  if (!ck.save.empty()) save();  // the final weights (also after Ctrl-C: a whole step's)
  if (s.stopped) {
    out << "\nstopped by a signal after step " << s.steps
        << (ck.save.empty() ? "" : "; checkpoint " + ck.save) << "\n";
    return kExitInterrupted;
  }
  if (!quiet) print_summary(out, s);
  if (!summary_path.empty()) {
    json j{{"steps", s.steps},
           {"updates", s.updates},
           {"skipped_steps", s.skipped},
           {"epochs", s.epochs},
           {"workers", s.workers},
           {"batch", s.batch},
           {"micro_batch", s.micro_batch},
           {"parameters", s.parameters},
           {"samples_per_second", s.samples_per_second},
           {"train_loss", s.train_loss},
           {"test_loss", s.test_loss},
           {"test_accuracy", s.test_accuracy},
           {"weights_digest", s.weights_digest},
           {"time", to_json(s.time)},
           {"config", effective_json}};
    write_atomically(summary_path, j.dump(2) + "\n");
  }
  return kExitOk;
}

int eval_command(const std::string& checkpoint, const std::string& data_dir,
                 const std::string& summary_path, std::size_t workers, std::ostream& out) {
  check_output_path("--summary", summary_path);
  const checkpoint::Checkpoint ck = checkpoint::load_checkpoint(checkpoint);
  data::Splits data = data::load_image_folder(data_dir);
  train::TrainConfig config;
  config.model = ck.model;
  config.seed = ck.seed;
  config.batch = ck.batch;
  config.micro_batch = ck.micro_batch;
  config.drop_last = ck.drop_last;
  config.workers = workers;
  // The optimizer only shapes the state the checkpoint must match; evaluation never steps.
  config.optimizer.kind = optim::parse_kind(ck.optimizer, checkpoint + ": optimizer");
  if (config.optimizer.kind == optim::Kind::kSgd)
    config.optimizer.momentum = ck.state.empty() ? 0.0f : config.optimizer.momentum;
  train::Trainer trainer(config, data);
  trainer.restore(ck, checkpoint);
  auto [loss, accuracy] = trainer.evaluate_test();
  const std::string digest = train::weights_digest(trainer.weights(), ck.weights.size());
  out << "cohort eval: " << checkpoint << " (" << ck.model << ", step " << ck.step << ") on "
      << data_dir << ": test loss " << std::fixed << std::setprecision(4) << loss
      << ", test accuracy " << accuracy << ", weights digest " << digest << "\n";
  if (!summary_path.empty())
    write_atomically(summary_path, json{{"checkpoint", checkpoint},
                                        {"model", ck.model},
                                        {"step", ck.step},
                                        {"test_loss", loss},
                                        {"test_accuracy", accuracy},
                                        {"weights_digest", digest}}
                                           .dump(2) +
                                       "\n");
  return kExitOk;
}

// `cohort plot a.jsonl [b.jsonl ...] -o curves.svg`: every file is read and checked before the
// SVG is written (atomically). Runs whose files share a name are labelled by their folder too.
int plot_command(const std::vector<std::string>& files, const std::string& out_path,
                 const std::string& title, int width, std::ostream& out) {
  check_output_path("--output", out_path);
  if (width < 600)
    throw InputError("--width: expected at least 600 (pixels), found " + std::to_string(width));
  std::vector<report::Series> runs;
  for (const std::string& f : files) runs.push_back(report::read_metrics(f));
  for (std::size_t i = 0; i < runs.size(); ++i)
    for (std::size_t j = 0; j < runs.size(); ++j)
      if (i != j && runs[i].label == fs::path(files[j]).filename().string())
        runs[i].label = fs::path(files[i]).lexically_normal().string();
  write_atomically(out_path, report::render_svg(runs, {.width = width, .title = title}));
  out << "cohort plot: " << runs.size() << (runs.size() == 1 ? " run" : " runs") << " -> "
      << out_path << "\n";
  return kExitOk;
}

}  // namespace

// `cohort train --config FILE ...`: the file's keys become flags placed before the command
// line's own, so that with take-the-last-value options the command line overrides the file.
std::vector<std::string> with_config_flags(int argc, const char* const* argv) {
  std::vector<std::string> args(argv, argv + argc);
  if (args.size() < 2 || args[1] != "train") return args;
  for (std::size_t i = 2; i < args.size(); ++i) {
    std::string path;
    if (args[i] == "--config" && i + 1 < args.size()) path = args[i + 1];
    if (args[i].rfind("--config=", 0) == 0) path = args[i].substr(9);
    if (path.empty()) continue;
    auto flags = config::job_config_flags(path);
    args.insert(args.begin() + 2, flags.begin(), flags.end());
    break;
  }
  return args;
}

int run(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  std::vector<std::string> args;
  try {
    args = with_config_flags(argc, argv);
  } catch (const InputError& e) {
    err << "cohort: error: " << e.what() << "\n";
    return kExitBadInput;
  }
  CLI::App app{"cohort: synchronous data-parallel neural-network training on one CPU machine",
               "cohort"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "cohort 0.1.0");

  train::TrainConfig config;
  // The command's default recipe: SGD with momentum 0.9 at lr 0.1, a linear warmup over 200
  // updates, then cosine decay to 0 over the run. Measured (docs/engine_results.md) on 5 epochs
  // of the cnn preset, seeds 1-3: 0.9052, 0.9053, 0.9054 test accuracy, against 0.8993, 0.8924,
  // 0.8951 with PyTorch peer's constant lr 0.05 (the library's TrainConfig default, which
  // `--schedule constant --lr 0.05 --warmup-steps 0` restores).
  config.optimizer.lr = 0.1f;
  config.schedule.kind = optim::ScheduleKind::kCosine;
  config.schedule.warmup_steps = 200;
  std::string data_dir = data::kDefaultDataDir, summary_path, metrics_path;
  std::size_t log_every = 50;
  bool quiet = false;
  CLI::App* train_cmd = app.add_subcommand("train", "train a model on an image dataset");
  // A flag given twice takes its last value, so a script's defaults can be overridden.
  train_cmd->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  train_cmd->option_defaults()->always_capture_default();  // --help shows every default
  std::string config_path;
  train_cmd->add_option("--config", config_path,
                        "TOML job config (examples/); flags on the command line override it");
  train_cmd->add_option("--data", data_dir, "folder with the four IDX files (raw or .gz)");
  train_cmd->add_option("--model", config.model,
                        "mlp:784-512-256-10, cnn, or a layer list such as "
                        "conv(32,5)-relu-maxpool(2)-flatten-linear(10)");
  train_cmd->add_option("--workers", config.workers, "worker replicas (0: one per core)");
  train_cmd->add_option("--batch", config.batch, "global batch size");
  train_cmd->add_option("--micro-batch", config.micro_batch,
                        "rows per leaf of the reduction tree (0: batch / cores, rounded up)");
  train_cmd->add_option("--epochs", config.epochs, "epochs over the training set");
  train_cmd->add_option("--steps", config.steps, "stop after N optimizer steps (0: no limit)");
  std::string optimizer_name = "sgd", schedule_name = "cosine", on_nonfinite = "stop";
  std::string weight_grads = weight_grads_name(config.weight_grads);
  auto& opt = config.optimizer;
  auto& sched = config.schedule;
  train_cmd->add_option("--optimizer", optimizer_name, "sgd | adam | adamw");
  train_cmd->add_option("--lr", opt.lr, "base learning rate");
  train_cmd->add_option("--momentum", opt.momentum, "SGD momentum");
  train_cmd->add_flag("--nesterov", opt.nesterov, "SGD: Nesterov momentum");
  train_cmd->add_option("--weight-decay", opt.weight_decay,
                        "weight decay (SGD, Adam: L2 on the gradient; AdamW: decoupled)");
  train_cmd->add_option("--beta1", opt.beta1, "Adam(W): first moment decay");
  train_cmd->add_option("--beta2", opt.beta2, "Adam(W): second moment decay");
  train_cmd->add_option("--eps", opt.eps, "Adam(W): denominator epsilon");
  train_cmd->add_option("--schedule", schedule_name, "constant | step | cosine (after warmup)");
  train_cmd->add_option("--warmup-steps", sched.warmup_steps, "linear warmup over N updates");
  train_cmd->add_option("--lr-step-every", sched.step_every, "step schedule: updates per decay");
  train_cmd->add_option("--lr-gamma", sched.gamma, "step schedule: decay factor");
  train_cmd->add_option("--min-lr", sched.min_lr, "cosine schedule: final learning rate");
  train_cmd->add_option("--lr-scale-batch", sched.scale_batch,
                        "linear scaling rule: use lr * batch / N as the base rate (0: off)");
  train_cmd->add_option("--clip-norm", config.clip_norm,
                        "clip the gradient's global norm (0: off)");
  train_cmd->add_option(
      "--on-nonfinite", on_nonfinite,
      "stop | skip: a non-finite loss or gradient stops the run, or skips the step");
  train_cmd->add_option("--max-skips", config.max_skips,
                        "skipped steps in a row that stop the run");
  train_cmd->add_option("--seed", config.seed, "seed of initialisation and shuffling");
  std::string reducer_name = "tree";
  train_cmd->add_option("--reducer", reducer_name,
                        "tree | chunk_owner | parameter_server | atomic | mutex | serial");
  train_cmd->add_option("--weight-grads", weight_grads,
                        "batch | leaf: linear layers' weight gradients over the whole batch at the "
                        "root, right before the optimizer, or per leaf, summed by the reducer");
  bool keep_last = false, plain_layouts = false;
  train_cmd->add_flag("--plain-layouts", plain_layouts,
                      "plain nchw activations in convolutions and pooling instead of oneDNN's "
                      "blocked choice (for measuring)");
  train_cmd->add_flag("--keep-last", keep_last,
                      "also train on each epoch's last, partial batch (default: skip it)");
  CheckpointOptions ck;
  train_cmd->add_option("--save", ck.save,
                        "write a checkpoint here at the end (and every --save-every steps)");
  train_cmd->add_option("--save-every", ck.save_every,
                        "steps between checkpoints (0: only at the end)");
  train_cmd->add_option("--keep", ck.keep, "checkpoints to keep: FILE, FILE.1, ... (newest first)");
  train_cmd->add_option("--resume", ck.resume,
                        "continue from this checkpoint (bit for bit the uninterrupted run)");
  train_cmd->add_option("--summary", summary_path, "write a JSON summary to this file");
  train_cmd->add_option("--metrics", metrics_path, "write JSON Lines metrics to this file");
  std::string trace_path;
  train_cmd->add_option("--trace", trace_path,
                        "write a Chrome trace of every step (open in ui.perfetto.dev)");
  train_cmd->add_option("--log-every", log_every, "steps between progress lines / step metrics");
  train_cmd->add_flag("--quiet", quiet, "no progress and no summary table");

  std::string eval_checkpoint, eval_data = data::kDefaultDataDir, eval_summary;
  std::size_t eval_workers = 0;
  CLI::App* eval_cmd = app.add_subcommand("eval", "evaluate a checkpoint on the test set");
  eval_cmd->add_option("--checkpoint", eval_checkpoint, "the checkpoint to evaluate")->required();
  eval_cmd->add_option("--data", eval_data, "folder with the four IDX files")
      ->capture_default_str();
  eval_cmd->add_option("--summary", eval_summary, "write a JSON summary to this file");
  eval_cmd->add_option("--workers", eval_workers, "worker replicas (0: one per core)");

  std::vector<std::string> plot_files;
  std::string plot_output, plot_title;
  int plot_width = 1000;
  CLI::App* plot_cmd =
      app.add_subcommand("plot", "draw loss and accuracy curves of --metrics files as an SVG");
  plot_cmd->add_option("metrics", plot_files, "JSON Lines files written by train --metrics")
      ->required();
  plot_cmd->add_option("-o,--output", plot_output, "the SVG file to write")->required();
  plot_cmd->add_option("--title", plot_title, "a title above the curves");
  plot_cmd->add_option("--width", plot_width, "image width in pixels")->capture_default_str();

  try {
    std::vector<const char*> view;
    for (const auto& a : args) view.push_back(a.c_str());
    app.parse(static_cast<int>(view.size()), view.data());
  } catch (const CLI::CallForHelp&) {
    out << app.help();
    return kExitOk;
  } catch (const CLI::CallForAllHelp&) {
    out << app.help("", CLI::AppFormatMode::All);
    return kExitOk;
  } catch (const CLI::CallForVersion& e) {
    out << e.what() << "\n";
    return kExitOk;
  } catch (const CLI::ParseError& e) {
    err << "cohort: " << e.what() << "\n";
    return kExitBadInput;
  }

  config.drop_last = !keep_last;
  config.blocked_layouts = !plain_layouts;
  try {
    config.optimizer.kind = optim::parse_kind(optimizer_name);
    config.schedule.kind = optim::parse_schedule(schedule_name);
    if (on_nonfinite != "stop" && on_nonfinite != "skip")
      throw InputError("--on-nonfinite: expected stop or skip, found '" + on_nonfinite + "'");
    config.on_nonfinite = on_nonfinite == "skip" ? train::TrainConfig::OnNonFinite::kSkip
                                                 : train::TrainConfig::OnNonFinite::kStop;
    config.weight_grads = parse_weight_grads(weight_grads);
    config.reducer = reduce::parse_strategy(reducer_name);
    if (train_cmd->parsed())
      return train_command(config, data_dir, summary_path, metrics_path, trace_path, ck, log_every,
                           quiet, out);
    if (eval_cmd->parsed())
      return eval_command(eval_checkpoint, eval_data, eval_summary, eval_workers, out);
    if (plot_cmd->parsed())
      return plot_command(plot_files, plot_output, plot_title, plot_width, out);
    return kExitBadInput;
  } catch (const InputError& e) {
    err << "cohort: error: " << e.what() << "\n";
    return kExitBadInput;
  } catch (const std::exception& e) {
    err << "cohort: internal error: " << e.what() << "\n";
    return kExitInternal;
  }
}

}  // namespace cohort::cli
