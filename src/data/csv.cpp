// CSV reader for tabular data: one pass over the text, line by line and cell by cell, each cell
// parsed in place with std::from_chars (exact, locale-free, correctly rounded to float32), the
// column count fixed by the first line. A UTF-8 byte-order mark before it is skipped. Errors
// name "file:line: column C".
#include "cohort/data/csv.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>

#include "cohort/core/error.hpp"
#include "printable.hpp"

namespace cohort::data {

namespace {

std::string quote_cell(std::string_view s) { return printable(s, 24); }

// Splits `line` at commas into `cells` (views into the line).
void split_cells(std::string_view line, std::vector<std::string_view>& cells) {
  cells.clear();
  std::size_t start = 0;
  for (;;) {
    const std::size_t comma = line.find(',', start);
    if (comma == std::string_view::npos) {
      cells.push_back(line.substr(start));
      return;
    }
    cells.push_back(line.substr(start, comma - start));
    start = comma + 1;
  }
}

bool parse_float(std::string_view cell, float& out) {
  const char* end = cell.data() + cell.size();
  auto [ptr, ec] = std::from_chars(cell.data(), end, out, std::chars_format::general);
  // out of range (e.g. 1e999): from_chars reports result_out_of_range; we call it non-finite.
  if (ec == std::errc::result_out_of_range && ptr == end) {
    out = std::numeric_limits<float>::infinity();
    return true;
  }
  return ec == std::errc() && ptr == end;
}

}  // namespace

Dataset read_csv_split(std::string_view text, const std::string& source, std::string name,
                       const CsvLimits& limits) {
  auto fail = [&](std::size_t line, const std::string& field, const std::string& expected,
                  const std::string& found) -> void {
    throw InputError(source + ":" + std::to_string(line) + ": " + field + ": expected " + expected +
                     ", found " + found);
  };
  if (text.empty())
    throw InputError(source + ": file: expected a header line or samples, found 0 bytes (empty)");
  // A UTF-8 byte-order mark (what Excel and Notepad write) is not part of the first cell.
  constexpr std::string_view kUtf8Bom = "\xEF\xBB\xBF";
  if (text.starts_with(kUtf8Bom)) {
    text.remove_prefix(kUtf8Bom.size());
    if (text.empty())
      throw InputError(source +
                       ": file: expected a header line or samples, found only a UTF-8 "
                       "byte-order mark");
  } else if (text.starts_with("\xFF\xFE") || text.starts_with("\xFE\xFF")) {
    throw InputError(source +
                     ": file: expected ASCII or UTF-8 text, found a UTF-16 byte-order "
                     "mark (save the file as UTF-8)");
  }
  Dataset set;
  set.name = std::move(name);
  set.tabular = true;
  set.rows = 1;
  std::size_t columns = 0;  // from the first line
  std::size_t max_label = 0;
  std::vector<std::string_view> cells;
  std::size_t line_no = 0, pos = 0;
  bool header = false;
  while (pos < text.size()) {
    ++line_no;
    std::size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    std::string_view line = text.substr(pos, nl - pos);
    pos = nl + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) fail(line_no, "line", "a sample (label, features...)", "an empty line");
    split_cells(line, cells);
    if (line_no == 1) {
      columns = cells.size();
      if (columns < 2)
        fail(1, "columns", "a label and at least one feature, comma-separated",
             std::to_string(columns) + " cell " + quote_cell(cells[0]));
      if (columns - 1 > limits.max_features)
        fail(1, "columns", "at most " + std::to_string(limits.max_features) + " features",
             std::to_string(columns - 1));
      // The header rule: a first line with any cell that is not a number (as a feature is
      // parsed: std::from_chars) is a header; a first line of numbers only is a sample, even
      // when it was meant as column names (pandas' "0,1,2").
      float probe;
      if (std::any_of(cells.begin(), cells.end(),
                      [&](std::string_view c) { return !parse_float(c, probe); })) {
        header = true;
        continue;
      }
    }
    if (cells.size() != columns)
      fail(line_no, "columns",
           std::to_string(columns) + " cells (as on line 1)" + (header ? ", the header" : ""),
           std::to_string(cells.size()) + " (ragged row)");
    // The label: a plain decimal integer, no sign, no decimal point.
    const std::string_view cell = cells[0];
    std::uint64_t label = 0;
    auto [ptr, ec] = std::from_chars(cell.data(), cell.data() + cell.size(), label);
    if (!cell.empty() && cell[0] == '-')
      fail(line_no, "column 1 (label)", "a class in [0, " + std::to_string(kMaxClasses) + ")",
           quote_cell(cell) + " (negative)");
    if (ec != std::errc() || ptr != cell.data() + cell.size() || label >= kMaxClasses)
      fail(line_no, "column 1 (label)",
           "an integer class in [0, " + std::to_string(kMaxClasses) + ")",
           quote_cell(cell) + (ec == std::errc() && ptr == cell.data() + cell.size()
                                   ? " (too large)"
                                   : " (not an integer)"));
    // Checked before growing: the total stays within max_values.
    if (set.count + 1 > limits.max_values / (columns - 1))
      fail(line_no, "size",
           "at most " + std::to_string(limits.max_values) + " feature values in all", "more");
    for (std::size_t c = 1; c < columns; ++c) {
      float v = 0;
      if (!parse_float(cells[c], v))
        fail(line_no, "column " + std::to_string(c + 1), "a number",
             quote_cell(cells[c]) + " (non-numeric)");
      if (!std::isfinite(v))
        fail(line_no, "column " + std::to_string(c + 1), "a finite number",
             quote_cell(cells[c]) +
                 (std::isnan(v) ? " (NaN)" : " (infinite or out of float range)"));
      set.float_features.push_back(v);
    }
    set.labels.push_back(static_cast<std::uint32_t>(label));
    max_label = std::max<std::size_t>(max_label, label);
    ++set.count;
  }
  if (set.count == 0)
    throw InputError(source + ": samples: expected at least one line after the header, found " +
                     "only the header (header-only file)");
  set.cols = columns - 1;
  set.num_classes = max_label + 1;
  return set;
}

Splits load_csv_folder(const std::filesystem::path& dir, const CsvLimits& limits) {
  auto load = [&](const char* file, const char* name) {
    const auto path = dir / file;
    const auto bytes = read_file_bytes(path, limits.max_file_bytes);
    return read_csv_split(
        std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), path.string(),
        name, limits);
  };
  Splits s;
  s.train = load("train.csv", "train");
  s.test = load("test.csv", "test");
  check_splits(s, (dir / "test.csv").string());
  return s;
}

}  // namespace cohort::data
