// .npy reader: the preamble (magic, version, header length), then the header dict by a
// recursive-descent parser of exactly the literal numpy writes (strings, True/False, a tuple of
// integers), then the payload, converted element by element with explicit little-endian loads.
// Nothing in the header is evaluated; anything unexpected is refused.
#include "cohort/data/npy.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>

#include "cohort/core/error.hpp"
#include "printable.hpp"

namespace cohort::data {

namespace {

[[noreturn]] void fail(const std::string& source, const std::string& field,
                       const std::string& expected, const std::string& found) {
  throw InputError(source + ": " + field + ": expected " + expected + ", found " + found);
}

std::string quote(std::string_view s) { return printable(s, 40); }

// The header dict: {'descr': '<f4', 'fortran_order': False, 'shape': (N, F), }
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& source) : s_(text), source_(source) {}

  struct Dict {
    std::optional<std::string> descr;
    std::optional<bool> fortran_order;
    std::optional<std::vector<std::uint64_t>> shape;
  };

  Dict parse() {
    Dict d;
    skip_space();
    expect('{', "header", "a dict literal starting with '{'");
    skip_space();
    while (peek() != '}') {
      const std::string key = string_literal("header key");
      skip_space();
      expect(':', "header key '" + key + "'", "':' after the key");
      skip_space();
      if (key == "descr") {
        if (d.descr) fail(source_, "header key 'descr'", "each key once", "it twice");
        d.descr = string_literal("header 'descr'");
      } else if (key == "fortran_order") {
        if (d.fortran_order)
          fail(source_, "header key 'fortran_order'", "each key once", "it twice");
        d.fortran_order = boolean("header 'fortran_order'");
      } else if (key == "shape") {
        if (d.shape) fail(source_, "header key 'shape'", "each key once", "it twice");
        d.shape = shape_tuple();
      } else {
        fail(source_, "header key", "only 'descr', 'fortran_order' and 'shape'",
             "an extra key " + quote(key));
      }
      skip_space();
      if (peek() == ',') {
        ++pos_;
        skip_space();
      } else if (peek() != '}') {
        fail(source_, "header", "',' or '}' after the value of '" + key + "'", found_here());
      }
    }
    ++pos_;  // '}'
    // numpy pads with spaces and ends the header with one newline.
    while (pos_ < s_.size() && s_[pos_] == ' ') ++pos_;
    if (pos_ + 1 != s_.size() || s_[pos_] != '\n')
      fail(source_, "header", "only spaces and a final newline after the dict", found_here());
    if (!d.descr) fail(source_, "header", "the key 'descr'", "it missing");
    if (!d.fortran_order) fail(source_, "header", "the key 'fortran_order'", "it missing");
    if (!d.shape) fail(source_, "header", "the key 'shape'", "it missing");
    return d;
  }

 private:
  char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  std::string found_here() const {
    return pos_ < s_.size() ? quote(s_.substr(pos_)) + " at header byte " + std::to_string(pos_)
                            : "the end of the header";
  }
  void skip_space() {
    while (pos_ < s_.size() && (s_[pos_] == ' ')) ++pos_;
  }
  void expect(char c, const std::string& field, const std::string& what) {
    if (peek() != c) fail(source_, field, what, found_here());
    ++pos_;
  }
  // 'text' or "text", no escapes (numpy's keys and descrs never need them).
  std::string string_literal(const std::string& field) {
    const char q = peek();
    if (q != '\'' && q != '"') fail(source_, field, "a quoted string", found_here());
    const std::size_t start = ++pos_;
    while (pos_ < s_.size() && s_[pos_] != q) {
      if (s_[pos_] == '\\' || s_[pos_] == '\n')
        fail(source_, field, "a plain quoted string", found_here());
      ++pos_;
    }
    if (pos_ >= s_.size()) fail(source_, field, "a closing quote", "the end of the header");
    return std::string(s_.substr(start, pos_++ - start));
  }
  bool boolean(const std::string& field) {
    for (auto [word, value] : {std::pair{"True", true}, std::pair{"False", false}}) {
      const std::size_t n = std::strlen(word);
      if (s_.substr(pos_, n) == word) {
        pos_ += n;
        return value;
      }
    }
    fail(source_, field, "True or False", found_here());
  }
  std::uint64_t integer() {
    if (peek() < '0' || peek() > '9')
      fail(source_, "header 'shape'", "a non-negative integer", found_here());
    std::uint64_t v = 0;
    while (peek() >= '0' && peek() <= '9') {
      const unsigned d = static_cast<unsigned>(peek() - '0');
      if (v > (std::numeric_limits<std::uint64_t>::max() - d) / 10)
        fail(source_, "header 'shape'", "a dimension below 2^64", "an integer that overflows");
      v = v * 10 + d;
      ++pos_;
    }
    return v;
  }
  // (), (N,), (N, F), ... -- a one-element tuple needs its comma, as in Python.
  std::vector<std::uint64_t> shape_tuple() {
    std::vector<std::uint64_t> dims;
    expect('(', "header 'shape'", "a tuple starting with '('");
    skip_space();
    if (peek() == ')') {
      ++pos_;
      return dims;
    }
    for (;;) {
      dims.push_back(integer());
      if (dims.size() > 32) fail(source_, "header 'shape'", "at most 32 dimensions", "more");
      skip_space();
      if (peek() == ')') {
        if (dims.size() == 1)
          fail(source_, "header 'shape'", "a ',' in a one-element tuple", found_here());
        ++pos_;
        return dims;
      }
      expect(',', "header 'shape'", "',' or ')' in the tuple");
      skip_space();
      if (peek() == ')') {
        ++pos_;
        return dims;
      }
    }
  }

  std::string_view s_;
  const std::string& source_;
  std::size_t pos_ = 0;
};

std::string shape_string(const std::vector<std::uint64_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

template <typename T>
T load_le(const std::uint8_t* p) {
  std::make_unsigned_t<T> u = 0;
  for (std::size_t b = 0; b < sizeof(T); ++b)
    u |=
        static_cast<std::make_unsigned_t<T>>(static_cast<std::make_unsigned_t<T>>(p[b]) << (8 * b));
  return static_cast<T>(u);
}

// Label i of a y payload as a signed 128-bit-free value: returns false for values that do not
// fit int64 (a uint64 above 2^63), which are out of range anyway.
bool label_at(const ArrayView& h, const std::uint8_t* p, std::int64_t& out) {
  if (h.kind == 'u') {
    std::uint64_t v = 0;
    switch (h.item_size) {
      case 1:
        v = p[0];
        break;
      case 2:
        v = load_le<std::uint16_t>(p);
        break;
      case 4:
        v = load_le<std::uint32_t>(p);
        break;
      default:
        v = load_le<std::uint64_t>(p);
        break;
    }
    if (v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return false;
    out = static_cast<std::int64_t>(v);
    return true;
  }
  switch (h.item_size) {
    case 1:
      out = static_cast<std::int8_t>(p[0]);
      break;
    case 2:
      out = load_le<std::int16_t>(p);
      break;
    case 4:
      out = load_le<std::int32_t>(p);
      break;
    default:
      out = load_le<std::int64_t>(p);
      break;
  }
  return true;
}

// X's dtype and shape: uint8 or float32, (N, features), (N, H, W) or (N, C, H, W), no empty
// dimension. Checked before y is read, so a file pair's X is refused first.
void check_features(const ArrayView& x) {
  if (!((x.kind == 'u' && x.item_size == 1) || (x.kind == 'f' && x.item_size == 4)))
    fail(x.source, x.dtype_field, "uint8 ('|u1') or float32 ('<f4') features",
         std::string(1, x.kind) + std::to_string(x.item_size) + " (unsupported dtype for X)");
  if (x.shape.size() < 2 || x.shape.size() > 4)
    fail(x.source, x.shape_field, "(N, features), (N, H, W) or (N, C, H, W)",
         shape_string(x.shape));
  for (std::size_t i = 0; i < x.shape.size(); ++i)
    if (x.shape[i] == 0)
      fail(x.source, x.shape_field + " dimension " + std::to_string(i), "a size >= 1",
           "0 in " + shape_string(x.shape));
}

}  // namespace

NpyHeader parse_npy_header(std::span<const std::uint8_t> bytes, const std::string& source,
                           const NpyLimits& limits) {
  static constexpr std::uint8_t kMagic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  if (bytes.empty()) fail(source, "file", "a non-empty .npy file", "0 bytes");
  if (bytes.size() < 6 || std::memcmp(bytes.data(), kMagic, 6) != 0)
    fail(source, "magic", "the bytes \\x93NUMPY at offset 0 (a file numpy.save wrote)",
         quote(std::string_view(reinterpret_cast<const char*>(bytes.data()),
                                std::min<std::size_t>(bytes.size(), 6))));
  if (bytes.size() < 8) fail(source, "version", "2 bytes at offset 6", "the end of the file");
  const unsigned major = bytes[6], minor = bytes[7];
  if ((major != 1 && major != 2) || minor != 0)
    fail(source, "version", "1.0 or 2.0",
         std::to_string(major) + "." + std::to_string(minor) + " (unsupported)");
  const std::size_t len_bytes = major == 1 ? 2 : 4;
  if (bytes.size() < 8 + len_bytes)
    fail(source, "header length", std::to_string(len_bytes) + " bytes at offset 8",
         "the end of the file (truncated)");
  const std::uint64_t header_len = major == 1 ? load_le<std::uint16_t>(bytes.data() + 8)
                                              : load_le<std::uint32_t>(bytes.data() + 8);
  const std::size_t start = 8 + len_bytes;
  if (header_len > bytes.size() - start)
    fail(source, "header length",
         "at most " + std::to_string(bytes.size() - start) + " bytes (the rest of the file)",
         std::to_string(header_len) + " (file truncated)");
  const std::string_view text(reinterpret_cast<const char*>(bytes.data() + start),
                              static_cast<std::size_t>(header_len));
  const HeaderParser::Dict dict = HeaderParser(text, source).parse();

  NpyHeader h;
  const std::string& descr = *dict.descr;
  if (descr.size() < 3 ||
      (descr[0] != '<' && descr[0] != '|' && descr[0] != '>' && descr[0] != '='))
    fail(source, "header 'descr'", "a dtype such as '<f4', '|u1' or '<i8'",
         quote(descr) + " (unsupported dtype)");
  if (descr[0] == '>')
    fail(source, "header 'descr'", "little-endian ('<')", quote(descr) + " (big-endian)");
  h.kind = descr[1];
  const std::string size_text = descr.substr(2);
  h.item_size = size_text == "1"   ? 1
                : size_text == "2" ? 2
                : size_text == "4" ? 4
                : size_text == "8" ? 8
                                   : 0;
  const bool supported = (h.kind == 'u' || h.kind == 'i') ? h.item_size != 0
                         : h.kind == 'f'                  ? h.item_size == 4
                                                          : false;
  // '|' (no byte order) only for one-byte types; '=' (native) is little-endian only by accident.
  if (!supported || descr[0] == '=' || (descr[0] == '|' && h.item_size != 1))
    fail(source, "header 'descr'",
         "uint8 ('|u1'), float32 ('<f4') or a little-endian integer ('<i8', '<u2', ...)",
         quote(descr) + " (unsupported dtype)");
  if (*dict.fortran_order)
    fail(source, "header 'fortran_order'", "False (C order)",
         "True (Fortran order; save np.ascontiguousarray(a))");
  h.shape = *dict.shape;
  std::uint64_t payload = h.item_size;
  for (std::size_t i = 0; i < h.shape.size(); ++i) {
    const std::uint64_t d = h.shape[i];
    if (d > limits.max_dim)
      fail(source, "header 'shape' dimension " + std::to_string(i),
           "a size <= " + std::to_string(limits.max_dim), std::to_string(d));
    if (d != 0 && payload > limits.max_payload / d)
      fail(source, "header 'shape'",
           "a payload of at most " + std::to_string(limits.max_payload) + " bytes",
           shape_string(h.shape) + " (size overflows the limit at dimension " + std::to_string(i) +
               ")");
    payload *= d;
  }
  h.payload_offset = start + static_cast<std::size_t>(header_len);
  h.payload_bytes = payload;
  const std::uint64_t have = bytes.size() - h.payload_offset;
  if (have < payload)
    fail(source, "payload",
         std::to_string(payload) + " bytes for shape " + shape_string(h.shape) + " of " +
             quote(descr),
         std::to_string(have) + " (file truncated)");
  if (have > payload)
    fail(source, "payload", std::to_string(payload) + " bytes for shape " + shape_string(h.shape),
         std::to_string(have) + " (trailing data after byte " +
             std::to_string(h.payload_offset + payload) + ")");
  return h;
}

ArrayView npy_array(std::span<const std::uint8_t> bytes, const std::string& source,
                    const NpyLimits& limits) {
  const NpyHeader h = parse_npy_header(bytes, source, limits);
  return {.kind = h.kind,
          .item_size = h.item_size,
          .shape = h.shape,
          .payload = bytes.subspan(h.payload_offset, static_cast<std::size_t>(h.payload_bytes)),
          .source = source};
}

Dataset read_npy_split(std::span<const std::uint8_t> x_bytes, const std::string& x_source,
                       std::span<const std::uint8_t> y_bytes, const std::string& y_source,
                       std::string name, const NpyLimits& limits) {
  const ArrayView x = npy_array(x_bytes, x_source, limits);
  check_features(x);
  return split_of_arrays(x, npy_array(y_bytes, y_source, limits), std::move(name));
}

Dataset split_of_arrays(const ArrayView& x, const ArrayView& y, std::string name) {
  check_features(x);
  const std::string& x_source = x.source;
  const std::string& y_source = y.source;
  if (y.kind == 'f')
    fail(y_source, y.dtype_field, "integer labels ('<i8', '|u1', ...)",
         "float" + std::to_string(8 * y.item_size) + " (unsupported dtype for y)");
  if (y.shape.size() != 1) fail(y_source, y.shape_field, "(N,) labels", shape_string(y.shape));
  if (y.shape[0] != x.shape[0])
    fail(y_source, y.shape_field,
         "(" + std::to_string(x.shape[0]) + ",) (the sample count of " + x_source + ")",
         shape_string(y.shape));

  Dataset set;
  set.name = std::move(name);
  set.count = static_cast<std::size_t>(x.shape[0]);
  set.tabular = x.shape.size() == 2;
  set.channels = x.shape.size() == 4 ? static_cast<std::size_t>(x.shape[1]) : 1;
  set.rows = set.tabular ? 1 : static_cast<std::size_t>(x.shape[x.shape.size() - 2]);
  set.cols = static_cast<std::size_t>(x.shape.back());
  const std::size_t values = x.payload.size() / x.item_size;
  const std::uint8_t* px = x.payload.data();
  if (x.kind == 'u') {
    set.images.assign(px, px + values);
  } else {
    set.float_features.resize(values);
    const std::size_t f = set.features();
    for (std::size_t i = 0; i < values; ++i) {
      const float v = std::bit_cast<float>(load_le<std::uint32_t>(px + 4 * i));
      if (!std::isfinite(v))
        fail(x_source, "sample " + std::to_string(i / f) + " feature " + std::to_string(i % f),
             "a finite float", std::isnan(v) ? "NaN" : "infinity");
      set.float_features[i] = v;
    }
  }
  set.labels.resize(set.count);
  const std::uint8_t* py = y.payload.data();
  std::size_t max_label = 0;
  for (std::size_t i = 0; i < set.count; ++i) {
    std::int64_t v = 0;
    const bool fits = label_at(y, py + i * y.item_size, v);
    if (!fits || v < 0 || static_cast<std::uint64_t>(v) >= kMaxClasses)
      fail(y_source, "label " + std::to_string(i),
           "a class in [0, " + std::to_string(kMaxClasses) + ")",
           fits ? std::to_string(v) + (v < 0 ? " (negative)" : "") : "a value above 2^63");
    set.labels[i] = static_cast<std::uint32_t>(v);
    max_label = std::max<std::size_t>(max_label, set.labels[i]);
  }
  set.num_classes = max_label + 1;
  return set;
}

Splits splits_of_arrays(const ArrayView& x_train, const ArrayView& y_train, const ArrayView& x_test,
                        const ArrayView& y_test) {
  Splits s;
  s.train = split_of_arrays(x_train, y_train, "train");
  s.test = split_of_arrays(x_test, y_test, "test");
  check_splits(s, x_test.source);
  return s;
}

Splits load_npy_folder(const std::filesystem::path& dir, const NpyLimits& limits) {
  auto path = [&](const char* file) { return dir / file; };
  auto load = [&](const char* x_file, const char* y_file, const char* name) {
    const auto xp = path(x_file), yp = path(y_file);
    const auto xb = read_file_bytes(xp, limits.max_payload + (std::uint64_t{1} << 32));
    const auto yb = read_file_bytes(yp, limits.max_payload + (std::uint64_t{1} << 32));
    return read_npy_split(xb, xp.string(), yb, yp.string(), name, limits);
  };
  Splits s;
  s.train = load("train_x.npy", "train_y.npy", "train");
  s.test = load("test_x.npy", "test_y.npy", "test");
  check_splits(s, path("test_x.npy").string());
  return s;
}

}  // namespace cohort::data
