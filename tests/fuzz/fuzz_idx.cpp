// libFuzzer target: the IDX reader on arbitrary bytes (raw or gzip), as images (3 dimensions)
// or labels (1), with small limits so huge headers are cheap. Any outcome but InputError or
// success is a finding (crash, sanitizer report, other exception).
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "cohort/core/error.hpp"
#include "cohort/data/idx.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // The reader takes a path: one scratch file per process, rewritten for every input.
  static const std::string path = "/tmp/cohort_fuzz_idx_" + std::to_string(::getpid());
  if (std::FILE* f = std::fopen(path.c_str(), "wb")) {
    if (size != 0) std::fwrite(data, 1, size, f);
    std::fclose(f);
  }
  for (std::size_t ndim : {1u, 3u}) {
    try {
      cohort::data::read_idx(path, ndim, {.max_dim = 1u << 16, .max_payload = 1u << 22});
    } catch (const cohort::InputError&) {
    }
  }
  return 0;
}
