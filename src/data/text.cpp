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

void check_window(const Tokens& tokens, const std::string& source, std::size_t block) {
  if (tokens.size() < block + 1)
    refuse(source,
           "at least one window of " + std::to_string(block + 1) + " tokens (the model's block " +
               std::to_string(block) + " + 1)",
           std::to_string(tokens.size()) + " tokens");
}

// Window ids are 32-bit (data::Sampler, assemble_batch): a split holds at most 2^32 tokens, checked
// before its tokens are read. Only shards can pass it: a token array is one .npy of at most 2^31
// elements (the reader's limit), input.txt at most 4 GiB.
void check_split_tokens(std::uint64_t tokens, const std::string& source) {
  constexpr std::uint64_t kMaxSplitTokens = std::uint64_t{1} << 32;
  if (tokens > kMaxSplitTokens)
    refuse(source,
           "at most " + std::to_string(kMaxSplitTokens) +
               " tokens in a split (its window ids are 32-bit)",
           std::to_string(tokens) + " tokens");
}

// Checks every token of `tokens` (from `source`) against kMaxVocab, in one pass that releases
// mapped pages as it goes, and raises `largest` to the largest.
void scan_vocab(const Tokens& tokens, const std::string& source, std::uint32_t& largest) {
  std::size_t at = 0;
  tokens.for_each_chunk(
      [&](std::span<const std::uint32_t> chunk) {
        for (std::size_t i = 0; i < chunk.size(); ++i) {
          if (chunk[i] >= kMaxVocab)
            refuse(source + ": token " + std::to_string(at + i),
                   "a token below " + std::to_string(kMaxVocab), std::to_string(chunk[i]));
          largest = std::max(largest, chunk[i]);
        }
        at += chunk.size();
      },
      /*release=*/true);
}

// A token array's dtype and shape: unsigned integers of 1, 2 or 4 bytes, one dimension.
void check_token_array(const ArrayView& a) {
  if (a.kind != 'u' || (a.item_size != 1 && a.item_size != 2 && a.item_size != 4))
    refuse(a.source + ": " + a.dtype_field, "unsigned integers of 1, 2 or 4 bytes (<u1, <u2, <u4)",
           std::string(1, a.kind) + std::to_string(a.item_size));
  if (a.shape.size() != 1)
    refuse(a.source + ": " + a.shape_field, "one dimension (tokens,)",
           std::to_string(a.shape.size()) + " dimensions");
}

// The vocabulary of token ids: the largest of both splits + 1 (each checked), and a window in each.
void finish_token_data(TextData& d, std::size_t block) {
  std::uint32_t largest = 0;
  scan_vocab(d.train, d.train_source, largest);
  scan_vocab(d.val, d.val_source, largest);
  d.vocab_size = std::size_t{largest} + 1;
  check_window(d.train, d.train_source, block);
  check_window(d.val, d.val_source, block);
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
    const auto middle = tokens.begin() + static_cast<std::ptrdiff_t>(cut);
    d.train = Tokens(std::vector<std::uint32_t>(tokens.begin(), middle));
    d.val = Tokens(std::vector<std::uint32_t>(middle, tokens.end()));
    d.train_source = input_name + " (characters 0.." + std::to_string(cut) + ", the first 90%)";
    d.val_source = input_name + " (characters " + std::to_string(cut) + ".." +
                   std::to_string(text.size()) + ", the last 10%)";
  } else {
    d.train = Tokens(std::move(tokens));
    d.train_source = input_name;
    d.val_source = val_name;
    const std::vector<std::uint32_t> vtext = decode_utf8(*val, val_name);
    std::vector<std::uint32_t> val_tokens(vtext.size());
    for (std::size_t i = 0; i < vtext.size(); ++i) {
      const std::uint32_t t = id(vtext[i]);
      if (t == d.vocab_size || d.characters[t] != vtext[i])
        refuse(val_name + ": character " + std::to_string(i),
               "a character of " + input_name + "'s vocabulary (" + std::to_string(d.vocab_size) +
                   " characters)",
               code_point_name(vtext[i]));
      val_tokens[i] = t;
    }
    d.val = Tokens(std::move(val_tokens));
  }
  check_window(d.train, d.train_source, block);
  check_window(d.val, d.val_source, block);
  return d;
}

std::vector<std::uint32_t> tokens_of_array(const ArrayView& a) {
  check_token_array(a);
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
  d.train = Tokens(tokens_of_array(train));
  d.val = Tokens(tokens_of_array(val));
  d.train_source = train.source;
  d.val_source = val.source;
  finish_token_data(d, block);
  return d;
}

std::size_t shard_tokens(std::span<const std::uint8_t> bytes, const std::string& name) {
  constexpr std::int32_t kMagic = 20240520;
  if (bytes.size() < kShardHeaderBytes)
    refuse(name + ": header", std::to_string(kShardHeaderBytes) + " bytes (256 int32)",
           std::to_string(bytes.size()) + " bytes (file truncated)");
  auto field = [&](std::size_t i) {
    std::uint32_t v = 0;
    for (std::size_t b = 0; b < 4; ++b) v |= std::uint32_t{bytes[4 * i + b]} << (8 * b);
    return static_cast<std::int32_t>(v);
  };
  if (field(0) != kMagic)
    refuse(name + ": header magic", std::to_string(kMagic) + " (an llm.c token shard)",
           std::to_string(field(0)));
  if (field(1) != 1) refuse(name + ": header version", "1", std::to_string(field(1)));
  const std::int32_t count = field(2);
  if (count < 0) refuse(name + ": header token count", "a count >= 0", std::to_string(count));
  const std::uint64_t want = kShardHeaderBytes + 2 * std::uint64_t(std::uint32_t(count));
  if (bytes.size() != want)
    refuse(name + ": tokens",
           std::to_string(count) + " uint16 tokens (" + std::to_string(want - kShardHeaderBytes) +
               " bytes after the header)",
           std::to_string(bytes.size() - kShardHeaderBytes) + " bytes");
  return static_cast<std::size_t>(count);
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

bool is_shard(const std::string& name, const std::string& split) {
  return name.size() > 4 && name.ends_with(".bin") &&
         name.find("_" + split + "_") != std::string::npos;
}

namespace {

// The llm.c shards of `split` in `dir`, in name order.
std::vector<std::filesystem::path> shards(const std::filesystem::path& dir,
                                          const std::string& split) {
  std::vector<std::filesystem::path> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec))
    if (is_shard(entry.path().filename().string(), split)) out.push_back(entry.path());
  std::sort(out.begin(), out.end());
  return out;
}

// A token array file, mapped: its header checked, its tokens left on disk.
Tokens mapped_array(const std::filesystem::path& path) {
  const auto m = Tokens::map_file(path);
  ArrayView a = npy_array(Tokens::bytes(*m), path.string());
  a.dtype_field = "descr";
  a.shape_field = "shape";
  check_token_array(a);
  Tokens t;
  t.append(m, a.payload.data(), static_cast<std::size_t>(a.shape[0]),
           static_cast<unsigned>(a.item_size));
  return t;
}

// A split's shards, mapped one after another; each checked for a window and its tokens
// against the vocabulary (naming the shard), `largest` raised to theirs.
Tokens mapped_shards(const std::vector<std::filesystem::path>& files, std::size_t block,
                     std::uint32_t& largest) {
  Tokens all;
  std::vector<Tokens> shards;
  for (const auto& path : files) {  // every header and size first, before any token is read
    const auto m = Tokens::map_file(path);
    const std::span<const std::uint8_t> bytes = Tokens::bytes(*m);
    Tokens& t = shards.emplace_back();
    t.append(m, bytes.data() + kShardHeaderBytes, shard_tokens(bytes, path.string()), 2);
    check_window(t, path.string(), block);
    check_split_tokens(all.size() + t.size(), path.string());
    all.append(t);
  }
  for (std::size_t i = 0; i < files.size(); ++i) scan_vocab(shards[i], files[i].string(), largest);
  return all;
}

}  // namespace

bool is_text_folder(const std::filesystem::path& dir) {
  std::error_code ec;
  for (const char* f : {"input.txt", "train_tokens.npy", "val_tokens.npy"})
    if (std::filesystem::exists(dir / f, ec)) return true;
  return !shards(dir, "train").empty() || !shards(dir, "val").empty();
}

TextData load_text_folder(const std::filesystem::path& dir, std::size_t block) {
  std::error_code ec;
  const auto has = [&](const char* f) { return std::filesystem::exists(dir / f, ec); };
  const auto train_shards = shards(dir, "train"), val_shards = shards(dir, "val");
  const bool text = has("input.txt"), arrays = has("train_tokens.npy") || has("val_tokens.npy"),
             bins = !train_shards.empty() || !val_shards.empty();
  if (int(text) + int(arrays) + int(bins) > 1)
    refuse(dir.string() + ": text folder", "one of input.txt, the token arrays or llm.c's shards",
           std::string(text ? "input.txt " : "") + (arrays ? "token arrays " : "") +
               (bins ? "shards (*_train_*.bin, *_val_*.bin)" : ""));
  constexpr std::uint64_t kMaxBytes = std::uint64_t{1} << 32;
  if (text) {
    const auto input = read_file_bytes(dir / "input.txt", kMaxBytes);
    if (!has("val.txt")) return read_text(input, (dir / "input.txt").string(), nullptr, {}, block);
    const auto val = read_file_bytes(dir / "val.txt", kMaxBytes);
    const std::span<const std::uint8_t> v(val);
    return read_text(input, (dir / "input.txt").string(), &v, (dir / "val.txt").string(), block);
  }
  TextData d;
  if (arrays) {
    d.train_source = (dir / "train_tokens.npy").string();
    d.val_source = (dir / "val_tokens.npy").string();
    d.train = mapped_array(d.train_source);
    d.val = mapped_array(d.val_source);
    finish_token_data(d, block);
    return d;
  }
  for (const auto& [files, split] : {std::pair{&train_shards, "train"}, {&val_shards, "val"}})
    if (files->empty())
      refuse(dir.string() + ": llm.c shards", std::string("files *_") + split + "_*.bin as well",
             "none");
  auto named = [&](const std::vector<std::filesystem::path>& files, const char* split) {
    return (dir / (std::string("*_") + split + "_*.bin")).string() + " (" +
           std::to_string(files.size()) + (files.size() == 1 ? " file)" : " files)");
  };
  d.train_source = named(train_shards, "train");
  d.val_source = named(val_shards, "val");
  std::uint32_t largest = 0;
  d.train = mapped_shards(train_shards, block, largest);
  d.val = mapped_shards(val_shards, block, largest);
  d.vocab_size = std::size_t{largest} + 1;
  return d;
}

Splits text_splits(TextData text, std::size_t block) {
  auto split = [&](Tokens tokens, const char* name, std::size_t stride) {
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
