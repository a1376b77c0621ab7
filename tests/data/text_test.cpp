// Text data (text.hpp): UTF-8 decoding against hand-made bytes, the vocabulary and nanoGPT's 90/10
// split, val.txt, token arrays, and each refusal naming the file and position.
#include "cohort/data/text.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cohort/core/error.hpp"

namespace cohort::data {
namespace text_test {

using Bytes = std::vector<std::uint8_t>;

Bytes bytes(const std::string& s) { return Bytes(s.begin(), s.end()); }

// The InputError message of f(), or "" when it returns.
template <class F>
std::string refusal(F f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(Utf8, DecodesOneToFourByteCharactersAndEncodesThemBack) {
  // "aé€😀": 1, 2, 3 and 4 bytes.
  const std::string s = "a\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80";
  const std::vector<std::uint32_t> cps = decode_utf8(bytes(s), "t.txt");
  EXPECT_EQ(cps, (std::vector<std::uint32_t>{0x61, 0xe9, 0x20ac, 0x1f600}));
  std::string back;
  for (std::uint32_t cp : cps) back += encode_utf8(cp);
  EXPECT_EQ(back, s);
}

TEST(Utf8, RefusesInvalidSequencesNamingTheByte) {
  struct Bad {
    const char* name;
    std::string text;
    std::string phrase;
  };
  const Bad cases[] = {
      {"stray continuation", "ab\x80", "t.txt: byte 2: expected the first byte"},
      {"truncated", "ab\xe2\x82", "t.txt: byte 2: expected a UTF-8 character of 3 bytes"},
      {"bad continuation", "a\xc3(", "t.txt: byte 2: expected a UTF-8 continuation byte"},
      {"overlong", "a\xc0\xaf", "t.txt: byte 1: expected a valid UTF-8 character"},
      {"surrogate", "\xed\xa0\x80", "t.txt: byte 0: expected a valid UTF-8 character"},
      {"past U+10FFFF", "\xf4\x90\x80\x80", "t.txt: byte 0: expected a valid UTF-8 character"},
      {"empty", "", "t.txt: expected UTF-8 text, found an empty file"},
  };
  for (const Bad& b : cases)
    EXPECT_NE(refusal([&] { decode_utf8(bytes(b.text), "t.txt"); }).find(b.phrase),
              std::string::npos)
        << b.name;
}

TEST(Text, VocabularyIsTheSortedCharactersAndTheSplitIsNinetyTen) {
  const std::string text = "hello world, hello text!";  // 24 characters
  const TextData d = read_text(bytes(text), "input.txt", nullptr, {}, 2);
  const std::string sorted = " !,dehlortwx";
  ASSERT_EQ(d.vocab_size, sorted.size());
  for (std::size_t i = 0; i < sorted.size(); ++i)
    EXPECT_EQ(d.characters[i], static_cast<std::uint32_t>(sorted[i]));
  ASSERT_EQ(d.train.size(), 21u);  // int(24 * 0.9)
  ASSERT_EQ(d.val.size(), 3u);
  for (std::size_t i = 0; i < text.size(); ++i) {
    const std::uint32_t t = i < 21 ? d.train[i] : d.val[i - 21];
    EXPECT_EQ(d.characters[t], static_cast<std::uint32_t>(text[i])) << i;
  }
}

TEST(Text, ValTxtValidatesInTheInputsVocabulary) {
  const Bytes input = bytes("abcabcabc"), val = bytes("cab");
  const std::span<const std::uint8_t> v(val);
  const TextData d = read_text(input, "input.txt", &v, "val.txt", 2);
  EXPECT_EQ(d.train.size(), 9u);
  EXPECT_EQ(d.val, (std::vector<std::uint32_t>{2, 0, 1}));
  const Bytes foreign = bytes("abz");
  const std::span<const std::uint8_t> f(foreign);
  EXPECT_NE(refusal([&] { read_text(input, "input.txt", &f, "val.txt", 2); })
                .find("val.txt: character 2: expected a character of input.txt's vocabulary (3 "
                      "characters), found U+007A"),
            std::string::npos);
}

TEST(Text, ASplitShorterThanOneWindowIsRefused) {
  // 20 characters: 18 train, 2 validate; a block of 2 needs 3 tokens.
  const std::string msg =
      refusal([] { read_text(bytes("abcdefghijklmnopqrst"), "input.txt", nullptr, {}, 2); });
  EXPECT_NE(msg.find("input.txt (characters 18..20, the last 10%): expected at least one window "
                     "of 3 tokens"),
            std::string::npos)
      << msg;
}

// numpy.save of a 1-d array of `descr` with these little-endian payload bytes.
Bytes npy(const std::string& descr, std::size_t count, const Bytes& payload) {
  std::string header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (" +
                       std::to_string(count) + ",), }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string out = "\x93NUMPY";
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  out += header;
  Bytes b = bytes(out);
  b.insert(b.end(), payload.begin(), payload.end());
  return b;
}

TEST(TokenArrays, VocabularyIsTheLargestTokenPlusOne) {
  const TextData d = read_token_arrays(npy("<u2", 4, {1, 0, 7, 1, 2, 0, 3, 0}), "train_tokens.npy",
                                       npy("|u1", 3, {0, 9, 1}), "val_tokens.npy", 2);
  EXPECT_EQ(d.train, (std::vector<std::uint32_t>{1, 263, 2, 3}));
  EXPECT_EQ(d.val, (std::vector<std::uint32_t>{0, 9, 1}));
  EXPECT_EQ(d.vocab_size, 264u);
  EXPECT_TRUE(d.characters.empty());
}

TEST(TokenArrays, RefusesSignedFloatAndTwoDimensionalArrays) {
  EXPECT_NE(refusal([] {
              read_token_arrays(npy("<i2", 3, {1, 0, 2, 0, 3, 0}), "train_tokens.npy",
                                npy("|u1", 3, {0, 1, 2}), "val_tokens.npy", 2);
            }).find("train_tokens.npy: descr: expected unsigned integers"),
            std::string::npos);
  EXPECT_NE(refusal([] {
              read_token_arrays(npy("|u1", 3, {0, 1, 2}), "train_tokens.npy", npy("|u1", 2, {0, 1}),
                                "val_tokens.npy", 2);
            }).find("val_tokens.npy: expected at least one window of 3 tokens"),
            std::string::npos);
}

// A token at or past kMaxVocab is refused naming its file and index; the message names the
// model's block, not a flag, for a split shorter than a window.
TEST(TokenArrays, ATokenPastTheLargestVocabularyIsRefusedNamingFileAndIndex) {
  const std::string msg = refusal([] {  // val_tokens.npy[2] = 0x00100000 = kMaxVocab
    read_token_arrays(npy("<u4", 3, {1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0}), "train_tokens.npy",
                      npy("<u4", 3, {0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 16, 0}), "val_tokens.npy", 2);
  });
  EXPECT_NE(msg.find("val_tokens.npy: token 2: expected a token below 1048576, found 1048576"),
            std::string::npos)
      << msg;
  EXPECT_NE(refusal([] {
              read_token_arrays(npy("|u1", 2, {0, 1}), "train_tokens.npy", npy("|u1", 3, {0, 1, 2}),
                                "val_tokens.npy", 2);
            }).find("expected at least one window of 3 tokens (the model's block 2 + 1)"),
            std::string::npos);
}

// More distinct characters than kMaxVocab: refused naming input.txt (every code point but the
// surrogates, 1,112,064 of them, once).
TEST(Text, AVocabularyPastTheLargestIsRefusedNamingTheFile) {
  std::string text;
  for (std::uint32_t cp = 0; cp <= 0x10FFFF; ++cp)
    if (cp < 0xD800 || cp > 0xDFFF) text += encode_utf8(cp);
  const std::string msg = refusal([&] { read_text(bytes(text), "input.txt", nullptr, {}, 2); });
  EXPECT_NE(msg.find("input.txt: vocabulary: expected at most 1048576 distinct characters, found "
                     "1112064"),
            std::string::npos)
      << msg;
}

// The shipped Tiny Shakespeare (datasets/tinyshakespeare, md5 in datasets/README.md): nanoGPT's
// shakespeare_char numbers — 65 characters, 1,115,394 of them, 1,003,854 to train.
TEST(Text, TinyShakespeareHasNanoGptsVocabularyAndSplit) {
  const TextData d = load_text_folder(COHORT_FIXTURE_DIR "/../tinyshakespeare", 64);
  EXPECT_EQ(d.vocab_size, 65u);
  EXPECT_EQ(d.characters.front(), static_cast<std::uint32_t>('\n'));
  EXPECT_EQ(d.characters.back(), static_cast<std::uint32_t>('z'));
  EXPECT_EQ(d.train.size(), 1003854u);
  EXPECT_EQ(d.val.size(), 111540u);
  std::string first;
  for (std::size_t i = 0; i < 14; ++i) first += static_cast<char>(d.characters[d.train[i]]);
  EXPECT_EQ(first, "First Citizen:");
}

}  // namespace text_test
}  // namespace cohort::data
