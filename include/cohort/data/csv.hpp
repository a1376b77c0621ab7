// CSV reader for tabular data: one sample per line, the integer label first, then numeric
// features, comma-separated; an optional header line (a first line with any non-numeric cell).
// A strict reader of our own rather than libcsv: the format is numbers only (no quoting, no
// embedded commas), and every error must name line and column, which we track anyway.
// Not a general CSV parser: no quotes, no other separators, no missing values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "cohort/data/dataset.hpp"

namespace cohort::data {

struct CsvLimits {
  std::size_t max_features = std::size_t{1} << 20;        // cells per line after the label
  std::uint64_t max_values = std::uint64_t{1} << 32;      // features of all samples
  std::uint64_t max_file_bytes = std::uint64_t{1} << 36;  // bytes read into memory
};

// One split from CSV text; `source` names the file in messages ("source:LINE: column C: ...").
// A UTF-8 byte-order mark at the start is skipped; a UTF-16 one is refused. The first line is a
// header (skipped) when any of its cells is not a number as std::from_chars reads a float (an
// empty cell included); a first line of numbers only is a sample.
// Lines end in "\n" or "\r\n"; the last may lack it. Every line has the same number of cells
// (>= 2); the label is a plain non-negative decimal integer below kMaxClasses; each feature a
// finite decimal float (std::from_chars: no leading '+', no spaces, no hex). No empty lines.
// Features are stored as float32 as given (no scaling): rows 1, cols = features, tabular.
// num_classes = largest label + 1 (load_csv_folder widens it over both splits).
Dataset read_csv_split(std::string_view text, const std::string& source, std::string name,
                       const CsvLimits& limits = {});

// train.csv and test.csv in `dir`; both must have the same number of features.
Splits load_csv_folder(const std::filesystem::path& dir, const CsvLimits& limits = {});

}  // namespace cohort::data
