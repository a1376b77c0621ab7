// NumPy .npy reader: the files `numpy.save` writes (format 1.0 and 2.0), header parsed by a small
// strict parser of the Python dict literal (never evaluated), every field checked before a byte
// of payload is trusted. Features: uint8 or float32; labels: any little-endian integer width.
// Not a general array loader: no .npz, no pickled objects, no Fortran order, no big-endian.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "cohort/data/dataset.hpp"

namespace cohort::data {

struct NpyLimits {
  std::uint64_t max_dim = std::uint64_t{1} << 31;      // any one dimension
  std::uint64_t max_payload = std::uint64_t{1} << 34;  // bytes, all dimensions and the item size
};

// The parsed header: what the dict said, and where the payload starts.
struct NpyHeader {
  char kind = 0;              // 'u' unsigned, 'i' signed, 'f' float (from descr)
  std::size_t item_size = 0;  // bytes per element (from descr)
  std::vector<std::uint64_t> shape;
  std::size_t payload_offset = 0;   // 10 + header length (1.0) or 12 + header length (2.0)
  std::uint64_t payload_bytes = 0;  // product of shape * item_size, overflow-checked
};

// Parses and checks the preamble and header of `bytes`; `source` names the file in messages.
// Checks: magic, version 1.0 or 2.0, header length within the file, the dict (exactly the keys
// descr, fortran_order, shape; nothing after it but spaces and one newline), a little-endian or
// byte-order-free integer or float descr, fortran_order False, a shape tuple of non-negative
// integers within limits whose byte size does not overflow, and that the payload is exactly the
// rest of the file. Throws InputError "source: field: expected ..., found ...".
NpyHeader parse_npy_header(std::span<const std::uint8_t> bytes, const std::string& source,
                           const NpyLimits& limits = {});

// An array in memory as a .npy file holds one: its dtype (kind and item size), its shape (C order)
// and its little-endian payload. What the reader makes of a file's header and bytes, and what the
// Python module makes of a NumPy array (its buffer, used in place). `source` names the file or
// argument in messages, `dtype_field` and `shape_field` its dtype and shape.
struct ArrayView {
  char kind = 0;  // 'u', 'i' or 'f'
  std::size_t item_size = 0;
  std::vector<std::uint64_t> shape;
  std::span<const std::uint8_t> payload;  // exactly the shape's elements times item_size bytes
  std::string source;
  std::string dtype_field = "header 'descr'", shape_field = "header 'shape'";
};

// The array a .npy file's bytes hold, its header checked (parse_npy_header); views `bytes`.
ArrayView npy_array(std::span<const std::uint8_t> bytes, const std::string& source,
                    const NpyLimits& limits = {});

// One split from features `x` and labels `y`, checked as read_npy_split describes.
Dataset split_of_arrays(const ArrayView& x, const ArrayView& y, std::string name);

// The train and test splits of four arrays, checked as load_npy_folder's files are.
Splits splits_of_arrays(const ArrayView& x_train, const ArrayView& y_train, const ArrayView& x_test,
                        const ArrayView& y_test);

// One split from the bytes of an X file and a y file (already in memory, which is what the
// fuzzer drives): X is (N, features), (N, H, W) or (N, C, H, W), uint8 or float32, every float
// finite, N >= 1 and every other dimension >= 1; y is (N,) of any integer type, every label in
// [0, kMaxClasses). num_classes is set to the largest label + 1 (load_npy_folder then widens it
// over both splits).
Dataset read_npy_split(std::span<const std::uint8_t> x_bytes, const std::string& x_source,
                       std::span<const std::uint8_t> y_bytes, const std::string& y_source,
                       std::string name, const NpyLimits& limits = {});

// train_x.npy, train_y.npy, test_x.npy, test_y.npy in `dir`; the splits must agree on the
// sample shape and dtype kind; num_classes = largest label of both + 1.
Splits load_npy_folder(const std::filesystem::path& dir, const NpyLimits& limits = {});

}  // namespace cohort::data
