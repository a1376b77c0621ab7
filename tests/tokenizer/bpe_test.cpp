// GPT-2's byte-level BPE on a vocabulary and merges made here (made_tokenizer.hpp): the byte map,
// the pre-tokenizer's pieces and the encodings worked out by hand, the round trip of arbitrary
// bytes, and the files' checks.
#include "cohort/tokenizer/bpe.hpp"

#include <gtest/gtest.h>

#include <random>

#include "cohort/core/error.hpp"
#include "made_tokenizer.hpp"

namespace bpe_test {

using cohort::InputError;
using cohort::tokenizer::Bpe;
using cohort::tokenizer::byte_character;
using made_tokenizer::chars;

Bpe made() {
  return Bpe::from_text(made_tokenizer::vocab_json(), "vocab.json", made_tokenizer::merges_txt(),
                        "merges.txt");
}

std::vector<std::string> pieces(const std::string& text) {
  std::vector<std::string> out;
  for (const auto p : cohort::tokenizer::pieces(text)) out.emplace_back(p);
  return out;
}

using Ids = std::vector<std::uint32_t>;

TEST(Bpe, TheByteMapIsGpt2s) {
  EXPECT_EQ(byte_character('!'), 0x21u);    // printable ASCII stands for itself
  EXPECT_EQ(byte_character(0xA1), 0xA1u);   // as does printable Latin-1
  EXPECT_EQ(byte_character(0), 0x100u);     // the rest from U+0100, in byte order
  EXPECT_EQ(byte_character('\n'), 0x10Au);  // 'Ċ'
  EXPECT_EQ(byte_character(' '), 0x120u);   // 'Ġ'
  EXPECT_EQ(byte_character(0x7F), 0x121u);  // DEL, after the 33 below '!'
  EXPECT_EQ(byte_character(0xAD), 0x143u);  // the soft hyphen, 'Ń': the 68th
  EXPECT_EQ(made().size(), 256u + made_tokenizer::kMerges.size());
}

TEST(Bpe, PiecesFollowGpt2sPattern) {
  using V = std::vector<std::string>;
  EXPECT_EQ(pieces("don't stop"), (V{"don", "'t", " stop"}));
  EXPECT_EQ(pieces("I'll go!!"), (V{"I", "'ll", " go", "!!"}));
  EXPECT_EQ(pieces("we've they're"), (V{"we", "'ve", " they", "'re"}));
  EXPECT_EQ(pieces("abc123def"), (V{"abc", "123", "def"}));
  EXPECT_EQ(pieces("3.14"), (V{"3", ".", "14"}));
  // A run of spaces keeps its last space for the word after it; at the end it stays whole.
  EXPECT_EQ(pieces("a   b"), (V{"a", "  ", " b"}));
  EXPECT_EQ(pieces("x  \n"), (V{"x", "  \n"}));
  // Only a space joins the word after it: a newline before a word is a piece of its own.
  EXPECT_EQ(pieces("x\n\ny"), (V{"x", "\n", "\n", "y"}));
  // Letters beyond ASCII are letters (\p{L}); digits beyond ASCII numbers (\p{N}).
  EXPECT_EQ(pieces("héllo wörld"), (V{"héllo", " wörld"}));
  EXPECT_EQ(pieces("Ζεύς ٣٤"), (V{"Ζεύς", " ٣٤"}));
  // Pieces longer than the matcher's first window, and a character across its end.
  const std::string letters(1000, 'a'), spaces(600, ' '), before(255, 'a');
  EXPECT_EQ(pieces(letters + " b"), (V{letters, " b"}));
  EXPECT_EQ(pieces(spaces + "x"), (V{spaces.substr(1), " x"}));
  EXPECT_EQ(pieces(before + "\xc3\xa9b c"), (V{before + "\xc3\xa9b", " c"}));
  EXPECT_EQ(pieces(before + "  \xc3\xa9"), (V{before, " ", " \xc3\xa9"}));
  // Bytes that are not UTF-8 are a piece of their own.
  EXPECT_EQ(pieces("ab\xff\xfe cd"), (V{"ab", "\xff\xfe", " cd"}));
}

TEST(Bpe, EncodesByRankWorkedOutByHand) {
  const Bpe bpe = made();
  // "hello": h e l l o -> he (rank 0) -> ll (rank 1): he, ll, o. " the": Ġ t h e -> he (0) -> Ġt
  // (2) -> Ġthe (3).
  EXPECT_EQ(bpe.encode("hello the"), (Ids{256, 257, 'o', 259}));
  // "don't": don, then 't (rank 4).
  EXPECT_EQ(bpe.encode("don't"), (Ids{'d', 'o', 'n', 260}));
  // "12 12": 12 (rank 5); " 12": Ġ1 has no rank, 12 does.
  EXPECT_EQ(bpe.encode("12 12"), (Ids{261, ' ', 261}));
  // " w" merges; "w" alone has nothing to merge with.
  EXPECT_EQ(bpe.encode("w w"), (Ids{'w', 262}));
  // "é" is the bytes C3 A9, each its own token.
  EXPECT_EQ(bpe.encode("é"), (Ids{0xC3, 0xA9}));
  EXPECT_EQ(bpe.encode(""), Ids{});
  EXPECT_EQ(bpe.decode(Ids{256, 257, 'o', 259}), "hello the");
  EXPECT_EQ(bpe.id_of(chars(" the")), 259);
  EXPECT_EQ(bpe.id_of("missing"), -1);
}

TEST(Bpe, AnyBytesRoundTrip) {
  const Bpe bpe = made();
  constexpr unsigned kSeed = 11;
  std::mt19937 rng(kSeed);
  SCOPED_TRACE("seed " + std::to_string(kSeed));
  for (int i = 0; i < 300; ++i) {
    std::string text(rng() % 40, '\0');
    // Half the strings from a few characters the pattern splits on, half any bytes.
    const std::string alphabet = "ab 't12\n\xc3\xa9!";
    for (char& c : text)
      c = i % 2 ? static_cast<char>(rng() % 256) : alphabet[rng() % alphabet.size()];
    EXPECT_EQ(bpe.decode(bpe.encode(text)), text) << "string " << i;
    std::string joined;
    for (const auto p : cohort::tokenizer::pieces(text)) joined += p;
    EXPECT_EQ(joined, text) << "string " << i;
  }
}

void expect_refused(const std::string& vocab, const std::string& merges, const std::string& what) {
  try {
    Bpe::from_text(vocab, "vocab.json", merges, "merges.txt");
    ADD_FAILURE() << "accepted; expected: " << what;
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

TEST(Bpe, RefusesBadFilesNamingTheEntry) {
  const std::string vocab = made_tokenizer::vocab_json(), merges = made_tokenizer::merges_txt();
  expect_refused("{\"a\": ", merges, "vocab.json: byte 7: expected a JSON object");
  expect_refused("[1, 2]", merges, "vocab.json: expected a JSON object of tokens to ids");
  nlohmann::json v = nlohmann::json::parse(vocab);
  v.erase(chars("\n"));
  v[chars("xyz")] = 10;  // byte 10's id, under another token
  expect_refused(v.dump(), merges, "none for byte 10");
  v = nlohmann::json::parse(vocab);
  v[chars("he")] = 5;
  expect_refused(v.dump(), merges, "an id of its own, found 5");
  v = nlohmann::json::parse(vocab);
  v[chars("he")] = 999;
  expect_refused(v.dump(), merges, "expected an id in [0, 263)");
  expect_refused(vocab, merges + "a  b\n", "merges.txt: line 9: expected two tokens separated");
  expect_refused(vocab, merges + "x y\n",
                 "merges.txt: line 9: expected tokens of vocab.json "
                 "(and their merge), found 'xy'");
  expect_refused(vocab, merges + chars("h") + " e\n",
                 "merges.txt: line 9: expected each pair "
                 "once, found 'h e' again (line 2)");
}

}  // namespace bpe_test
