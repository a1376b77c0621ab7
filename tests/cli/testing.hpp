// Helpers of the cli tests: run `cohort <args>` in-process and keep its exit code and output, a
// fresh temporary folder per test, and the fixture Cli with the arguments of a short run. Not a
// test of anything by itself.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "cohort/cli/cli.hpp"

namespace cohort::cli::testing {

struct Result {
  int code;
  std::string out, err;
};

inline Result cohort(std::vector<std::string> args) {
  args.insert(args.begin(), "cohort");
  std::vector<const char*> argv;
  for (auto& a : args) argv.push_back(a.c_str());
  std::ostringstream out, err;
  const int code = run(static_cast<int>(argv.size()), argv.data(), out, err);
  return {code, out.str(), err.str()};
}

// A test with its own empty folder dir_, named after the test, removed afterwards.
class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    for (char& c : name)
      if (c == '/') c = '_';  // parameterised tests: Suite/Name/Param
    dir_ = std::filesystem::temp_directory_path() /
           ("cohort_cli_test_" + name + "_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

// The fixture of cli_test.cpp and cli_process_test.cpp, one class for both (gtest refuses a
// suite whose tests have different fixtures): quick() is a 12-step run on the fixture data with
// `extra` after it.
class Cli : public TempDirTest {
 protected:
  std::vector<std::string> quick(std::vector<std::string> extra = {}) {
    std::vector<std::string> a{"train",   "--data", COHORT_FIXTURE_DIR, "--model", "mlp:784-32-10",
                               "--batch", "64",     "--steps",          "12",      "--workers",
                               "2"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  // A copy of the fixture data (datasets/fixture) in dir_/name, for tests that change it.
  std::filesystem::path fixture_copy(const std::string& name = "data") {
    const std::filesystem::path data = dir_ / name;
    std::filesystem::create_directories(data);
    for (const auto& f : std::filesystem::directory_iterator(COHORT_FIXTURE_DIR))
      std::filesystem::copy_file(f.path(), data / f.path().filename());
    return data;
  }
};

}  // namespace cohort::cli::testing
