// Sampler ordering and batch assembly (f32, and bf16 straight from the source).
#include "cohort/data/dataset.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <span>
#include <utility>
#include <vector>

#include "../common/proc_status.hpp"
#include "../common/sanitizers.hpp"
#include "cohort/core/rng.hpp"
#include "pixels.hpp"

namespace cohort::data {
namespace dataset_test {

TEST(Sampler, EachEpochIsAPermutationKeyedBySeedAndEpoch) {
  Sampler s(1000, /*seed=*/7);
  auto e0 = s.epoch_order(0), e1 = s.epoch_order(1);
  ASSERT_EQ(e0.size(), 1000u);
  EXPECT_EQ(e0, Sampler(1000, 7).epoch_order(0));  // a pure function of (seed, epoch)
  EXPECT_NE(e0, e1);
  EXPECT_NE(e0, Sampler(1000, 8).epoch_order(0));
  auto sorted = e1;
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::uint32_t> iota(1000);
  std::iota(iota.begin(), iota.end(), 0u);
  EXPECT_EQ(sorted, iota);
  EXPECT_EQ(Sampler(1000, 7, /*shuffle=*/false).epoch_order(3), iota);
}

// Text windows: row r of batch b of epoch e is its own keyed draw, whatever else is drawn, and
// the draws cover the range about uniformly (windows repeat, as nanoGPT's do).
TEST(Sampler, DrawsAreKeyedByEpochBatchAndRow) {
  constexpr std::size_t kCount = 50, kBatch = 12;
  const Sampler s = Sampler::draws(kCount, /*seed=*/9, kBatch);
  const auto e0 = s.epoch_order(0), e1 = s.epoch_order(1);
  ASSERT_EQ(e0.size(), kCount);
  EXPECT_EQ(e0, Sampler::draws(kCount, 9, kBatch).epoch_order(0));
  EXPECT_NE(e0, e1);
  EXPECT_NE(e0, Sampler::draws(kCount, 10, kBatch).epoch_order(0));
  // Row 3 of batch 2 is the same draw in a batch of 12 and in one of 16 rows where it moves.
  const auto wide = Sampler::draws(kCount, 9, 16).epoch_order(0);
  EXPECT_EQ(e0[2 * kBatch + 3], wide[2 * 16 + 3]);
  EXPECT_NE(std::vector<std::uint32_t>(e0.begin(), e0.begin() + 12),
            std::vector<std::uint32_t>(e0.begin() + 12, e0.begin() + 24));  // batches differ
  std::vector<int> seen(kCount);
  const Sampler big = Sampler::draws(kCount, 9, 64);
  for (std::uint64_t e = 0; e < 400; ++e)
    for (const std::uint32_t id : big.epoch_order(e)) {
      ASSERT_LT(id, kCount);
      ++seen[id];
    }
  for (std::size_t i = 0; i < kCount; ++i)  // 400 draws each expected; sd 20
    EXPECT_NEAR(seen[i], 400, 100) << "window " << i;
}

// An epoch's batches: a shuffle's and draws' the slices of epoch_order, the last one shorter;
// a batch's ids at one address while the next is asked for and after a move; draws made a batch
// at a time, so that a corpus of 2^31 windows adds nothing like its order's 8 GB.
TEST(EpochBatches, AreTheEpochOrdersBatchesDrawnOneAtATime) {
  constexpr std::size_t kCount = 50, kBatch = 12;
  for (const Sampler& s : {Sampler(kCount, 3), Sampler::draws(kCount, 3, kBatch)}) {
    const auto whole = s.epoch_order(2);
    EpochBatches batches(s, 2, kBatch);
    for (std::size_t b = 0; b * kBatch < kCount; ++b) {
      const auto ids = batches.batch(b);
      const auto want = std::span<const std::uint32_t>(whole).subspan(
          b * kBatch, std::min(kBatch, kCount - b * kBatch));
      ASSERT_EQ(std::vector<std::uint32_t>(ids.begin(), ids.end()),
                std::vector<std::uint32_t>(want.begin(), want.end()))
          << "batch " << b << (s.is_draws() ? " (draws)" : " (shuffle)");
      const auto next = batches.batch(b + 1);
      EXPECT_EQ(batches.batch(b).data(), ids.data()) << "batch " << b;
      EpochBatches moved(std::move(batches));
      EXPECT_EQ(moved.batch(b).data(), ids.data()) << "batch " << b << ", moved";
      EXPECT_EQ(moved.batch(b + 1).data(), next.data()) << "batch " << b + 1 << ", moved";
      batches = std::move(moved);
    }
  }
  if (testing::kAsan) GTEST_SKIP() << "the allocator's memory is the process's too";
  const std::int64_t anon = testing::status_kb("RssAnon");
  ASSERT_GT(anon, 0) << "no RssAnon in /proc/self/status";
  const Sampler corpus = Sampler::draws(std::size_t{1} << 31, 3, 8);
  EpochBatches batches(corpus, 0, 8);
  std::vector<std::uint32_t> got;
  for (std::size_t b = 0; b < 4; ++b)
    for (const std::uint32_t id : batches.batch(b)) got.push_back(id);
  EXPECT_EQ(got.size(), 32u);
  EXPECT_LT(testing::status_kb("RssAnon") - anon, 1024) << "kB of anonymous memory added";
}

TEST(Sampler, ShuffleIsRoughlyUniform) {
  // Position of sample 0 over 4000 epochs of a 4-element set: each slot ~1000 times.
  Sampler s(4, 11);
  std::vector<int> where(4);
  for (int e = 0; e < 4000; ++e) {
    auto o = s.epoch_order(e);
    ++where[std::find(o.begin(), o.end(), 0u) - o.begin()];
  }
  for (int c : where) EXPECT_NEAR(c, 1000, 150);
}

TEST(AssembleBatch, NormalisesPixelsAndCopiesLabels) {
  Dataset set;
  set.count = 2;
  set.rows = 1;
  set.cols = 3;
  set.num_classes = 10;
  set.images = {0, 255, 51, 1, 2, 3};
  set.labels = {4, 9};
  std::vector<std::uint32_t> ids{1, 0};
  std::vector<float> x(6);
  std::vector<std::int32_t> y(2);
  assemble_batch(set, ids, x.data(), y.data());
  EXPECT_EQ(x, (std::vector<float>{1 / 255.0f, 2 / 255.0f, 3 / 255.0f, 0.0f, 1.0f, 51 / 255.0f}));
  EXPECT_EQ(y, (std::vector<std::int32_t>{9, 4}));
}

// bf16 rows are to_bf16 of the f32 rows, bit for bit: pixels by a multiply where f32 divides.
TEST(AssembleBatch, Bf16PixelTimesInverseRoundsAsPixelOver255ForEveryByte) {
  for (int p = 0; p < 256; ++p) {
    const float v = static_cast<float>(p);
    EXPECT_EQ(to_bf16(v * (1.0f / 255.0f)).bits, to_bf16(v / 255.0f).bits) << "pixel " << p;
  }
}

// Each loop this CPU runs (the plain one everywhere, AVX512_BF16's 16 lanes where it has them)
// gives to_bf16(pixel / 255) for every byte value, at every length around a vector's 16 and at
// an offset that is not a vector's.
TEST(AssembleBatch, PixelsToBf16IsPixelOver255RoundedOnEveryLoopThisCpuRuns) {
  std::vector<std::uint8_t> src(256 + 3);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::uint8_t>((i * 7) % 256);
  std::vector<bool> loops{false};
  if (detail::pixels_in_lanes16()) loops.push_back(true);
  std::printf("loops: plain%s\n", loops.size() > 1 ? ", 16 lanes" : " (no AVX512_BF16 here)");
  // Lengths 0 to 40, then some longer, then all of src from `first` (every byte value).
  constexpr std::size_t kAll = SIZE_MAX;
  std::vector<std::size_t> lengths(41);
  std::iota(lengths.begin(), lengths.end(), std::size_t{0});
  lengths.insert(lengths.end(), {77, 128, 200, kAll});
  for (const bool lanes16 : loops)
    for (const std::size_t first : {std::size_t{0}, std::size_t{3}})
      for (const std::size_t length : lengths) {
        const std::size_t n = length == kAll ? src.size() - first : length;
        std::vector<bf16> dst(n + 1, bf16{0x7777});
        detail::pixels_to_bf16(src.data() + first, dst.data(), n, lanes16);
        for (std::size_t i = 0; i < n; ++i)
          ASSERT_EQ(dst[i].bits, to_bf16(static_cast<float>(src[first + i]) / 255.0f).bits)
              << (lanes16 ? "16 lanes" : "plain") << ", n " << n << ", offset " << first
              << ", element " << i;
        EXPECT_EQ(dst[n].bits, 0x7777) << "written past n " << n;
      }
}

// Every byte value in a few rows, gathered in a shuffled order, and float features of every
// magnitude (and a NaN): the bf16 batch is the f32 batch rounded, element by element.
TEST(AssembleBatch, Bf16RowsAreTheF32RowsRounded) {
  constexpr std::uint64_t kSeed = 20261202;
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  Rng rng({kSeed, 1});
  for (const bool images : {true, false}) {
    Dataset set;
    set.count = 40;
    set.rows = 1;
    set.cols = 100;  // not a multiple of 16: a vector loop's tail
    set.num_classes = 10;
    const std::size_t f = set.cols, n = set.count * f;
    if (images) {
      set.images.resize(n);
      for (std::size_t i = 0; i < n; ++i) set.images[i] = static_cast<std::uint8_t>(i % 256);
    } else {
      set.float_features.resize(n);
      for (std::size_t i = 0; i < n; ++i)
        set.float_features[i] = std::ldexp(static_cast<float>(rng.below(1u << 24)) - 8388608.0f,
                                           -20 + static_cast<int>(i % 40));
      set.float_features[7] = std::nanf("");
    }
    for (std::size_t i = 0; i < set.count; ++i)
      set.labels.push_back(static_cast<std::uint32_t>(i % 10));
    std::vector<std::uint32_t> ids(set.count);
    std::iota(ids.begin(), ids.end(), 0u);
    for (std::size_t i = ids.size(); i > 1; --i) std::swap(ids[i - 1], ids[rng.below(i)]);
    std::vector<float> x(n);
    std::vector<bf16> x16(n);
    std::vector<std::int32_t> y(set.count), y16(set.count);
    assemble_batch(set, ids, x.data(), y.data());
    assemble_batch(set, ids, x16.data(), y16.data());
    EXPECT_EQ(y16, y);
    for (std::size_t i = 0; i < n; ++i)
      ASSERT_EQ(x16[i].bits, to_bf16(x[i]).bits)
          << (images ? "images" : "float features") << ", element " << i;
  }
}

// The files a data folder's loaders read, present or not, links followed; an image folder's
// train/ and test/ trees only where they are folders.
TEST(DataFiles, AreEveryFormatsNamesInTheFolderAndTheImageTrees) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("cohort_data_files_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "runs");
  for (const char* f :
       {"input.txt", "val_tokens.npy", "train-images-idx3-ubyte.gz", "test_y.npy", "train.csv"})
    EXPECT_TRUE(is_data_file(dir, dir / f)) << f;
  EXPECT_TRUE(is_data_file(dir, dir / "runs" / ".." / "input.txt"));
  EXPECT_FALSE(is_data_file(dir, dir / "summary.json"));
  EXPECT_FALSE(is_data_file(dir, dir / "runs" / "input.txt"));
  EXPECT_FALSE(is_data_file(dir, dir / "train" / "cat" / "1.png"));  // no train/ folder
  fs::create_directories(dir / "train" / "cat");
  EXPECT_TRUE(is_data_file(dir, dir / "train" / "cat" / "1.png"));
  EXPECT_TRUE(is_data_file(dir, dir / "train" / "new.json"));
  std::ofstream(dir / "input.txt") << "text";
  fs::create_symlink(dir / "input.txt", dir / "runs" / "link.txt");
  EXPECT_TRUE(is_data_file(dir, dir / "runs" / "link.txt")) << "a link to a data file";
  fs::remove_all(dir);
}

}  // namespace dataset_test
}  // namespace cohort::data
