// The job-config reader against a schema of its own (the real one, cli's option table, is tested
// in tests/cli): flags by section and key name, and refusals that name file:line:column, the key,
// what was expected and what was found.
#include "cohort/config/job_config.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cohort/core/error.hpp"

namespace cohort::config {
namespace job_config_test {

const Schema& schema() {
  static const Schema keys = {
      {.flag = "--size", .toml = "run.size", .type = Type::kInteger, .range = {1, 100}},
      {.flag = "--rate",
       .toml = "run.rate",
       .type = Type::kFloat,
       .range = {.min = 0, .max = 1, .min_exclusive = true}},
      {.flag = "--fast", .toml = "run.fast", .type = Type::kBool},
      {.flag = "--colour",
       .toml = "look.colour",
       .type = Type::kChoice,
       .choices = {"red", "green", "blue"}},
      {.flag = "--in", .toml = "look.folder", .type = Type::kDir},
  };
  return keys;
}

// The message of the InputError that reading `text` throws ("" if none).
std::string refusal(const std::string& text) {
  try {
    job_config_flags_from_text(text, "job.toml", schema());
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(JobConfig, KeysBecomeTheirFlagsInNameOrder) {
  const auto flags = job_config_flags_from_text(
      "[look]\ncolour = \"green\"\nfolder = \"/\"\n[run]\nfast = true\nsize = 7\nrate = 0.25\n",
      "job.toml", schema());
  EXPECT_EQ(flags, (std::vector<std::string>{"--colour", "green", "--in", "/", "--fast=true",
                                             "--rate", "0.25", "--size", "7"}));
}

// A key whose flag the command line gives is replaced before anything checks it: its value, even
// one the schema refuses, is neither checked nor returned; an unknown key is still refused.
TEST(JobConfig, AReplacedKeyIsNeitherCheckedNorReturned) {
  Schema keys = schema();
  keys[0].replaced = true;  // --size
  keys[4].replaced = true;  // --in
  const auto flags = job_config_flags_from_text(
      "[run]\nsize = 0\nfast = true\n[look]\nfolder = \"/nonexistent\"\n", "job.toml", keys);
  EXPECT_EQ(flags, (std::vector<std::string>{"--fast=true"}));
  EXPECT_THROW(job_config_flags_from_text("[run]\nsize = 3\nspeed = 1\n", "job.toml", keys),
               InputError);
}

TEST(JobConfig, RefusalsNameThePlaceTheKeyAndWhatWasFound) {
  EXPECT_EQ(refusal("[run]\nsize = 0\n"),
            "job.toml:2:8: run.size: expected an integer >= 1 and <= 100, found 0");
  EXPECT_EQ(refusal("[run]\nrate = 0.0\n"),
            "job.toml:2:8: run.rate: expected a number > 0 and <= 1, found 0");
  EXPECT_EQ(refusal("[run]\nsize = 2.5\n"),
            "job.toml:2:8: run.size: expected an integer, found "
            "floating-point");
  EXPECT_EQ(refusal("[look]\ncolour = \"pink\"\n"),
            "job.toml:2:10: look.colour: expected red, green or blue, found 'pink'");
  EXPECT_EQ(refusal("[look]\nfolder = \"/nonexistent\"\n"),
            "job.toml:2:10: look.folder: expected an existing folder, found '/nonexistent', "
            "which is not a folder");
  EXPECT_EQ(refusal("size = 3\n"),
            "job.toml:1:8: 'size': expected a [section] (run, look), found a value");
  EXPECT_EQ(refusal("[run]\nspeed = 3\n"),
            "job.toml:2:9: unknown key 'run.speed' (known keys: run.size, run.rate, run.fast, "
            "look.colour, look.folder)");
}

TEST(JobConfig, CommandLineChecksAreTheReadersOwn) {
  const Key& size = schema()[0];
  EXPECT_EQ(number_problem(size, 50, "50"), "");
  EXPECT_EQ(number_problem(size, 101, "101"), "expected an integer >= 1 and <= 100, found 101");
  EXPECT_NE(number_problem(size, std::nan(""), "nan"), "");
  EXPECT_EQ(path_problem(Type::kDir, "/"), "");
  EXPECT_EQ(path_problem(Type::kFileOut, "/"),
            "expected a file path in a writable folder, "
            "found '/', which is a directory");
  // Missing folders are created before the first write; the nearest existing one must be a
  // folder.
  EXPECT_EQ(path_problem(Type::kFileOut, "/nonexistent/runs/x.json"), "");
  EXPECT_EQ(path_problem(Type::kFileOut, "x.json"), "");
  const std::filesystem::path file =
      std::filesystem::temp_directory_path() / "cohort_job_config_test_file";
  { std::ofstream(file) << "x"; }
  EXPECT_EQ(path_problem(Type::kFileOut, (file / "runs" / "x.json").string()),
            "expected a file path in a writable folder, found '" +
                (file / "runs" / "x.json").string() + "' (" + file.string() + " is not a folder)");
  std::filesystem::remove(file);
  EXPECT_EQ(path_problem(Type::kFileIn, "/"),
            "expected an existing file, found '/', which is not a file");
}

}  // namespace job_config_test
}  // namespace cohort::config
