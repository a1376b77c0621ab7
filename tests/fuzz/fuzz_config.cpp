// libFuzzer target: the job-config reader on arbitrary text, against the real schema of
// `cohort train` (cli's option table; so this target links the cli module and needs the engine).
// Any outcome but a list of flags or an InputError naming the source is a finding.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "cohort/cli/cli.hpp"
#include "cohort/config/job_config.hpp"
#include "cohort/core/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    for (const std::string& flag :
         cohort::config::job_config_flags_from_text(text, "fuzz.toml", cohort::cli::train_schema()))
      if (flag.empty()) std::abort();  // every flag and value is non-empty
  } catch (const cohort::InputError& e) {
    if (std::string_view(e.what()).rfind("fuzz.toml:", 0) != 0) std::abort();  // names the file
  }
  return 0;
}
