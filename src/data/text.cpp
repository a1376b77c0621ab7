// Text data; see include/cohort/data/text.hpp.
#include "cohort/data/text.hpp"

#include <algorithm>
#include <cstdio>

#include "cohort/core/error.hpp"
#include "cohort/data/dataset.hpp"
#include "cohort/data/npy.hpp"

namespace cohort::data {

namespace {

[[noreturn]] void refuse(const std::string& where, const std::string& expected,
                         const std::string& found) {
  throw InputError(where + ": expected " + expected + ", found " + found);
}

std::string code_point_name(std::uint32_t cp) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "U+%04X", static_cast<unsigned>(cp));
  return buf;
}

std::string hex_byte(std::uint8_t b) {
  static constexpr char kDigits[] = "0123456789abcdef";
  return std::string("0x") + kDigits[b >> 4] + kDigits[b & 15];
}

void check_window(const std::vector<std::uint32_t>& tokens, const std::string& source,
                  std::size_t block) {
  if (tokens.size() < block + 1)
    refuse(source,
           "at least one window of " + std::to_string(block + 1) + " tokens (the model's block " +
               std::to_string(block) + " + 1)",
           std::to_string(tokens.size()) + " tokens");
}

}  // namespace

std::vector<std::uint32_t> decode_utf8(std::span<const std::uint8_t> bytes,
                                       const std::string& name) {
  if (bytes.empty()) refuse(name, "UTF-8 text", "an empty file");
  std::vector<std::uint32_t> out;
  out.reserve(bytes.size());
  for (std::size_t i = 0; i < bytes.size();) {
    const std::uint8_t b = bytes[i];
    std::size_t n;
    std::uint32_t cp, min;
    if (b < 0x80) {
      out.push_back(b);
      ++i;
      continue;
    } else if ((b & 0xe0) == 0xc0) {
      n = 2, cp = b & 0x1fu, min = 0x80;
    } else if ((b & 0xf0) == 0xe0) {
      n = 3, cp = b & 0x0fu, min = 0x800;
    } else if ((b & 0xf8) == 0xf0) {
      n = 4, cp = b & 0x07u, min = 0x10000;
    } else {
      refuse(name + ": byte " + std::to_string(i), "the first byte of a UTF-8 character",
             hex_byte(b));
    }
    if (i + n > bytes.size())
      refuse(name + ": byte " + std::to_string(i),
             "a UTF-8 character of " + std::to_string(n) + " bytes", "the end of the file");
    for (std::size_t k = 1; k < n; ++k) {
      const std::uint8_t c = bytes[i + k];
      if ((c & 0xc0) != 0x80)
        refuse(name + ": byte " + std::to_string(i + k), "a UTF-8 continuation byte", hex_byte(c));
      cp = (cp << 6) | (c & 0x3fu);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
      refuse(name + ": byte " + std::to_string(i), "a valid UTF-8 character",
             "an overlong form, a surrogate or a value past U+10FFFF");
    out.push_back(cp);
    i += n;
  }
  return out;
}

std::string encode_utf8(std::uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xc0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xe0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    s += static_cast<char>(0xf0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  }
  return s;
}

TextData read_text(std::span<const std::uint8_t> input, const std::string& input_name,
                   const std::span<const std::uint8_t>* val, const std::string& val_name,
                   std::size_t block) {
  const std::vector<std::uint32_t> text = decode_utf8(input, input_name);
  TextData d;
  d.characters = text;
  std::sort(d.characters.begin(), d.characters.end());
  d.characters.erase(std::unique(d.characters.begin(), d.characters.end()), d.characters.end());
  d.vocab_size = d.characters.size();
  if (d.vocab_size > kMaxVocab)
    refuse(input_name + ": vocabulary",
           "at most " + std::to_string(kMaxVocab) + " distinct characters",
           std::to_string(d.vocab_size));
  const auto id = [&](std::uint32_t cp) {
    return static_cast<std::uint32_t>(
        std::lower_bound(d.characters.begin(), d.characters.end(), cp) - d.characters.begin());
  };
  std::vector<std::uint32_t> tokens(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) tokens[i] = id(text[i]);
  if (val == nullptr) {
    const std::size_t cut = text.size() * 9 / 10;  // nanoGPT: int(n * 0.9)
    d.train.assign(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(cut));
    d.val.assign(tokens.begin() + static_cast<std::ptrdiff_t>(cut), tokens.end());
    d.train_source = input_name + " (characters 0.." + std::to_string(cut) + ", the first 90%)";
    d.val_source = input_name + " (characters " + std::to_string(cut) + ".." +
                   std::to_string(text.size()) + ", the last 10%)";
  } else {
    d.train = std::move(tokens);
    d.train_source = input_name;
    d.val_source = val_name;
    const std::vector<std::uint32_t> vtext = decode_utf8(*val, val_name);
    d.val.resize(vtext.size());
    for (std::size_t i = 0; i < vtext.size(); ++i) {
      const std::uint32_t t = id(vtext[i]);
      if (t == d.vocab_size || d.characters[t] != vtext[i])
        refuse(val_name + ": character " + std::to_string(i),
               "a character of " + input_name + "'s vocabulary (" + std::to_string(d.vocab_size) +
                   " characters)",
               code_point_name(vtext[i]));
      d.val[i] = t;
    }
  }
  check_window(d.train, d.train_source, block);
  check_window(d.val, d.val_source, block);
  return d;
}

std::vector<std::uint32_t> tokens_of_array(const ArrayView& a) {
  if (a.kind != 'u' || (a.item_size != 1 && a.item_size != 2 && a.item_size != 4))
    refuse(a.source + ": " + a.dtype_field, "unsigned integers of 1, 2 or 4 bytes (<u1, <u2, <u4)",
           std::string(1, a.kind) + std::to_string(a.item_size));
  if (a.shape.size() != 1)
    refuse(a.source + ": " + a.shape_field, "one dimension (tokens,)",
           std::to_string(a.shape.size()) + " dimensions");
  std::vector<std::uint32_t> out(static_cast<std::size_t>(a.shape[0]));
  const std::uint8_t* p = a.payload.data();
  for (std::size_t i = 0; i < out.size(); ++i) {
    std::uint32_t v = 0;
    for (std::size_t b = 0; b < a.item_size; ++b)
      v |= std::uint32_t{p[i * a.item_size + b]} << (8 * b);
    out[i] = v;
  }
  return out;
}

TextData token_arrays(const ArrayView& train, const ArrayView& val, std::size_t block) {
  TextData d;
  d.train = tokens_of_array(train);
  d.val = tokens_of_array(val);
  d.train_source = train.source;
  d.val_source = val.source;
  std::uint32_t largest = 0;
  for (const auto& [split, name] :
       {std::pair{&d.train, &train.source}, std::pair{&d.val, &val.source}})
    for (std::size_t i = 0; i < split->size(); ++i) {
      if ((*split)[i] >= kMaxVocab)
        refuse(*name + ": token " + std::to_string(i), "a token below " + std::to_string(kMaxVocab),
               std::to_string((*split)[i]));
      largest = std::max(largest, (*split)[i]);
    }
  d.vocab_size = std::size_t{largest} + 1;
  check_window(d.train, d.train_source, block);
  check_window(d.val, d.val_source, block);
  return d;
}

TextData read_token_arrays(std::span<const std::uint8_t> train, const std::string& train_name,
                           std::span<const std::uint8_t> val, const std::string& val_name,
                           std::size_t block) {
  // The files' own fields: "<file>: descr", "<file>: shape".
  auto view = [](std::span<const std::uint8_t> bytes, const std::string& name) {
    ArrayView a = npy_array(bytes, name);
    a.dtype_field = "descr";
    a.shape_field = "shape";
    return a;
  };
  return token_arrays(view(train, train_name), view(val, val_name), block);
}

bool is_text_folder(const std::filesystem::path& dir) {
  std::error_code ec;
  for (const char* f : {"input.txt", "train_tokens.npy", "val_tokens.npy"})
    if (std::filesystem::exists(dir / f, ec)) return true;
  return false;
}

TextData load_text_folder(const std::filesystem::path& dir, std::size_t block) {
  std::error_code ec;
  const auto has = [&](const char* f) { return std::filesystem::exists(dir / f, ec); };
  const bool text = has("input.txt"), arrays = has("train_tokens.npy") || has("val_tokens.npy");
  if (text && arrays)
    refuse(dir.string() + ": text folder", "input.txt or the token arrays, not both",
           "input.txt and " +
               std::string(has("train_tokens.npy") ? "train_tokens.npy" : "val_tokens.npy"));
  constexpr std::uint64_t kMaxBytes = std::uint64_t{1} << 32;
  if (text) {
    const auto input = read_file_bytes(dir / "input.txt", kMaxBytes);
    if (!has("val.txt")) return read_text(input, (dir / "input.txt").string(), nullptr, {}, block);
    const auto val = read_file_bytes(dir / "val.txt", kMaxBytes);
    const std::span<const std::uint8_t> v(val);
    return read_text(input, (dir / "input.txt").string(), &v, (dir / "val.txt").string(), block);
  }
  const auto train = read_file_bytes(dir / "train_tokens.npy", kMaxBytes);
  const auto val = read_file_bytes(dir / "val_tokens.npy", kMaxBytes);
  return read_token_arrays(train, (dir / "train_tokens.npy").string(), val,
                           (dir / "val_tokens.npy").string(), block);
}

Splits text_splits(TextData text, std::size_t block) {
  auto split = [&](std::vector<std::uint32_t> tokens, const char* name, std::size_t stride) {
    COHORT_CHECK(tokens.size() > block, "a text split holds a window");
    Dataset d;
    d.name = name;
    d.channels = d.rows = 1;
    d.cols = block + 1;
    d.tabular = true;
    d.num_classes = text.vocab_size;
    d.window_stride = stride;
    d.count = (tokens.size() - 1 - block) / stride + 1;
    d.tokens = std::move(tokens);
    return d;
  };
  Splits s;
  s.train = split(std::move(text.train), "train", 1);
  s.test = split(std::move(text.val), "val", block);
  s.characters = std::move(text.characters);
  return s;
}

}  // namespace cohort::data
