// libFuzzer target: the whole `cohort train` command line, checked as a dry run
// (cli::check_train): flags, table ranges, the config file, the data, the model against the
// data, train::validate, output paths, the checkpoint to resume. The outcome must be exit 0 or
// exit 2 with a message; anything else (exit 1, a crash, a sanitizer report) is a finding.
// Nothing trains and nothing is written; the loaders below read no file the input names.
//
// Input: argv tokens after `cohort train`, one per line; after the first NUL byte, the text of
// the config file that --config names (any path: the loader serves this text). Seeds:
// corpus/cli/, written from README's examples by make_cli_seeds.py; their relative paths
// (examples/, runs/) resolve when the fuzzer runs from the repository root, as scripts/test.sh
// runs it (elsewhere they are refused, exit 2, and the fuzzer still explores from them).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "cohort/cli/cli.hpp"
#include "cohort/config/job_config.hpp"
#include "cohort/nn/model.hpp"

namespace {

namespace cli = cohort::cli;

std::string config_text;  // this input's config file

// Cheap, bounded and read-only: the fixture, loaded once, stands for every data folder (the
// flag's path is still checked to be a folder); one small checkpoint, made here, for every file
// --resume names (the path is still checked to be a file); the input's own text for the config.
const cli::Loaders& fuzz_loaders() {
  static const cli::Loaders loaders = [] {
    const auto fixture = std::make_shared<const cohort::data::Splits>(
        cohort::data::load_image_folder(COHORT_FIXTURE_DIR));
    cohort::checkpoint::Checkpoint ck;
    ck.model = "mlp:784-16-10";
    ck.step = ck.updates = 3;
    ck.batch = 64;
    ck.micro_batch = 16;
    ck.train_count = fixture->train.count;
    ck.weights.assign(cohort::nn::Model::parse(ck.model).layout().total(), 0.5f);
    return cli::Loaders{
        .config =
            [](const std::string& path, const cohort::config::Schema& schema) {
              return cohort::config::job_config_flags_from_text(config_text, path, schema);
            },
        .data = [fixture](const std::string&, std::size_t) { return fixture; },
        .checkpoint = [ck](const std::string&) { return ck; },
    };
  }();
  return loaders;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const std::size_t nul = input.find('\0');
  config_text = nul == std::string_view::npos ? "" : std::string(input.substr(nul + 1));
  std::vector<std::string> args;
  std::string_view rest = input.substr(0, nul);
  while (!rest.empty()) {
    const std::size_t end = rest.find('\n');
    args.emplace_back(rest.substr(0, end));
    rest = end == std::string_view::npos ? std::string_view() : rest.substr(end + 1);
  }
  std::ostringstream out, err;
  const int code = cli::check_train(args, out, err, fuzz_loaders());
  const bool ok = (code == cli::kExitOk && err.str().empty()) ||
                  (code == cli::kExitBadInput && !err.str().empty());
  if (!ok) {
    std::fprintf(stderr, "exit %d\n%s", code, err.str().c_str());
    std::abort();
  }
  return 0;
}
