// libFuzzer target: the checkpoint decoder on arbitrary bytes. Any outcome but InputError or a
// checkpoint that encodes back to the same bytes is a finding.
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "cohort/checkpoint/checkpoint.hpp"
#include "cohort/core/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::vector<std::uint8_t> bytes(data, data + size);
  try {
    const auto c = cohort::checkpoint::decode_checkpoint(bytes, "fuzz");
    // What decodes must be exactly what encoding it gives back (no silently ignored bytes),
    // up to the order of META's fields, which decoding does not keep: re-decode and compare.
    const auto again = cohort::checkpoint::decode_checkpoint(
        cohort::checkpoint::encode_checkpoint(c), "fuzz-again");
    if (again.weights != c.weights || again.state != c.state || again.step != c.step ||
        again.updates != c.updates || again.skipped != c.skipped ||
        again.optimizer != c.optimizer || again.model != c.model)
      std::abort();
  } catch (const cohort::InputError&) {
  }
  return 0;
}
