// GPT-2's byte-level BPE tokenizer, read from its two files: `vocab.json` (token -> id) and
// `merges.txt` (the merges in rank order). Text is cut into pieces by GPT-2's pre-tokenizer
// pattern (PCRE2, Unicode properties):
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// — contractions, letters, numbers and other characters each with one optional leading space,
// runs of whitespace but the last space before a word; each piece's bytes become GPT-2's printable
// characters (bytes_to_unicode: the 188 printable Latin-1 bytes stand for themselves, the other
// 68 for U+0100 onwards), and the piece's characters are merged pair by pair, the pair of lowest
// rank first (every occurrence of it, left to right), until no pair has a rank. Any bytes encode
// (a byte sequence that is not UTF-8 is a piece of its own) and decode back to themselves.
// Not a trainer of merges and not the special tokens' text (<|endoftext|> is a token like any).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace cohort::tokenizer {

class Bpe {
 public:
  // `dir`/vocab.json and `dir`/merges.txt. Throws InputError naming the file and the entry:
  // vocab.json an object of strings to distinct ids 0 .. n - 1 holding a token for each of the 256
  // bytes; merges.txt lines of two tokens separated by one space (a first line "#version: ..." is
  // skipped), each token and their concatenation in the vocabulary.
  static Bpe load(const std::filesystem::path& dir);
  // The same from the files' contents; `vocab_name`, `merges_name` name them in messages.
  static Bpe from_text(std::string_view vocab_json, const std::string& vocab_name,
                       std::string_view merges, const std::string& merges_name);

  Bpe(Bpe&&) noexcept;
  Bpe& operator=(Bpe&&) noexcept;
  ~Bpe();

  std::vector<std::uint32_t> encode(std::string_view text) const;
  // The bytes of tokens `ids` (each below size()).
  std::string decode(std::span<const std::uint32_t> ids) const;
  // One token's bytes (below size()).
  const std::string& bytes_of(std::uint32_t id) const;
  // The vocabulary's size: ids 0 .. size() - 1.
  std::size_t size() const;
  // The id of the token whose text (in vocab.json's characters) is `token`, or -1.
  std::int64_t id_of(std::string_view token) const;

 private:
  struct State;
  explicit Bpe(std::unique_ptr<State> state);
  std::unique_ptr<State> s_;
};

// GPT-2's pre-tokenizer: the pieces of `text`, in order; together they are `text`.
std::vector<std::string_view> pieces(std::string_view text);

// GPT-2's bytes_to_unicode: the character (code point) standing for byte `b`.
std::uint32_t byte_character(std::uint8_t b);

}  // namespace cohort::tokenizer
