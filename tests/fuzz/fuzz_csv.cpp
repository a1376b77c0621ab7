// libFuzzer target: the CSV reader on arbitrary bytes through its in-memory entry point, under
// small limits. Any outcome but a consistent dataset or an InputError naming the file is a
// finding (crash, sanitizer report, other exception, unnamed error).
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "cohort/core/error.hpp"
#include "cohort/data/csv.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const auto set = cohort::data::read_csv_split(
        text, "in.csv", "train", {.max_features = 1u << 12, .max_values = 1u << 20});
    if (set.count == 0 || set.labels.size() != set.count || set.cols == 0 ||
        set.float_features.size() != set.count * set.features() || set.num_classes == 0 ||
        set.num_classes > cohort::data::kMaxClasses)
      std::abort();  // accepted an inconsistent dataset
  } catch (const cohort::InputError& e) {
    if (std::string(e.what()).rfind("in.csv", 0) != 0) std::abort();
  }
  return 0;
}
