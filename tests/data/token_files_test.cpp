// Token corpora on disk (text.hpp, tokens.hpp): token arrays and llm.c's shards are mapped, not
// read: the process's anonymous memory does not grow with the corpus and the vocabulary's check
// leaves none of it resident; shards are one sequence in name order, a window may cross from one
// to the next; each damaged shard refused naming the file and field.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../common/proc_status.hpp"
#include "cohort/core/error.hpp"
#include "cohort/data/dataset.hpp"
#include "cohort/data/text.hpp"

namespace cohort::data {
namespace token_files_test {

namespace fs = std::filesystem;

class Folder {
 public:
  Folder() {
    path_ = fs::temp_directory_path() /
            ("cohort_token_files_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~Folder() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }
  void write(const std::string& name, const std::string& bytes) const {
    std::ofstream(path_ / name, std::ios::binary) << bytes;
  }

 private:
  fs::path path_;
};

std::string le32(std::int32_t v) {
  std::string s(4, '\0');
  for (int b = 0; b < 4; ++b)
    s[b] = static_cast<char>((static_cast<std::uint32_t>(v) >> (8 * b)) & 0xff);
  return s;
}

// An llm.c shard: 256 int32 (magic, version, count, zeros), then the uint16 tokens.
std::string shard(const std::vector<std::uint16_t>& tokens, std::int32_t magic = 20240520,
                  std::int32_t version = 1, std::int64_t count = -1) {
  std::string s = le32(magic) + le32(version) +
                  le32(static_cast<std::int32_t>(count < 0 ? tokens.size() : count));
  s.resize(1024, '\0');
  for (const std::uint16_t t : tokens) {
    s += static_cast<char>(t & 0xff);
    s += static_cast<char>(t >> 8);
  }
  return s;
}

// numpy.save's header of a 1-d uint16 array of `count` tokens.
std::string npy_u2_header(std::uint64_t count) {
  std::string header =
      "{'descr': '<u2', 'fortran_order': False, 'shape': (" + std::to_string(count) + ",), }";
  header.append(63 - (10 + header.size()) % 64, ' ');
  header += '\n';
  std::string s = std::string("\x93NUMPY\x01\x00", 8);
  s += static_cast<char>(header.size() & 0xff);
  s += static_cast<char>(header.size() >> 8);
  s += header;
  return s;
}

// numpy.save of a 1-d uint16 array.
std::string npy_u2(const std::vector<std::uint16_t>& tokens) {
  std::string s = npy_u2_header(tokens.size());
  s.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2);
  return s;
}

std::string refusal(const fs::path& dir, std::size_t block) {
  try {
    load_text_folder(dir, block);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(Shards, AreOneSequenceInNameOrderAndAWindowCrossesFromOneToTheNext) {
  const Folder f;
  f.write("tiny_train_000002.bin", shard({7, 8, 9, 10}));
  f.write("tiny_train_000001.bin", shard({1, 2, 3}));
  f.write("tiny_val_000000.bin", shard({4, 5, 6, 11}));
  const TextData d = load_text_folder(f.path(), 2);
  EXPECT_EQ(d.train, (std::vector<std::uint32_t>{1, 2, 3, 7, 8, 9, 10}));
  EXPECT_EQ(d.val, (std::vector<std::uint32_t>{4, 5, 6, 11}));
  EXPECT_EQ(d.vocab_size, 12u);
  const Splits s = text_splits(d, 2);
  ASSERT_EQ(s.train.count, 5u);  // windows of 3 at offsets 0..4
  const std::vector<std::uint32_t> ids{1, 2};
  float x[6];
  std::int32_t y[2];
  assemble_batch(s.train, ids, x, y);
  EXPECT_EQ(std::vector<float>(x, x + 6), (std::vector<float>{2, 3, 7, 3, 7, 8}));
}

TEST(Shards, DamagedOnesAreRefusedNamingTheFileAndField) {
  struct Case {
    std::string bytes, expected;
  };
  const std::vector<Case> cases{
      {shard({1, 2, 3}, 20240519), "a_train_0.bin: header magic: expected 20240520"},
      {shard({1, 2, 3}, 20240520, 2), "a_train_0.bin: header version: expected 1, found 2"},
      {shard({1, 2, 3}).substr(0, 1000), "a_train_0.bin: header: expected 1024 bytes"},
      {shard({1, 2, 3}, 20240520, 1, 5), "a_train_0.bin: tokens: expected 5 uint16 tokens"},
      {shard({1, 2}), "a_train_0.bin: expected at least one window of 3 tokens"},
  };
  for (const Case& c : cases) {
    const Folder f;
    f.write("a_train_0.bin", c.bytes);
    f.write("a_val_0.bin", shard({1, 2, 3}));
    EXPECT_NE(refusal(f.path(), 2).find(c.expected), std::string::npos)
        << refusal(f.path(), 2) << "\nexpected: " << c.expected;
  }
  const Folder f;
  f.write("a_train_0.bin", shard({1, 2, 3}));
  EXPECT_NE(refusal(f.path(), 2).find("expected files *_val_*.bin as well"), std::string::npos)
      << refusal(f.path(), 2);
  f.write("train_tokens.npy", npy_u2({1, 2, 3}));
  EXPECT_NE(refusal(f.path(), 2).find("one of input.txt, the token arrays or llm.c's shards"),
            std::string::npos)
      << refusal(f.path(), 2);
}

// Whether a sanitizer (GCC's macros, clang's __has_feature) runs beside the test.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
    __has_feature(memory_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

using testing::status_kb;

TEST(TokenArrays, AreMappedAndTheirCheckLeavesNoneOfThemResident) {
  // Not under a sanitizer, whose allocator and shadow memory are the process's own memory too.
  if (kSanitized) GTEST_SKIP() << "a sanitizer's memory is the process's too";
  const Folder f;
  constexpr std::size_t kTokens = std::size_t{48} << 20;  // 96 MB of uint16
  {
    std::vector<std::uint16_t> tokens(kTokens);
    for (std::size_t i = 0; i < kTokens; ++i)
      tokens[i] = static_cast<std::uint16_t>(i * 31 % 50257);
    f.write("train_tokens.npy", npy_u2(tokens));
    tokens.resize(1000);
    f.write("val_tokens.npy", npy_u2(tokens));
  }
  const std::int64_t anon = status_kb("RssAnon"), rss = status_kb("VmRSS");
  ASSERT_GT(anon, 0) << "no RssAnon in /proc/self/status";
  const Splits s = text_splits(load_text_folder(f.path(), 64), 64);
  EXPECT_EQ(s.train.num_classes, 50257u);
  EXPECT_EQ(s.train.tokens.size(), kTokens);
  EXPECT_EQ(s.train.tokens[kTokens - 1], (kTokens - 1) * 31 % 50257);
  // The corpus is 96 MB; what the load added to the process's own memory, and to what is
  // resident at all, is a small part of it.
  EXPECT_LT(status_kb("RssAnon") - anon, 8 * 1024) << "kB of anonymous memory added";
  EXPECT_LT(status_kb("VmRSS") - rss, 24 * 1024) << "kB resident added";
}

// Window ids are 32-bit, so a split holds at most 2^32 tokens. A token array of 2^32 + 1 (8 GiB of
// uint16, a sparse file whose pages are never read) is refused by the .npy reader's bound of 2^31
// elements, naming the file and field; a split of shards (at most 2^31 - 1 tokens each: an int32
// count) whose sum passes 2^32 is refused naming the shard that passes it and the sum, before any
// token is scanned.
TEST(TokenArrays, ASplitPast2To32TokensIsRefusedBeforeItsTokensAreRead) {
  const Folder f;
  constexpr std::uint64_t kTokens = (std::uint64_t{1} << 32) + 1;
  const std::string header = npy_u2_header(kTokens);
  f.write("train_tokens.npy", header);
  fs::resize_file(f.path() / "train_tokens.npy", header.size() + kTokens * 2);
  f.write("val_tokens.npy", npy_u2(std::vector<std::uint16_t>(1000, 7)));
  const std::string why = refusal(f.path(), 64);
  EXPECT_NE(why.find("train_tokens.npy: header 'shape' dimension 0: expected a size <= 2147483648, "
                     "found 4294967297"),
            std::string::npos)
      << why;

  const Folder s;
  const std::uint64_t most = (std::uint64_t{1} << 31) - 1;
  for (const char* name : {"tok_train_000.bin", "tok_train_001.bin", "tok_train_002.bin"}) {
    std::string head = shard({}, 20240520, 1, static_cast<std::int64_t>(most));
    s.write(name, head);
    fs::resize_file(s.path() / name, head.size() + most * 2);
  }
  s.write("tok_val_000.bin", shard(std::vector<std::uint16_t>(1000, 7)));
  const std::string shards = refusal(s.path(), 64);
  EXPECT_NE(shards.find("tok_train_002.bin: expected at most 4294967296 tokens"), std::string::npos)
      << shards;
  EXPECT_NE(shards.find("found 6442450941 tokens"), std::string::npos) << shards;
}

}  // namespace token_files_test
}  // namespace cohort::data
