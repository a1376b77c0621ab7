// `cohort train`'s option table and what is built from it: the CLI11 options, the job config's
// schema and the checks of the values given. A row names its field by a path of member pointers,
// so its type (and, for enums, its name table) decides how it is parsed and shown. Not the
// checks that need the data or each other (train::validate, train_command.cpp).
#include "options.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>
#include <type_traits>

#include "cohort/core/cpu.hpp"
#include "cohort/core/error.hpp"
#include "cohort/core/names.hpp"
#include "cohort/dist/comm.hpp"
#include "cohort/nn/batch_grad.hpp"
#include "cohort/nn/linear_floor.hpp"
#include "cohort/nn/version.hpp"
#include "cohort/train/version.hpp"
#include "cohort/version.hpp"
#include "output.hpp"

namespace cohort::cli {

namespace {

using config::Range;
using config::Type;
using O = TrainOptions;
using TC = train::TrainConfig;
using OC = optim::OptimizerConfig;
using SC = optim::ScheduleConfig;

// The name table of each enum the table stores, so a row needs only the field.
constexpr const auto& names_table(optim::Kind) { return optim::kKindNames; }
constexpr const auto& names_table(optim::ScheduleKind) { return optim::kScheduleNames; }
constexpr const auto& names_table(reduce::Strategy) { return reduce::kStrategyNames; }
constexpr const auto& names_table(TC::OnNonFinite) { return TC::kOnNonFiniteNames; }
constexpr const auto& names_table(TC::WeightGrads) { return TC::kWeightGradsNames; }
constexpr const auto& names_table(nn::Precision) { return nn::kPrecisionNames; }

// o.*First.*Rest...: the field a row stores into.
template <auto First, auto... Rest, class T>
auto& follow(T& t) {
  if constexpr (sizeof...(Rest) == 0)
    return t.*First;
  else
    return follow<Rest...>(t.*First);
}

template <auto... Path>
struct Field {
  using T = std::remove_cvref_t<decltype(follow<Path...>(std::declval<O&>()))>;

  static CLI::Option* add(CLI::App& cmd, O& o, const TrainFlag& row) {
    T& field = follow<Path...>(o);
    if constexpr (std::is_same_v<T, bool>) {
      return cmd.add_flag(row.key.flag, field, row.help);
    } else if constexpr (std::is_enum_v<T>) {
      // Parsed after the whole command line, from its last value, with the table's message.
      auto store = [&field, flag = row.key.flag](const std::string& name) {
        field = parse_name(names_table(T{}), name, flag);
      };
      std::string names;
      for (const auto& n : names_list(names_table(T{}))) names += (names.empty() ? "" : "|") + n;
      return cmd.add_option_function<std::string>(row.key.flag, store, row.help)
          ->type_name(names)
          ->default_str(text(o));
    } else if constexpr (std::is_unsigned_v<T>) {
      return cmd.add_option(row.key.flag, field, row.help)->transform(unsigned_decimal());
    } else {
      return cmd.add_option(row.key.flag, field, row.help);
    }
  }
  static std::string text(const O& o) {
    const T& v = follow<Path...>(o);
    if constexpr (std::is_same_v<T, bool>)
      return v ? "true" : "false";
    else if constexpr (std::is_enum_v<T>)
      return std::string(name_of(names_table(T{}), v));
    else if constexpr (std::is_floating_point_v<T>)
      return float_text(v);
    else if constexpr (std::is_integral_v<T>)
      return std::to_string(v);
    else
      return v;
  }
  static double number(const O& o) {
    if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>)
      return static_cast<double>(follow<Path...>(o));
    else
      return std::numeric_limits<double>::quiet_NaN();
  }
  static TrainFlag row(std::string flag, std::string toml, Type type, Range range,
                       std::string help) {
    std::vector<std::string> choices;
    if constexpr (std::is_enum_v<T>) choices = names_list(names_table(T{}));
    return {{std::move(flag), std::move(toml), type, range, std::move(choices)},
            std::move(help),
            &add,
            &text,
            &number};
  }
};

// The row makers: the field's type must suit the kind of row.
template <auto... Path>
TrainFlag number_flag(std::string flag, std::string toml, Range range, std::string help) {
  using T = typename Field<Path...>::T;
  static_assert(std::is_arithmetic_v<T> && !std::is_same_v<T, bool>);
  return Field<Path...>::row(std::move(flag), std::move(toml),
                             std::is_integral_v<T> ? Type::kInteger : Type::kFloat, range,
                             std::move(help));
}
template <auto... Path>
TrainFlag string_flag(std::string flag, std::string toml, Type type, std::string help) {
  static_assert(std::is_same_v<typename Field<Path...>::T, std::string>);
  return Field<Path...>::row(std::move(flag), std::move(toml), type, {}, std::move(help));
}
template <auto... Path>
TrainFlag choice_flag(std::string flag, std::string toml, std::string help) {
  static_assert(std::is_enum_v<typename Field<Path...>::T>);
  return Field<Path...>::row(std::move(flag), std::move(toml), Type::kChoice, {}, std::move(help));
}
template <auto... Path>
TrainFlag bool_flag(std::string flag, std::string toml, std::string help) {
  static_assert(std::is_same_v<typename Field<Path...>::T, bool>);
  return Field<Path...>::row(std::move(flag), std::move(toml), Type::kBool, {}, std::move(help));
}

// A kFileIn row that also takes `words` (config::Key::choices).
TrainFlag with_words(TrainFlag row, std::vector<std::string> words) {
  row.key.choices = std::move(words);
  return row;
}

// "a, b and c".
std::string joined(const std::vector<std::string>& names) {
  std::string text;
  for (std::size_t i = 0; i < names.size(); ++i)
    text += (i == 0 ? "" : i + 1 == names.size() ? " and " : ", ") + names[i];
  return text;
}

// Which strategies keep the reproducibility promise, from reduce::is_deterministic.
std::string reducer_help() {
  std::vector<std::string> same, arrival;
  for (const auto& n : reduce::kStrategyNames)
    (reduce::is_deterministic(n.value) ? same : arrival).emplace_back(n.name);
  return "how leaf gradients are summed: " + joined(same) +
         " give bitwise the same weights for every worker count; " + joined(arrival) +
         " add leaves in arrival order and do not";
}

constexpr double k2to24 = 1 << 24;
constexpr Range kFraction{.min = 0, .max = 1, .max_exclusive = true};          // [0, 1)
constexpr Range kPositiveFraction{.min = 0, .max = 1, .min_exclusive = true};  // (0, 1]
constexpr auto kAnyUint64 = static_cast<double>(std::numeric_limits<std::uint64_t>::max());

std::vector<TrainFlag> make_table() {
  const std::string none;  // no TOML key: command line only
  return {
      string_flag<&O::config_path>(
          "--config", none, Type::kFileIn,
          "TOML job config (examples/); flags on the command line override it"),
      string_flag<&O::data_dir>(
          "--data", "data.dir", Type::kDir,
          "folder with IDX files (raw or .gz), train_x/train_y/test_x/test_y .npy "
          "files, train.csv and test.csv, train/<class>/ and test/<class>/ image folders (PNG, "
          "JPEG), or text for a language model: input.txt (UTF-8; val.txt optional) or "
          "train_tokens.npy and val_tokens.npy"),
      string_flag<&O::config, &TC::model>(
          "--model", "model.spec", Type::kString,
          "mlp:784-512-256-10, cnn, resnet20, or a layer list "
          "such as conv(32,5)-relu-maxpool(2)-flatten-linear(10) "
          "(also bn, gap, res(OC[,stride])), or a language "
          "model gpt:LAYERS-HEADS-EMBD-BLOCK[-DROPOUT][,bias][,gelu=tanh][,pad=N] "
          "(gpt:124M and gpt:350M: GPT-2's)"),
      string_flag<&O::config, &TC::augment>(
          "--augment", "data.augment", Type::kString,
          "seeded augmentation of training images, comma-separated: crop:P (random crop of the "
          "image zero-padded by P), flip (horizontal, p 0.5), normalize (per channel, with the "
          "training set's mean and std; also at evaluation), erase:P (random erasing with "
          "probability P); empty: none"),
      string_flag<&O::config, &TC::init_from>(
          "--init-from", "model.init_from", Type::kString,
          "start from the weights of this safetensors file (what cohort export writes; a "
          "language model's also in Hugging Face's GPT-2 layout, or its folder: "
          "model.safetensors and config.json, which gives --model) instead of --seed's "
          "initialisation; a run resumed from a checkpoint keeps the checkpoint's"),
      number_flag<&O::config, &TC::workers>("--workers", "run.workers", {0, 1024},
                                            "worker replicas (0: one per core)"),
      number_flag<&O::config, &TC::batch>(
          "--batch", "run.batch", {1, k2to24},
          "global batch size (samples; a language model's windows)"),
      number_flag<&O::config, &TC::micro_batch>(
          "--micro-batch", "run.micro_batch", {0, k2to24},
          "rows per leaf of the reduction tree; the weights depend on it (0: from the model, "
          "the batch and the precision only, never the machine)"),
      number_flag<&O::config, &TC::epochs>("--epochs", "run.epochs", {0, 1e6},
                                           "epochs over the training set"),
      number_flag<&O::config, &TC::steps>("--steps", "run.steps", {0, 1e15},
                                          "stop after N optimizer steps (0: no limit)"),
      choice_flag<&O::config, &TC::optimizer, &OC::kind>("--optimizer", "optimizer.kind",
                                                         "the optimizer (torch.optim semantics)"),
      // Up to 1e15: a rate that large is no typo but a way to make the loss non-finite on
      // purpose (to try --on-nonfinite).
      number_flag<&O::config, &TC::optimizer, &OC::lr>(
          "--lr", "optimizer.lr", {.min = 0, .max = 1e15, .min_exclusive = true},
          "base learning rate"),
      number_flag<&O::config, &TC::optimizer, &OC::momentum>("--momentum", "optimizer.momentum",
                                                             kFraction, "SGD momentum"),
      bool_flag<&O::config, &TC::optimizer, &OC::nesterov>("--nesterov", "optimizer.nesterov",
                                                           "SGD: Nesterov momentum"),
      number_flag<&O::config, &TC::optimizer, &OC::weight_decay>(
          "--weight-decay", "optimizer.weight_decay", {0, 1e6},
          "weight decay (SGD, Adam: L2 on the gradient; AdamW: decoupled)"),
      bool_flag<&O::config, &TC::no_decay_norm_bias>(
          "--no-decay-norm-bias", "optimizer.no_decay_norm_bias",
          "no weight decay on bn scales and shifts, LayerNorm weights and biases (default: every "
          "tensor decays, as in torch.optim)"),
      number_flag<&O::config, &TC::optimizer, &OC::beta1>("--beta1", "optimizer.beta1", kFraction,
                                                          "Adam(W): first moment decay"),
      number_flag<&O::config, &TC::optimizer, &OC::beta2>("--beta2", "optimizer.beta2", kFraction,
                                                          "Adam(W): second moment decay"),
      number_flag<&O::config, &TC::optimizer, &OC::eps>("--eps", "optimizer.eps", kPositiveFraction,
                                                        "Adam(W): denominator epsilon"),
      choice_flag<&O::config, &TC::schedule, &SC::kind>("--schedule", "schedule.kind",
                                                        "learning-rate schedule after the warmup"),
      number_flag<&O::config, &TC::schedule, &SC::warmup_steps>(
          "--warmup-steps", "schedule.warmup_steps", {0, 1e12}, "linear warmup over N updates"),
      number_flag<&O::config, &TC::schedule, &SC::step_every>(
          "--lr-step-every", "schedule.step_every", {1, 1e15}, "step schedule: updates per decay"),
      number_flag<&O::config, &TC::schedule, &SC::gamma>(
          "--lr-gamma", "schedule.gamma", kPositiveFraction, "step schedule: decay factor"),
      number_flag<&O::config, &TC::schedule, &SC::min_lr>("--min-lr", "schedule.min_lr", {0, 1e6},
                                                          "cosine schedule: final learning rate"),
      number_flag<&O::config, &TC::schedule, &SC::scale_batch>(
          "--lr-scale-batch", "schedule.scale_batch", {0, k2to24},
          "linear scaling rule: use lr * batch / N as the base rate (0: off)"),
      number_flag<&O::config, &TC::clip_norm>("--clip-norm", "optimizer.clip_norm", {0, 1e9},
                                              "clip the gradient's global norm (0: off)"),
      choice_flag<&O::config, &TC::on_nonfinite>(
          "--on-nonfinite", "run.on_nonfinite",
          "a non-finite loss or gradient stops the run, or skips the step"),
      number_flag<&O::config, &TC::max_skips>("--max-skips", "run.max_skips", {1, 1e9},
                                              "skipped steps in a row that stop the run"),
      number_flag<&O::config, &TC::seed>("--seed", "run.seed", {0, kAnyUint64},
                                         "seed of initialisation and shuffling"),
      choice_flag<&O::config, &TC::reducer>("--reducer", "run.reducer", reducer_help()),
      choice_flag<&O::config, &TC::weight_grads>(
          "--weight-grads", "run.weight_grads",
          "linear layers' weight gradients over the whole batch at the root, right before the "
          "optimizer, or per leaf, summed by the reducer (language models: always per leaf)"),
      choice_flag<&O::config, &TC::precision>(
          "--precision", "run.precision",
          "the replicas' arithmetic: f32, or bf16 (bf16 forward and backward-data on a bf16 copy "
          "of the weights; f32 master weights, weight gradients, loss and optimizer)"),
      string_flag<&O::kernels>(
          "--kernels", "run.kernels", Type::kString,
          "the kernel set of the run whose effective config this repeats (its summary's "
          "config.kernels); where this machine's differs, the header says so (nothing else "
          "changes)"),
      bool_flag<&O::config, &TC::allow_emulated_bf16>(
          "--allow-emulated-bf16", "run.allow_emulated_bf16",
          "run --precision bf16 on a CPU without AVX512_BF16 (emulated, several times slower)"),
      bool_flag<&O::plain_layouts>("--plain-layouts", "run.plain_layouts",
                                   "plain nchw activations in convolutions and pooling instead of "
                                   "oneDNN's blocked choice (for measuring)"),
      bool_flag<&O::keep_last>("--keep-last", "run.keep_last",
                               "also train on each epoch's last, partial batch (default: skip it)"),
      string_flag<&O::checkpoint, &CheckpointOptions::save>(
          "--save", "checkpoint.save", Type::kFileOut,
          "write a checkpoint here at the end (and every --save-every steps)"),
      number_flag<&O::checkpoint, &CheckpointOptions::save_every>(
          "--save-every", "checkpoint.save_every", {0, 1e15},
          "steps between checkpoints (0: only at the end)"),
      number_flag<&O::checkpoint, &CheckpointOptions::keep>(
          "--keep", "checkpoint.keep", {1, 1000},
          "checkpoints to keep: FILE, FILE.1, ... (newest first)"),
      with_words(string_flag<&O::checkpoint, &CheckpointOptions::resume>(
                     "--resume", "checkpoint.resume", Type::kFileIn,
                     "continue from this checkpoint (bit for bit the uninterrupted run); auto: "
                     "from the newest of --save's files that loads, or from the start if none"),
                 {std::string(kResumeAuto)}),
      string_flag<&O::summary_path>("--summary", "output.summary", Type::kFileOut,
                                    "write a JSON summary to this file"),
      string_flag<&O::metrics_path>("--metrics", "output.metrics", Type::kFileOut,
                                    "write JSON Lines metrics to this file"),
      string_flag<&O::trace_path>("--trace", "output.trace", Type::kFileOut,
                                  "write a Chrome trace of every step (open in ui.perfetto.dev)"),
      number_flag<&O::config, &TC::eval_every>(
          "--eval-every", "run.eval_every", {0, 1e15},
          "also evaluate the test (validation) split every N steps (0: at epoch ends only)"),
      number_flag<&O::log_every>("--log-every", "output.log_every", {1, 1e9},
                                 "steps between progress lines / step metrics"),
      bool_flag<&O::quiet>("--quiet", "output.quiet", "no progress and no summary table"),
      number_flag<&O::stall_timeout>(
          "--stall-timeout", "run.stall_timeout", {0, 1e9},
          "several MPI ranks: end the whole job if no step finishes for this many seconds "
          "(0: never)"),
      bool_flag<&O::dry_run>("--dry-run", none,
                             "check every input, print the effective config, train nothing, write "
                             "nothing"),
  };
}

}  // namespace

std::string flag_group(const TrainFlag& row) {
  const std::string& toml = row.key.toml;
  std::string group = toml.empty() ? "run" : toml.substr(0, toml.find('.'));
  group[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(group[0])));
  return group;
}

std::string version_text() {
  return "cohort " COHORT_VERSION "\nbuild " COHORT_BUILD_TARGET ", cohort's kernels " +
         cohort_kernels_isa() + "\noneDNN " + nn::onednn_version() + "\nCPU " + nn::onednn_isa() +
         " (oneDNN's dispatch), bf16 " +
         std::string(name_of(nn::kBf16SupportNames, nn::bf16_support())) +
         ", the root's bf16 GEMMs on " +
         std::string(name_of(nn::kRootGemmNames, nn::root_bf16_gemm())) +
         ", bf16 inner products' weights " +
         (nn::plans_choose_layout(nn::Precision::kBf16, true) ? "in oneDNN's layout" : "plain") +
         "\nOpenBLAS " + nn::openblas_version() +
         (nn::openblas_usable() ? "" : ", not called (its kernels or build do not fit)") +
         "\noneTBB " + train::tbb_version() + "\nMPI " +
         (dist::built_with_mpi() ? "yes (mpirun -np R cohort train ...)" : "no (one process)");
}

train::TrainConfig TrainOptions::train_config() const {
  train::TrainConfig c = config;
  c.drop_last = !keep_last;
  c.blocked_layouts = !plain_layouts;
  c.trace = !trace_path.empty();
  c.roofline = true;  // the summary's step against its floor (~0.1 s after training)
  return c;
}

const std::vector<TrainFlag>& train_flags() {
  static const std::vector<TrainFlag> table = make_table();
  return table;
}

const config::Schema& train_schema() {
  static const config::Schema schema = [] {
    config::Schema keys;
    for (const TrainFlag& row : train_flags())
      if (!row.key.toml.empty()) keys.push_back(row.key);
    return keys;
  }();
  return schema;
}

CLI::App* add_train_command(CLI::App& app, TrainOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "train", std::string("train a model on images, tables or text; ") +
                   (dist::built_with_mpi()
                        ? "several machines: mpirun -np R cohort train ... (this build has MPI)"
                        : "one process (this build has no MPI)"));
  // A flag given twice takes its last value, so a script's defaults can be overridden.
  cmd->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  cmd->option_defaults()->always_capture_default();  // --help shows every default
  // --help shows a group's flags together (CLI11 lists groups in the order of their first
  // option), in this order and then any other group; within a group, in the table's order.
  std::vector<std::string> groups{"Data", "Model",  "Optimizer", "Schedule",
                                  "Run",  "Output", "Checkpoint"};
  for (const TrainFlag& row : train_flags())
    if (std::find(groups.begin(), groups.end(), flag_group(row)) == groups.end())
      groups.push_back(flag_group(row));
  for (const std::string& group : groups)
    for (const TrainFlag& row : train_flags())
      if (flag_group(row) == group) row.add(*cmd, o, row)->group(group);
  return cmd;
}

CLI::Validator unsigned_decimal() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        std::uint64_t value = 0;
        const char* end = text.data() + text.size();
        const auto [stop, ec] = std::from_chars(text.data(), end, value);
        if (text.empty() || text.front() == '-' || ec != std::errc() || stop != end)
          return "expected a whole number from 0 to " +
                 std::to_string(std::numeric_limits<std::uint64_t>::max()) + ", found " + text;
        text = std::to_string(value);  // decimal, for strtoull's base 0
        return "";
      },
      "");
}

void check_train_flags(const CLI::App& cmd, const TrainOptions& o, bool outputs) {
  for (const TrainFlag& row : train_flags()) {
    if (cmd.get_option(row.key.flag)->count() == 0) continue;
    std::string problem;
    const Type type = row.key.type;
    if (type == Type::kInteger || type == Type::kFloat)
      problem = config::number_problem(row.key, row.number(o), row.text(o));
    if (type == Type::kDir || type == Type::kFileIn || (type == Type::kFileOut && outputs))
      if (const std::string path = row.text(o); !path.empty())  // "" leaves an output off
        problem = config::path_problem(row.key, path);
    if (!problem.empty()) throw InputError(row.key.flag + ": " + problem);
  }
}

std::vector<std::string> with_config_flags(std::vector<std::string> args, const Loaders& loaders,
                                           bool outputs) {
  if (args.size() < 2 || args[1] != "train") return args;
  std::vector<std::string> paths, given;
  for (std::size_t i = 2; i < args.size(); ++i) {
    if (args[i] == "--config" && i + 1 < args.size()) paths.push_back(args[i + 1]);
    if (args[i].rfind("--config=", 0) == 0) paths.push_back(args[i].substr(9));
    if (args[i].rfind("--", 0) == 0) given.push_back(args[i].substr(0, args[i].find('=')));
  }
  if (paths.size() > 1)
    throw InputError("--config: expected one job file, found " + std::to_string(paths.size()) +
                     " ('" + paths[0] + "', '" + paths[1] + "'" +
                     (paths.size() > 2 ? ", ..." : "") +
                     "): flags override a file's keys, not another file's");
  if (paths.empty() || paths[0].empty()) return args;
  config::Schema schema = train_schema();
  for (config::Key& k : schema) {
    k.replaced = std::find(given.begin(), given.end(), k.flag) != given.end();
    if (!outputs && k.type == config::Type::kFileOut) k.type = config::Type::kString;
  }
  const std::vector<std::string> flags = loaders.config(paths[0], schema);
  args.insert(args.begin() + 2, flags.begin(), flags.end());
  return args;
}

}  // namespace cohort::cli
