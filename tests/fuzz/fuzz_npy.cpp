// libFuzzer target: the .npy reader on arbitrary bytes through its in-memory entry point, as X
// (with a valid y of the length the header asks for, when that is small) and as y (with a valid
// X), under small limits so huge shapes are cheap. Any outcome but a dataset or an InputError
// naming the file is a finding (crash, sanitizer report, other exception, unnamed error).
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "cohort/core/error.hpp"
#include "cohort/data/npy.hpp"

namespace {

using cohort::data::NpyLimits;
using Bytes = std::vector<std::uint8_t>;

// A valid numpy 1.0 file: dict padded to 64 bytes, then the payload.
Bytes npy(const std::string& dict, const Bytes& payload) {
  std::string header = dict;
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  Bytes out = {0x93,
               'N',
               'U',
               'M',
               'P',
               'Y',
               1,
               0,
               static_cast<std::uint8_t>(header.size()),
               static_cast<std::uint8_t>(header.size() >> 8)};
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

void expect_dataset_or_named_error(std::span<const std::uint8_t> x,
                                   std::span<const std::uint8_t> y) {
  try {
    const auto set = cohort::data::read_npy_split(
        x, "x.npy", y, "y.npy", "train", NpyLimits{.max_dim = 1u << 16, .max_payload = 1u << 22});
    if (set.count == 0 || set.labels.size() != set.count ||
        set.images.size() + set.float_features.size() != set.count * set.features() ||
        set.num_classes == 0 || set.num_classes > cohort::data::kMaxClasses)
      std::abort();  // accepted an inconsistent dataset
  } catch (const cohort::InputError& e) {
    const std::string m = e.what();
    if (m.rfind("x.npy: ", 0) != 0 && m.rfind("y.npy: ", 0) != 0) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> bytes(data, size);
  static const Bytes kX =
      npy("{'descr': '|u1', 'fortran_order': False, 'shape': (2, 3), }", {1, 2, 3, 4, 5, 6});
  static const Bytes kY =
      npy("{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }", Bytes(16, 0));
  expect_dataset_or_named_error(bytes, kY);
  expect_dataset_or_named_error(kX, bytes);
  // As X with labels for however many samples its header announces (so the payload checks run
  // past the count check): the first dimension, if the header parses and it is small.
  try {
    const auto h = cohort::data::parse_npy_header(bytes, "x.npy",
                                                  {.max_dim = 1u << 16, .max_payload = 1u << 22});
    if (!h.shape.empty() && h.shape[0] <= 4096) {
      const std::string n = std::to_string(h.shape[0]);
      const Bytes y = npy("{'descr': '|u1', 'fortran_order': False, 'shape': (" + n + ",), }",
                          Bytes(h.shape[0], 1));
      expect_dataset_or_named_error(bytes, y);
    }
  } catch (const cohort::InputError& e) {
    if (std::string(e.what()).rfind("x.npy: ", 0) != 0) std::abort();
  }
  return 0;
}
