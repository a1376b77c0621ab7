// The option table of `cohort train`: every TOML key reaches its flag's field, every range is
// enforced on the command line naming the flag, and README's flag table is --help's.
#include "options.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "output.hpp"
#include "testing.hpp"

namespace cohort::cli {

// gtest prints a row as its flag, not as bytes.
void PrintTo(const TrainFlag& row, std::ostream* os) { *os << row.key.flag; }

namespace options_test {

namespace fs = std::filesystem;
using config::Type;
using testing::cohort;
using testing::Result;

// Parses `flags` as `cohort train <flags>` into fresh options, with the table's own checks.
TrainOptions parsed(const std::vector<std::string>& flags) {
  TrainOptions o;
  CLI::App app;
  CLI::App* cmd = add_train_command(app, o);
  std::vector<std::string> args{"cohort", "train"};
  args.insert(args.end(), flags.begin(), flags.end());
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  app.parse(static_cast<int>(argv.size()), argv.data());
  check_train_flags(*cmd, o);
  return o;
}

// A readable test name from a row: "run_micro_batch", or "dry_run" for a flag without a key.
std::string row_name(const TrainFlag& row) {
  std::string name = row.key.toml.empty() ? row.key.flag.substr(2) : row.key.toml;
  for (char& c : name)
    if (c == '.' || c == '-') c = '_';
  return name;
}
struct RowName {
  std::string operator()(const ::testing::TestParamInfo<TrainFlag>& info) const {
    return row_name(info.param);
  }
};

std::vector<TrainFlag> rows_where(bool (*keep)(const TrainFlag&)) {
  std::vector<TrainFlag> rows;
  std::copy_if(train_flags().begin(), train_flags().end(), std::back_inserter(rows), keep);
  return rows;
}

// A value for the key's TOML file that its type and range accept and that differs from the
// command's default, as TOML text.
std::string toml_value(const TrainFlag& row, const fs::path& dir) {
  const TrainOptions defaults;
  const config::Range& r = row.key.range;
  switch (row.key.type) {
    case Type::kInteger: {
      double v = r.min_exclusive ? r.min + 1 : r.min;
      if (v == row.number(defaults)) v += 1;
      return std::to_string(static_cast<long long>(v));
    }
    case Type::kFloat: {
      double v = r.max < config::kNoMax ? (r.min + r.max) / 2 : r.min + 1;
      if (v == row.number(defaults)) v = (v + r.max) / 2;
      std::ostringstream s;
      s.precision(17);
      s << std::showpoint << v;
      return s.str();
    }
    case Type::kBool:
      return row.text(defaults) == "true" ? "false" : "true";
    case Type::kChoice:
      for (const std::string& c : row.key.choices)
        if (c != row.text(defaults)) return "\"" + c + "\"";
      break;
    case Type::kString:
      return "\"mlp:784-10\"";
    case Type::kDir:
      return "\"" + std::string(COHORT_FIXTURE_DIR) + "\"";
    case Type::kFileIn:
      return "\"" + std::string(COHORT_README) + "\"";
    case Type::kFileOut:
      return "\"" + (dir / "out.file").string() + "\"";
  }
  ADD_FAILURE() << row.key.flag << ": no value differs from the default";
  return "";
}

class TomlKey : public testing::TempDirTest, public ::testing::WithParamInterface<TrainFlag> {};

// A config holding the key produces the row's flag, and parsing that flag stores the value in
// the row's field (so a key bound to the wrong flag, or a flag to the wrong field, fails).
TEST_P(TomlKey, ReachesItsFlagsField) {
  const TrainFlag& row = GetParam();
  const std::string section = row.key.toml.substr(0, row.key.toml.find('.'));
  const std::string key = row.key.toml.substr(section.size() + 1);
  const std::string value = toml_value(row, dir_);
  const std::string text = "[" + section + "]\n" + key + " = " + value + "\n";
  const auto flags = config::job_config_flags_from_text(text, "job.toml", train_schema());
  ASSERT_FALSE(flags.empty()) << text;
  EXPECT_EQ(flags[0].substr(0, flags[0].find('=')), row.key.flag) << text;
  const TrainOptions o = parsed(flags), defaults;
  EXPECT_NE(row.text(o), row.text(defaults)) << text << "did not change " << row.key.flag;
  if (row.key.type == Type::kInteger || row.key.type == Type::kFloat) {
    EXPECT_NEAR(row.number(o), std::stod(value), 1e-6 * std::abs(std::stod(value)));
  } else if (row.key.type != Type::kBool) {
    EXPECT_EQ("\"" + row.text(o) + "\"", value);
  }
}

INSTANTIATE_TEST_SUITE_P(CliOptions, TomlKey,
                         ::testing::ValuesIn(rows_where([](const TrainFlag& r) {
                           return !r.key.toml.empty();
                         })),
                         RowName());

// Just outside the row's range, as the command line writes it; "" for a row without a range,
// or none that a value of the flag's type can cross (the seed: any uint64).
std::string outside(const TrainFlag& row) {
  const config::Range& r = row.key.range;
  const bool integer = row.key.type == Type::kInteger;
  auto text = [&](double v) {
    std::ostringstream s;
    s.precision(17);
    s << v;
    return s.str();
  };
  if (r.min_exclusive) return text(r.min);
  if (r.min > 0) return text(integer ? r.min - 1 : r.min / 2);
  if (r.max_exclusive) return text(r.max);
  if (r.max < config::kNoMax) return text(integer ? r.max + 1 : r.max * 2);
  return "";
}

class RangedFlag : public testing::TempDirTest, public ::testing::WithParamInterface<TrainFlag> {};

TEST_P(RangedFlag, OutOfRangeOnTheCommandLineExitsTwoNamingIt) {
  const TrainFlag& row = GetParam();
  const std::string value = outside(row);
  Result r = cohort({"train", "--data", COHORT_FIXTURE_DIR, row.key.flag, value, "--dry-run"});
  EXPECT_EQ(r.code, kExitBadInput) << row.key.flag << " " << value;
  EXPECT_EQ(r.err.rfind("cohort: error: " + row.key.flag + ": expected ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find(", found "), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
}

INSTANTIATE_TEST_SUITE_P(CliOptions, RangedFlag,
                         ::testing::ValuesIn(rows_where([](const TrainFlag& r) {
                           return !outside(r).empty();
                         })),
                         RowName());

// CLI11 2.1 reads unsigned options with strtoull: "-1" would wrap to 2^64 - 1 and a number past
// that saturate. Every integer flag refuses both (exit 2 naming it); "010" is ten, not octal.
class IntegerFlag : public testing::TempDirTest, public ::testing::WithParamInterface<TrainFlag> {};

TEST_P(IntegerFlag, RefusesANegativeOrTooLargeValueNamingIt) {
  const TrainFlag& row = GetParam();
  for (const std::string value : {"-1", "18446744073709551616", "0x10"}) {
    Result r = cohort({"train", "--data", COHORT_FIXTURE_DIR, row.key.flag, value, "--dry-run"});
    EXPECT_EQ(r.code, kExitBadInput) << row.key.flag << " " << value;
    EXPECT_NE(r.err.find(row.key.flag + ": expected a whole number"), std::string::npos) << r.err;
    EXPECT_EQ(r.out, "");
  }
}

INSTANTIATE_TEST_SUITE_P(CliOptions, IntegerFlag,
                         ::testing::ValuesIn(rows_where([](const TrainFlag& r) {
                           return r.key.type == Type::kInteger;
                         })),
                         RowName());

TEST(CliOptions, UnsignedValuesAreDecimal) {
  Result r = cohort({"train", "--data", COHORT_FIXTURE_DIR, "--seed", "010", "--dry-run"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_NE(r.out.find(" seed=10 "), std::string::npos) << r.out;
  for (const char* flag : {"--seed", "--tokens", "--top-k"}) {
    r = cohort({"sample", "--checkpoint", "unread.ckpt", flag, "-1"});
    EXPECT_EQ(r.code, kExitBadInput) << flag;
    EXPECT_NE(r.err.find(std::string(flag) + ": expected a whole number"), std::string::npos)
        << r.err;
  }
}

TEST(CliOptions, FlagsAndKeysAreUnique) {
  std::set<std::string> flags, keys;
  for (const TrainFlag& row : train_flags()) {
    EXPECT_TRUE(flags.insert(row.key.flag).second) << row.key.flag;
    if (!row.key.toml.empty()) {
      EXPECT_TRUE(keys.insert(row.key.toml).second) << row.key.toml;
    }
  }
  EXPECT_EQ(keys.size(), train_schema().size());
}

// The reducer's help says which strategies are reproducible, from reduce::is_deterministic.
TEST(CliOptions, ReducerHelpNamesTheReproducibleStrategies) {
  const std::string help = cohort({"train", "--help"}).out;
  EXPECT_NE(help.find("tree, chunk_owner, parameter_server and serial give bitwise the same"),
            std::string::npos)
      << help;
  EXPECT_NE(help.find("atomic and mutex add leaves in arrival order"), std::string::npos) << help;
}

// --help lists the flags under their TOML section's heading: each row's flag appears after its
// group's heading and before the next heading.
TEST(CliOptions, HelpGroupsTheFlagsBySection) {
  const std::string help = cohort({"train", "--help"}).out;
  const std::vector<std::string> groups{"Data", "Model",  "Optimizer", "Schedule",
                                        "Run",  "Output", "Checkpoint"};
  for (const std::string& group : groups)
    EXPECT_NE(help.find("\n" + group + ":\n"), std::string::npos) << group << help;
  for (const TrainFlag& row : train_flags()) {
    const std::size_t heading = help.find("\n" + flag_group(row) + ":\n");
    ASSERT_NE(heading, std::string::npos) << row.key.flag;
    std::size_t next = std::string::npos;  // the next group's heading
    for (const std::string& group : groups)
      if (const std::size_t h = help.find("\n" + group + ":\n"); h > heading)
        next = std::min(next, h);
    const std::size_t at = help.find("  " + row.key.flag + " ", heading);
    EXPECT_LT(at, next) << row.key.flag << " is not under " << flag_group(row) << "\n" << help;
  }
  EXPECT_EQ(flag_group(train_flags().front()), "Run");  // --config: command line only
}

// The flags of `cohort train --help`: the first word of each option line ("-h,--help" gives
// --help, which CLI11 adds and the README does not list).
std::set<std::string> help_flags() {
  std::istringstream help(cohort({"train", "--help"}).out);
  std::set<std::string> flags;
  const std::regex option_line(R"(^\s+(?:-\w,)?(--[a-z][a-z0-9-]*))");
  std::smatch m;
  for (std::string line; std::getline(help, line);)
    if (std::regex_search(line, m, option_line) && m[1] != "--help") flags.insert(m[1]);
  return flags;
}

// Every --flag in a block of README.md: from the first line that holds `first` to the last of
// the lines after it that match `more`; `part` picks where in a line to look.
std::set<std::string> readme_flags(const std::string& first, const std::regex& more,
                                   std::string (*part)(const std::string&)) {
  std::ifstream readme(COHORT_README);
  EXPECT_TRUE(readme) << COHORT_README;
  std::set<std::string> flags;
  const std::regex flag(R"(--[a-z][a-z0-9-]*)");
  bool inside = false;
  for (std::string line; std::getline(readme, line);) {
    if (!inside && line.find(first) == std::string::npos) continue;
    if (inside && !std::regex_search(line, more)) break;
    inside = true;
    const std::string text = part(line);
    for (std::sregex_iterator it(text.begin(), text.end(), flag), end; it != end; ++it)
      flags.insert(it->str());
  }
  return flags;
}

std::string missing(const std::set<std::string>& a, const std::set<std::string>& b) {
  std::string text;
  for (const auto& f : a)
    if (!b.count(f)) text += " " + f;
  return text;
}

// One default recipe: a program that builds a TrainConfig and sets nothing trains as
// `cohort train` with no flags does (the effective config as the summary and checkpoints record
// it, before the machine's workers and micro-batch are resolved).
TEST(CliOptions, LibraryDefaultsAreTheCommandsDefaults) {
  const TrainOptions o = parsed({});
  const train::TrainConfig library{};
  EXPECT_EQ(config_json(o.train_config(), o.data_dir).dump(2),
            config_json(library, data::kDefaultDataDir).dump(2));
  EXPECT_EQ(o.train_config().eval_batch, library.eval_batch);
  EXPECT_EQ(o.train_config().allow_emulated_bf16, library.allow_emulated_bf16);
  // The recipe itself, so that a change to it is a decision and not an accident.
  EXPECT_EQ(library.optimizer.kind, optim::Kind::kSgd);
  EXPECT_EQ(library.optimizer.lr, 0.1f);
  EXPECT_EQ(library.optimizer.momentum, 0.9f);
  EXPECT_EQ(library.schedule.kind, optim::ScheduleKind::kCosine);
  EXPECT_EQ(library.schedule.warmup_steps, 200u);
}

TEST(CliReadme, FlagTableIsTrainHelp) {
  // The table's first column, which may name several flags: "| `--lr`, `--momentum` | ...".
  const auto table =
      readme_flags("| flag | default | meaning |", std::regex(R"(^\|)"),
                   [](const std::string& line) { return line.substr(0, line.find('|', 1)); });
  const auto help = help_flags();
  ASSERT_GT(help.size(), 30u);
  EXPECT_EQ(missing(help, table), "") << "in --help, not in README's flag table";
  EXPECT_EQ(missing(table, help), "") << "in README's flag table, not in --help";
}

TEST(CliReadme, SynopsisIsTrainHelp) {
  // "cohort train [--config JOB.toml] [--data DIR] ...", continued on indented lines.
  const auto synopsis = readme_flags("cohort train [--config", std::regex(R"(^\s+\[)"),
                                     [](const std::string& line) { return line; });
  const auto help = help_flags();
  ASSERT_GT(help.size(), 30u);
  EXPECT_EQ(missing(help, synopsis), "") << "in --help, not in README's synopsis";
  EXPECT_EQ(missing(synopsis, help), "") << "in README's synopsis, not in --help";
}

}  // namespace options_test
}  // namespace cohort::cli
