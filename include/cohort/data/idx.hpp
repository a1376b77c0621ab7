// IDX reader (the format of MNIST and Fashion-MNIST), raw or gzip-compressed, with every field
// validated before a byte of payload is trusted. Only unsigned-byte payloads (type 0x08).
// Not a general tensor loader: no other element types, no writing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <vector>

namespace cohort::data {

struct IdxLimits {
  std::uint32_t max_dim = 1u << 24;                    // any one dimension
  std::uint64_t max_payload = std::uint64_t{1} << 32;  // bytes, all dimensions multiplied
};

struct IdxArray {
  std::vector<std::uint32_t> dims;   // e.g. (N, 28, 28) or (N)
  std::vector<std::uint8_t> values;  // row-major, product(dims) bytes
};

// Reads `path` (gzip detected by content, so a raw .gz-less file works too) and checks:
// it is a regular, non-empty file; magic bytes 0 0; type code 0x08; the number of dimensions is
// `expected_ndim`; each dimension is non-zero and <= max_dim; the product does not overflow and
// is <= max_payload; the payload fits in the file, checked before allocating (an uncompressed
// file: its size after the header; gzip: 1032 times the file's size, deflate's largest ratio,
// and a buffer grown only as the decompressed data arrives); the (decompressed) length equals
// header + payload exactly.
// Throws InputError naming the file, the field, the expected and the found value.
IdxArray read_idx(const std::filesystem::path& path, std::size_t expected_ndim,
                  const IdxLimits& limits = {});

}  // namespace cohort::data
