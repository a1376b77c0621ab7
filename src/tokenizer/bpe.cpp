// GPT-2's byte-level BPE: include/cohort/tokenizer/bpe.hpp. The pre-tokenizer is PCRE2 (Debian's
// libpcre2-8, with Unicode properties) rather than a matcher of our own: the pattern's \p{L},
// \p{N} and \s are Unicode's classes, which std::regex does not know.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "cohort/tokenizer/bpe.hpp"

#include <pcre2.h>

#include <nlohmann/json.hpp>

#include <array>
#include <initializer_list>
#include <limits>
#include <unordered_map>

#include "cohort/core/error.hpp"
#include "cohort/data/dataset.hpp"
#include "cohort/data/text.hpp"

namespace cohort::tokenizer {

namespace {

constexpr const char* kPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// GPT-2's bytes_to_unicode, both ways.
struct ByteMap {
  std::array<std::uint32_t, 256> character{};
  std::unordered_map<std::uint32_t, std::uint8_t> byte;
  ByteMap() {
    auto printable = [](unsigned b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    std::uint32_t next = 256;
    for (unsigned b = 0; b < 256; ++b) {
      character[b] = printable(b) ? b : next++;
      byte[character[b]] = static_cast<std::uint8_t>(b);
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap map;
  return map;
}

[[noreturn]] void refuse(const std::string& where, const std::string& expected,
                         const std::string& found) {
  throw InputError(where + ": expected " + expected + ", found " + found);
}

std::string shown(std::string_view s) {
  std::string out = "'";
  out.append(s.substr(0, 40));
  return out + (s.size() > 40 ? "...'" : "'");
}

}  // namespace

std::uint32_t byte_character(std::uint8_t b) { return byte_map().character[b]; }

namespace {

// GPT-2's pattern, compiled once (a compiled pattern may be matched from any number of threads,
// each with match data of its own).
const pcre2_code* pattern() {
  static const struct Compiled {
    pcre2_code* code;
    Compiled() {
      int error = 0;
      PCRE2_SIZE offset = 0;
      code =
          pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kPattern), PCRE2_ZERO_TERMINATED,
                        PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &offset, nullptr);
      COHORT_CHECK(code != nullptr, "GPT-2's pre-tokenizer pattern compiles");
    }
    ~Compiled() { pcre2_code_free(code); }
  } compiled;
  return compiled.code;
}

}  // namespace

struct Bpe::State {
  std::vector<std::string> tokens;  // id -> the token's text (vocab.json's characters, UTF-8)
  std::vector<std::string> bytes;   // id -> the bytes it stands for
  std::unordered_map<std::string, std::uint32_t> ids;
  std::unordered_map<std::string, std::uint32_t> ranks;  // "first second" -> rank
  std::array<std::string, 256> byte_token;               // a byte's one-character token
};

Bpe::Bpe(std::unique_ptr<State> state) : s_(std::move(state)) {}
Bpe::Bpe(Bpe&&) noexcept = default;
Bpe& Bpe::operator=(Bpe&&) noexcept = default;
Bpe::~Bpe() = default;

Bpe Bpe::load(const std::filesystem::path& dir) {
  constexpr std::uint64_t kMaxBytes = std::uint64_t{1} << 30;
  const auto vocab = data::read_file_bytes(dir / "vocab.json", kMaxBytes);
  const auto merges = data::read_file_bytes(dir / "merges.txt", kMaxBytes);
  auto text = [](const std::vector<std::uint8_t>& b) {
    return std::string_view(reinterpret_cast<const char*>(b.data()), b.size());
  };
  return from_text(text(vocab), (dir / "vocab.json").string(), text(merges),
                   (dir / "merges.txt").string());
}

Bpe Bpe::from_text(std::string_view vocab_json, const std::string& vocab_name,
                   std::string_view merges, const std::string& merges_name) {
  auto s = std::make_unique<State>();
  const ByteMap& map = byte_map();
  // vocab.json: {"token": id, ...}, ids 0 .. n - 1 each once.
  nlohmann::json vocab;
  try {
    vocab = nlohmann::json::parse(vocab_json);
  } catch (const nlohmann::json::parse_error& e) {
    refuse(vocab_name + ": byte " + std::to_string(e.byte), "a JSON object (token -> id)",
           std::string("a syntax error (") + e.what() + ")");
  }
  if (!vocab.is_object() || vocab.empty())
    refuse(vocab_name, "a JSON object of tokens to ids", vocab.is_object() ? "{}" : vocab.dump());
  const std::size_t n = vocab.size();
  s->tokens.resize(n);
  s->bytes.resize(n);
  std::vector<bool> seen(n);
  for (const auto& [token, id] : vocab.items()) {
    if (!id.is_number_unsigned() || id.get<std::uint64_t>() >= n)
      refuse(vocab_name + ": token " + shown(token),
             "an id in [0, " + std::to_string(n) + ") (one per token)", id.dump());
    const auto i = static_cast<std::size_t>(id.get<std::uint64_t>());
    if (seen[i])
      refuse(vocab_name + ": token " + shown(token), "an id of its own",
             std::to_string(i) + ", the id of " + shown(s->tokens[i]) + " too");
    seen[i] = true;
    const std::vector<std::uint32_t> points =
        data::decode_utf8({reinterpret_cast<const std::uint8_t*>(token.data()), token.size()},
                          vocab_name + ": token " + std::to_string(i));
    for (const std::uint32_t p : points) {
      const auto b = map.byte.find(p);
      if (b == map.byte.end())
        refuse(vocab_name + ": token " + shown(token), "characters of GPT-2's byte map",
               data::encode_utf8(p) + " (code point " + std::to_string(p) + ")");
      s->bytes[i] += static_cast<char>(b->second);
    }
    s->tokens[i] = token;
    s->ids.emplace(token, static_cast<std::uint32_t>(i));
  }
  for (unsigned b = 0; b < 256; ++b) {
    s->byte_token[b] = data::encode_utf8(map.character[b]);
    if (!s->ids.contains(s->byte_token[b]))
      refuse(vocab_name, "a token for each of the 256 bytes",
             "none for byte " + std::to_string(b) + " ('" + s->byte_token[b] + "')");
  }
  // merges.txt: "first second" a line, in rank order.
  std::size_t line_no = 0, rank = 0;
  std::unordered_map<std::string, std::size_t> line_of;
  for (std::size_t at = 0; at < merges.size();) {
    const std::size_t end = std::min(merges.find('\n', at), merges.size());
    std::string_view line = merges.substr(at, end - at);
    at = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line_no == 1 && line.starts_with("#version")) continue;
    const std::string where = merges_name + ": line " + std::to_string(line_no);
    const std::size_t space = line.find(' ');
    if (space == std::string_view::npos || space == 0 || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string_view::npos)
      refuse(where, "two tokens separated by one space", shown(line));
    const std::string first(line.substr(0, space)), second(line.substr(space + 1));
    for (const std::string* t :
         std::initializer_list<const std::string*>{&first, &second, nullptr}) {
      const std::string token = t ? *t : first + second;
      if (!s->ids.contains(token))
        refuse(where, "tokens of " + vocab_name + (t ? "" : " (and their merge)"),
               shown(token) + ", which it does not hold");
    }
    const auto [it, added] = s->ranks.emplace(std::string(line), rank);
    if (!added)
      refuse(where, "each pair once",
             shown(line) + " again (line " + std::to_string(line_of[std::string(line)]) + ")");
    line_of[std::string(line)] = line_no;
    ++rank;
  }
  return Bpe(std::move(s));
}

std::vector<std::string_view> pieces(std::string_view text) {
  // Each match sees a window of the text from where it starts: PCRE2 checks a subject's UTF-8 on
  // every call, so the whole text each time would make the cut quadratic. The pattern looks at
  // most one character past a match (\s+(?!\S)), so a match that ends 4 bytes (a character)
  // before the window's end is the whole text's; else the window doubles and the match is tried
  // again.
  constexpr std::size_t kWindow = 256, kCharacter = 4;
  std::vector<std::string_view> out;
  const pcre2_code* re = pattern();
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(re, nullptr);
  COHORT_CHECK(md != nullptr, "PCRE2 match data");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  std::size_t pos = 0, window = kWindow;
  while (pos < text.size()) {
    const std::size_t limit = std::min(text.size(), pos + window);
    const bool whole = limit == text.size();
    // The window starts at pos: a match never looks behind its start.
    const int rc = pcre2_match(re, subject + pos, limit - pos, 0, 0, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH && whole) {  // the rest is not UTF-8
      out.push_back(text.substr(pos));
      break;
    }
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {
      pcre2_match_data_free(md);
      COHORT_CHECK(false, "PCRE2 match error " + std::to_string(rc));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    if (rc == PCRE2_ERROR_NOMATCH || (!whole && pos + ov[1] + kCharacter > limit)) {
      window *= 2;
      continue;
    }
    const std::size_t begin = pos + ov[0], end = pos + ov[1];
    if (begin > pos) out.push_back(text.substr(pos, begin - pos));  // bytes that are not UTF-8
    COHORT_CHECK(end > begin, "every alternative of the pattern matches at least a character");
    out.push_back(text.substr(begin, end - begin));
    pos = end;
    window = kWindow;
  }
  pcre2_match_data_free(md);
  return out;
}

std::vector<std::uint32_t> Bpe::encode(std::string_view text) const {
  std::vector<std::uint32_t> ids;
  std::vector<std::string> word, merged;
  for (const std::string_view piece : tokenizer::pieces(text)) {
    word.clear();
    for (const char c : piece) word.push_back(s_->byte_token[static_cast<std::uint8_t>(c)]);
    while (word.size() > 1) {
      std::size_t best = std::numeric_limits<std::size_t>::max(), at = 0;
      for (std::size_t i = 0; i + 1 < word.size(); ++i) {
        const auto r = s_->ranks.find(word[i] + ' ' + word[i + 1]);
        if (r != s_->ranks.end() && r->second < best) {
          best = r->second;
          at = i;
        }
      }
      if (best == std::numeric_limits<std::size_t>::max()) break;
      const std::string first = word[at], second = word[at + 1];
      merged.clear();
      for (std::size_t i = 0; i < word.size();) {
        if (i + 1 < word.size() && word[i] == first && word[i + 1] == second) {
          merged.push_back(first + second);
          i += 2;
        } else {
          merged.push_back(std::move(word[i]));
          ++i;
        }
      }
      word.swap(merged);
    }
    for (const std::string& token : word) ids.push_back(s_->ids.at(token));
  }
  return ids;
}

std::string Bpe::decode(std::span<const std::uint32_t> ids) const {
  std::string out;
  for (const std::uint32_t id : ids) out += bytes_of(id);
  return out;
}

const std::string& Bpe::bytes_of(std::uint32_t id) const {
  COHORT_CHECK(id < s_->bytes.size(), "a token id below the vocabulary's size");
  return s_->bytes[id];
}

std::size_t Bpe::size() const { return s_->tokens.size(); }

std::int64_t Bpe::id_of(std::string_view token) const {
  const auto it = s_->ids.find(std::string(token));
  return it == s_->ids.end() ? -1 : static_cast<std::int64_t>(it->second);
}

}  // namespace cohort::tokenizer
