// IDX reader: the real fixture parses to known counts and checksums; every corruption is refused
// with a message that names the file and the field.
#include "cohort/data/idx.hpp"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <new>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "../common/sanitizers.hpp"
#include "cohort/core/error.hpp"
#include "cohort/data/dataset.hpp"

namespace cohort::data {
namespace idx_test {

namespace fs = std::filesystem;
using Bytes = std::vector<std::uint8_t>;

const fs::path kFixture = COHORT_FIXTURE_DIR;

using cohort::testing::kAsan;

// For EXPECT_EXIT: read_idx(p, ndim) with an address space that may grow by 512 MiB at most.
// Exits 2 printing the message on InputError, 3 on bad_alloc (it allocated a claimed size),
// 0 when the file reads.
[[noreturn]] void read_idx_under_memory_limit(const fs::path& p, std::size_t ndim) {
  long pages = 0;
  std::ifstream("/proc/self/statm") >> pages;  // first field: the address space, in pages
  const rlim_t limit = static_cast<rlim_t>(pages) * static_cast<rlim_t>(::sysconf(_SC_PAGESIZE)) +
                       (rlim_t{512} << 20);
  const rlimit rl{limit, limit};
  if (::setrlimit(RLIMIT_AS, &rl) != 0) {
    std::fputs("setrlimit failed\n", stderr);
    std::_Exit(4);
  }
  try {
    read_idx(p, ndim);
  } catch (const InputError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    std::_Exit(2);
  } catch (const std::bad_alloc&) {
    std::fputs("bad_alloc: the claimed size was allocated\n", stderr);
    std::_Exit(3);
  }
  std::_Exit(0);
}

Bytes be32(std::uint32_t v) {
  return {std::uint8_t(v >> 24), std::uint8_t(v >> 16), std::uint8_t(v >> 8), std::uint8_t(v)};
}
Bytes idx(std::uint8_t type, std::vector<std::uint32_t> dims, std::size_t payload_bytes,
          std::uint8_t fill = 1) {
  Bytes b{0, 0, type, std::uint8_t(dims.size())};
  for (auto d : dims) {
    auto w = be32(d);
    b.insert(b.end(), w.begin(), w.end());
  }
  b.insert(b.end(), payload_bytes, fill);
  return b;
}

class IdxFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("cohort_idx_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path write_raw(const std::string& name, const Bytes& bytes) {
    fs::path p = dir_ / name;
    std::ofstream(p, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
    return p;
  }
  fs::path write_gz(const std::string& name, const Bytes& bytes) {
    fs::path p = dir_ / name;
    gzFile f = gzopen(p.c_str(), "wb");
    gzwrite(f, bytes.data(), unsigned(bytes.size()));
    gzclose(f);
    return p;
  }
  // Runs `fn`, expects an InputError whose message contains every one of `parts`.
  template <typename Fn>
  void expect_refused(Fn fn, std::vector<std::string> parts) {
    try {
      fn();
      ADD_FAILURE() << "accepted, expected refusal mentioning " << parts[0];
    } catch (const InputError& e) {
      std::string msg = e.what();
      for (const auto& part : parts) EXPECT_NE(msg.find(part), std::string::npos) << msg;
    }
  }
  void expect_idx_refused(const fs::path& p, std::size_t ndim, std::vector<std::string> parts,
                          IdxLimits limits = {}) {
    parts.push_back(p.string());
    expect_refused([&] { read_idx(p, ndim, limits); }, parts);
  }
  fs::path dir_;
};

TEST(Idx, FixtureParsesToKnownCountsAndChecksums) {
  IdxArray images = read_idx(kFixture / "train-images-idx3-ubyte.gz", 3);
  IdxArray labels = read_idx(kFixture / "train-labels-idx1-ubyte.gz", 1);
  ASSERT_EQ(images.dims, (std::vector<std::uint32_t>{512, 28, 28}));
  ASSERT_EQ(labels.dims, (std::vector<std::uint32_t>{512}));
  // Checksums computed independently with Python's gzip module (scripts/make_fixture.py).
  EXPECT_EQ(std::accumulate(images.values.begin(), images.values.end(), std::uint64_t{0}),
            29159313u);
  EXPECT_EQ(std::accumulate(labels.values.begin(), labels.values.end(), std::uint64_t{0}), 2239u);
  IdxArray test_images = read_idx(kFixture / "t10k-images-idx3-ubyte.gz", 3);
  EXPECT_EQ(test_images.dims[0], 256u);
  EXPECT_EQ(std::accumulate(test_images.values.begin(), test_images.values.end(), std::uint64_t{0}),
            14981551u);
}

TEST(Idx, FolderLoadsBothSplits) {
  Splits s = load_image_folder(kFixture);
  EXPECT_EQ(s.train.count, 512u);
  EXPECT_EQ(s.test.count, 256u);
  EXPECT_EQ(s.train.features(), 784u);
  std::vector<int> histogram(10);
  for (auto l : s.train.labels) ++histogram[l];
  EXPECT_EQ(histogram, (std::vector<int>{53, 56, 50, 52, 53, 51, 55, 49, 50, 43}));
}

TEST_F(IdxFiles, UncompressedFileParsesLikeGzip) {
  auto p = write_raw("raw-idx", idx(0x08, {3, 2, 2}, 12, 7));
  IdxArray a = read_idx(p, 3);
  EXPECT_EQ(a.values, Bytes(12, 7));
}

TEST_F(IdxFiles, EmptyFile) {
  expect_idx_refused(write_raw("empty", {}), 1, {"non-empty", "0 bytes"});
}
TEST_F(IdxFiles, Directory) {
  fs::create_directories(dir_ / "sub");
  expect_idx_refused(dir_ / "sub", 1, {"regular file", "directory"});
}
TEST_F(IdxFiles, MissingFile) { expect_idx_refused(dir_ / "absent", 1, {"no such file"}); }
TEST_F(IdxFiles, WrongMagicFirstByte) {
  Bytes b = idx(0x08, {4}, 4);
  b[0] = 0x1f;
  expect_idx_refused(write_raw("m0", b), 1, {"magic", "0x1f"});
}
TEST_F(IdxFiles, WrongMagicSecondByte) {
  Bytes b = idx(0x08, {4}, 4);
  b[1] = 0x01;
  expect_idx_refused(write_gz("m1.gz", b), 1, {"magic", "0x1"});
}
TEST_F(IdxFiles, WrongTypeCode) {
  expect_idx_refused(write_gz("t.gz", idx(0x0B, {4}, 8)), 1, {"type code", "0xb"});
}
TEST_F(IdxFiles, FloatTypeCode) {
  expect_idx_refused(write_gz("f.gz", idx(0x0D, {4}, 16)), 1, {"type code", "0xd"});
}
TEST_F(IdxFiles, ImagesWithTwoDimensions) {
  expect_idx_refused(write_gz("d2.gz", idx(0x08, {4, 784}, 4 * 784)), 3,
                     {"number of dimensions", "expected 3", "found 2"});
}
TEST_F(IdxFiles, LabelsWithThreeDimensions) {
  expect_idx_refused(write_gz("d3.gz", idx(0x08, {4, 1, 1}, 4)), 1,
                     {"number of dimensions", "expected 1", "found 3"});
}
TEST_F(IdxFiles, ZeroCount) {
  expect_idx_refused(write_gz("z0.gz", idx(0x08, {0, 28, 28}, 0)), 3, {"dimension 0", "found 0"});
}
TEST_F(IdxFiles, ZeroRows) {
  expect_idx_refused(write_gz("z1.gz", idx(0x08, {10, 0, 28}, 0)), 3, {"dimension 1", "found 0"});
}
TEST_F(IdxFiles, HugeDimension) {
  expect_idx_refused(write_gz("huge.gz", idx(0x08, {0x7fffffff}, 0)), 1,
                     {"dimension 0", "found 2147483647"});
}
TEST_F(IdxFiles, OverflowingSizeProductIsRefusedBeforeAllocating) {
  // 2^24 cubed = 2^72 bytes: each dimension is within limits, the product overflows 64 bits.
  expect_idx_refused(write_gz("ovf.gz", idx(0x08, {1u << 24, 1u << 24, 1u << 24}, 0)), 3,
                     {"payload size"});
}
TEST_F(IdxFiles, PayloadAboveLimit) {
  IdxLimits small{.max_dim = 1u << 24, .max_payload = 1000};
  expect_idx_refused(write_gz("big.gz", idx(0x08, {100, 28, 28}, 10)), 3,
                     {"payload size", "1000 bytes", "dimension 1"}, small);
}
// A 16-byte file whose dimensions claim 4 GiB (within max_payload): refused from the file's
// size, naming the claim and the size; so is a file one byte short of its claim.
TEST_F(IdxFiles, ClaimBeyondTheFileIsRefusedNamingBothSizes) {
  expect_idx_refused(write_raw("claim", idx(0x08, {65536, 256, 256}, 0)), 3,
                     {"payload size", "4294967296 bytes claimed by the dimensions", "16-byte file",
                      "at most 0 bytes"});
  expect_idx_refused(write_raw("short", idx(0x08, {2, 2, 2}, 7)), 3,
                     {"payload size", "8 bytes claimed", "at most 7 bytes", "23-byte file"});
}
// gzip: no file decompresses to more than 1032 times its size (deflate's largest ratio).
TEST_F(IdxFiles, GzipClaimBeyondDeflatesLimitIsRefused) {
  const fs::path p = write_gz("claim.gz", idx(0x08, {65536, 256, 256}, 0));
  const std::uint64_t gz_bytes = fs::file_size(p);
  expect_idx_refused(
      p, 3,
      {"payload size", "4294967296 bytes claimed", std::to_string(gz_bytes) + "-byte gzip file",
       "at most " + std::to_string(gz_bytes * 1032 - 16) + " bytes"});
}
// The claims above, and a gzip file within deflate's limit whose stream ends 2 GiB early, under
// a memory limit far below their claims: refused (exit 2), never allocated (bad_alloc, exit 3).
TEST_F(IdxFiles, ClaimsAreRefusedWithoutAllocatingThem) {
  if (kAsan) GTEST_SKIP() << "ASan's shadow memory does not fit an address-space limit";
  const fs::path raw = write_raw("claim", idx(0x08, {65536, 256, 256}, 0));
  EXPECT_EXIT(read_idx_under_memory_limit(raw, 3), ::testing::ExitedWithCode(2),
              "payload size.*4294967296 bytes claimed");
  const fs::path gz = write_gz("claim.gz", idx(0x08, {65536, 256, 256}, 0));
  EXPECT_EXIT(read_idx_under_memory_limit(gz, 3), ::testing::ExitedWithCode(2),
              "payload size.*4294967296 bytes claimed");
  // 3 MiB of incompressible pixels: up to 3 GiB by deflate's limit, so a 2 GiB claim passes
  // the size check and only the data's end refuses it.
  Bytes b = idx(0x08, {32768, 256, 256}, 0);
  std::mt19937 rng(1);
  for (std::size_t i = 0; i < (std::size_t{3} << 20); ++i) b.push_back(std::uint8_t(rng()));
  const fs::path partial = write_gz("partial.gz", b);
  ASSERT_GT(fs::file_size(partial) * 1032, (std::uint64_t{1} << 31) + 16);
  EXPECT_EXIT(read_idx_under_memory_limit(partial, 3), ::testing::ExitedWithCode(2),
              "payload: expected 2147483648 more bytes.*truncated");
}
TEST_F(IdxFiles, TruncatedMagic) {
  expect_idx_refused(write_raw("tm", {0, 0, 8}), 1, {"magic", "truncated"});
}
TEST_F(IdxFiles, TruncatedDimensions) {
  Bytes b = idx(0x08, {5, 28, 28}, 0);
  b.resize(10);
  expect_idx_refused(write_gz("td.gz", b), 3, {"dimension 1", "truncated"});
}
TEST_F(IdxFiles, TruncatedPayload) {
  expect_idx_refused(write_gz("tp.gz", idx(0x08, {2, 28, 28}, 2 * 784 - 1)), 3,
                     {"payload", "truncated", "byte 1583"});
}
TEST_F(IdxFiles, TrailingData) {
  expect_idx_refused(write_gz("tr.gz", idx(0x08, {2, 2, 2}, 9)), 3,
                     {"file length", "24 bytes", "trailing data"});
}
TEST_F(IdxFiles, CorruptGzipStream) {
  // A valid gzip header followed by garbage deflate data.
  Bytes b{0x1f, 0x8b, 0x08, 0x00, 0, 0, 0, 0, 0x00, 0x03};
  b.reserve(b.size() + 64);  // which also spares GCC 12 a false -Warray-bounds in the insert
  b.insert(b.end(), 64, 0xff);
  expect_idx_refused(write_raw("bad.gz", b), 1, {"decompression error"});
}
TEST_F(IdxFiles, TruncatedGzipStream) {
  fs::path whole = write_gz("whole.gz", idx(0x08, {50, 28, 28}, 50 * 784, 3));
  std::ifstream in(whole, std::ios::binary);
  Bytes b((std::istreambuf_iterator<char>(in)), {});
  b.resize(b.size() / 2);
  expect_idx_refused(write_raw("half.gz", b), 3, {"payload"});
}
TEST_F(IdxFiles, LabelCountMismatch) {
  auto images = write_gz("i.gz", idx(0x08, {3, 2, 2}, 12));
  auto labels = write_gz("l.gz", idx(0x08, {2}, 2));
  expect_refused([&] { load_idx_pair(images, labels, 10, "train"); },
                 {labels.string(), "label count", "expected 3", "found 2"});
}
TEST_F(IdxFiles, LabelOutOfRange) {
  auto images = write_gz("i.gz", idx(0x08, {3, 2, 2}, 12));
  Bytes lb = idx(0x08, {3}, 3, 1);
  lb.back() = 10;
  auto labels = write_gz("l.gz", lb);
  expect_refused([&] { load_idx_pair(images, labels, 10, "train"); },
                 {labels.string(), "label 2", "below 10", "found 10"});
}
TEST_F(IdxFiles, FolderWithoutFiles) {
  expect_refused([&] { load_image_folder(dir_); }, {"train-images-idx3-ubyte", "--data"});
}
TEST_F(IdxFiles, FolderThatIsAFile) {
  auto p = write_raw("not-a-dir", {1});
  expect_refused([&] { load_image_folder(p); }, {p.string(), "data folder", "a file"});
}
TEST_F(IdxFiles, TestImagesOfAnotherSize) {
  write_gz("train-images-idx3-ubyte.gz", idx(0x08, {2, 2, 2}, 8));
  write_gz("train-labels-idx1-ubyte.gz", idx(0x08, {2}, 2));
  write_gz("t10k-images-idx3-ubyte.gz", idx(0x08, {2, 3, 3}, 18));
  write_gz("t10k-labels-idx1-ubyte.gz", idx(0x08, {2}, 2));
  expect_refused([&] { load_image_folder(dir_); }, {"t10k-images", "image size", "found 3x3"});
}

}  // namespace idx_test
}  // namespace cohort::data
