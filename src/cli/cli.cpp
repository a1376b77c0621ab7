// The `cohort` executable's one entry (run) and the dry-run entry (check_train): the CLI11 app
// with its three commands, the config file expanded into flags, and every failure mapped to an
// exit code. Not the commands (commands.hpp) and not the option table (options.hpp).
#include "cohort/cli/cli.hpp"
#include "cohort/cli/session.hpp"

#include <CLI/CLI.hpp>

#include <charconv>
#include <filesystem>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "agreement.hpp"
#include "cohort/core/atomic_file.hpp"
#include "cohort/core/cpu.hpp"
#include "cohort/core/error.hpp"
#include "cohort/dist/comm.hpp"
#include "commands.hpp"
#include "launch.hpp"
#include "options.hpp"
#include "output.hpp"

namespace cohort::cli {

namespace {

// The files `cohort train` writes, apart from what it reads and from each other (on the rank
// that writes them): --save (and its --keep copies), --summary, --metrics (a stream) and --trace
// against --config, the data and --resume, whose file --save may name (it continues the run).
void check_train_outputs(const TrainOptions& train) {
  const auto& ck = train.checkpoint;
  const std::vector<NamedPath> others{{"--summary", train.summary_path},
                                      {"--metrics", train.metrics_path, true},
                                      {"--trace", train.trace_path}};
  std::vector<NamedPath> outputs{{"--save", ck.save}};
  outputs.insert(outputs.end(), others.begin(), others.end());
  check_outputs_apart(outputs, {{"--config", train.config_path}}, train.data_dir);
  // --save's older copies are the run's too, but not apart from --save: a save interrupted
  // between its hard link and its rename leaves FILE and FILE.1 one file, and a restart resumes.
  std::vector<NamedPath> kept{{"--resume", ck.resume == kResumeAuto ? "" : ck.resume}};
  if (!ck.save.empty() && ck.keep > 1) {
    std::string target;
    try {
      target = output_target(ck.save).string();
    } catch (const OutputError&) {  // check_train_flags named it
    }
    for (std::size_t k = 1; k < ck.keep && !target.empty(); ++k)
      kept.push_back({"--save", target + "." + std::to_string(k), false, "--save's copy (--keep)"});
  }
  check_outputs_apart(others, kept);
}

// kCheckTrain: only `train` exists and it is a dry run whatever the flags say.
enum class Mode { kRun, kCheckTrain };

// A command line CLI11 refuses: printed as "cohort: <CLI11's message>", exit 2.
class UsageError : public InputError {
 public:
  using InputError::InputError;
};

// Parses `args` (argv[0] first); an exit code when parsing ends the run (help, version). Throws
// UsageError.
std::optional<int> parse(CLI::App& app, const std::vector<std::string>& args, std::ostream& out) {
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
    throw UsageError(e.what());
  }
  return std::nullopt;
}

// Several ranks: rank 0 alone prints what every rank would print alike (help, parse errors,
// progress) and, for `cohort train`, the agreement's refusal on behalf of every rank
// (agreement.hpp); other ranks print only their own failures after it.
int run_args(std::vector<std::string> args, std::ostream& all_out, std::ostream& all_err,
             const Loaders& loaders, Mode mode, dist::Comm& comm) {
  std::ostream null_stream(nullptr);
  std::ostream& out = comm.rank() == 0 ? all_out : null_stream;
  std::ostream& err = comm.rank() == 0 ? all_err : null_stream;
  // Several ranks of `cohort train`: a rank that fails before train_command's agreement joins it
  // (refuse_train), so that no rank waits for one that has given up.
  const bool job = comm.size() > 1 && args.size() > 1 && args[1] == "train";
  bool agreeing = false;  // in train_command, which agrees by itself
  auto refused = [&err](const std::vector<std::string>& lines) {
    for (const std::string& line : lines) err << "cohort: error: " << line << "\n";
    return kExitBadInput;
  };
  try {
    args = with_config_flags(std::move(args), loaders, /*outputs=*/comm.rank() == 0);
    CLI::App app{"cohort: synchronous data-parallel neural-network training on one CPU machine",
                 "cohort"};
    app.require_subcommand(1);
    app.set_version_flag("--version", version_text());
    TrainOptions train;
    EvalOptions eval;
    PlotOptions plot;
    ExportOptions exp;
    LaunchOptions launch;
    SampleOptions sample;
    CLI::App* train_cmd = add_train_command(app, train);
    CLI::App* eval_cmd = mode == Mode::kRun ? add_eval_command(app, eval) : nullptr;
    CLI::App* plot_cmd = mode == Mode::kRun ? add_plot_command(app, plot) : nullptr;
    CLI::App* export_cmd = mode == Mode::kRun ? add_export_command(app, exp) : nullptr;
    CLI::App* launch_cmd = mode == Mode::kRun ? add_launch_command(app, launch) : nullptr;
    CLI::App* sample_cmd = mode == Mode::kRun ? add_sample_command(app, sample) : nullptr;
    if (const std::optional<int> code = parse(app, args, out)) return *code;
    if (train_cmd->parsed()) {
      train.model_given = train_cmd->count("--model") > 0;
      check_train_flags(*train_cmd, train, /*outputs=*/comm.rank() == 0);
      if (comm.rank() == 0) check_train_outputs(train);
      if (mode == Mode::kCheckTrain) train.dry_run = true;
      agreeing = true;
      return train_command(train, loaders, out, err, comm);
    }
    if (eval_cmd && eval_cmd->parsed()) return eval_command(eval, out);
    if (plot_cmd && plot_cmd->parsed()) return plot_command(plot, out);
    if (export_cmd && export_cmd->parsed()) return export_command(exp, out);
    if (launch_cmd && launch_cmd->parsed()) return launch_command(launch, loaders, err);
    if (sample_cmd && sample_cmd->parsed()) return sample_command(sample, out, err);
    return kExitBadInput;
  } catch (const JobInputError& e) {
    return refused(e.lines());
  } catch (const UsageError& e) {
    if (job && !agreeing) return refused(refuse_train(e.what(), comm));
    err << "cohort: " << e.what() << "\n";
    return kExitBadInput;
  } catch (const InputError& e) {
    if (job && !agreeing) return refused(refuse_train(e.what(), comm));
    err << "cohort: error: " << e.what() << "\n";
    return kExitBadInput;
  } catch (const OutputError& e) {
    err << "cohort: error: " << e.what() << "\n";
    return kExitWriteFailed;
  } catch (const std::exception& e) {
    if (job && !agreeing)
      return refused(refuse_train(std::string("internal error: ") + e.what(), comm));
    all_err << "cohort: "
            << (comm.size() > 1 ? "rank " + std::to_string(comm.rank()) + ": " : std::string())
            << "internal error: " << e.what() << "\n";
    return kExitInternal;
  }
}

}  // namespace

Loaders disk_loaders() {
  return {
      // A TOML job file, or a run's summary (or its effective config) in JSON.
      .config =
          [](const std::string& path, const config::Schema& schema) {
            if (std::filesystem::path(path).extension() == ".json")
              return config::job_config_flags_from_text(effective_config_toml(path),
                                                        path + " (as TOML)", schema);
            return config::job_config_flags(path, schema);
          },
      .data = [](const std::string& dir,
                 std::size_t text_block) -> std::shared_ptr<const data::Splits> {
        return std::make_shared<const data::Splits>(data::load_data_folder(dir, 10, text_block));
      },
      .checkpoint = [](const std::string& path) { return checkpoint::load_checkpoint(path); },
  };
}

int run(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  std::unique_ptr<dist::Comm> world;
  try {
    (void)cpu_features();                   // COHORT_MAX_CPU_ISA is checked before anything else
    world = dist::world(nullptr, nullptr);  // MPI takes no flags of ours
  } catch (const InputError& e) {
    err << "cohort: error: " << e.what() << "\n";
    return kExitBadInput;
  } catch (const std::exception& e) {
    err << "cohort: internal error: " << e.what() << "\n";
    return kExitInternal;
  }
  return run_args(std::vector<std::string>(argv, argv + argc), out, err, disk_loaders(), Mode::kRun,
                  *world);
}

TrainOutcome train(const std::vector<std::string>& args, const Loaders& loaders,
                   const TrainHooks& hooks, std::ostream& out, std::ostream& err) {
  std::vector<std::string> all{"cohort", "train"};
  all.insert(all.end(), args.begin(), args.end());
  all = with_config_flags(std::move(all), loaders);
  CLI::App app{"cohort train", "cohort"};
  app.require_subcommand(1);
  TrainOptions options;
  CLI::App* cmd = add_train_command(app, options);
  TrainOutcome outcome;
  if (parse(app, all, out)) return outcome;  // --help
  options.model_given = cmd->count("--model") > 0;
  check_train_flags(*cmd, options);
  if (!hooks.data_name.empty()) options.data_dir = hooks.data_name;
  check_train_outputs(options);
  const std::unique_ptr<dist::Comm> one = dist::local_comm();
  train_command(options, loaders, out, err, *one, hooks, &outcome);
  return outcome;
}

std::string sample(const SampleRequest& request) {
  // Through the command's own options, so that their checks (temperature, top-k) hold here too.
  auto shortest = [](double x) {  // the text that reads back as x
    char text[32];
    return std::string(text, std::to_chars(text, text + sizeof text, x).ptr);
  };
  std::vector<std::string> args{"cohort",        "sample",
                                "--checkpoint",  request.checkpoint,
                                "--prompt",      request.prompt,
                                "--tokens",      std::to_string(request.tokens),
                                "--temperature", shortest(request.temperature),
                                "--top-k",       std::to_string(request.top_k),
                                "--seed",        std::to_string(request.seed),
                                "--quiet"};
  if (!request.tokenizer.empty()) args.insert(args.end(), {"--tokenizer", request.tokenizer});
  CLI::App app{"cohort sample", "cohort"};
  app.require_subcommand(1);
  SampleOptions options;
  add_sample_command(app, options);
  std::ostringstream out, err;
  if (parse(app, args, out)) return out.str();
  sample_command(options, out, err);
  return out.str();
}

int check_train(const std::vector<std::string>& args, std::ostream& out, std::ostream& err,
                const Loaders& loaders) {
  std::vector<std::string> all{"cohort", "train"};
  all.insert(all.end(), args.begin(), args.end());
  const std::unique_ptr<dist::Comm> one = dist::local_comm();
  return run_args(std::move(all), out, err, loaders, Mode::kCheckTrain, *one);
}

}  // namespace cohort::cli
