// dist::gather_pieces: how an all-gather larger than one MPI call carries (INT_MAX bytes) is cut,
// with small limits injected, and a fake of R ranks' buffers that runs the pieces as MPI would.
#include <gtest/gtest.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "cohort/dist/comm.hpp"

namespace cohort::dist {
namespace gather_test {

// Every rank's buffer after an in-place all-gather of parts `bytes` run as `pieces` (empty: one
// all-gather), each rank r having filled its own part with bytes of value r + 1 and the rest
// with zeros; a broadcast copies the root's piece into every other rank's buffer.
std::vector<std::vector<std::uint8_t>> run_fake(const std::vector<std::size_t>& bytes,
                                                const std::vector<GatherPiece>& pieces) {
  const std::size_t total = std::accumulate(bytes.begin(), bytes.end(), std::size_t{0});
  std::vector<std::vector<std::uint8_t>> ranks(bytes.size(), std::vector<std::uint8_t>(total, 0));
  std::size_t at = 0;
  for (std::size_t r = 0; r < bytes.size(); at += bytes[r++])
    for (std::size_t i = 0; i < bytes[r]; ++i) ranks[r][at + i] = static_cast<std::uint8_t>(r + 1);
  if (pieces.empty()) {
    at = 0;
    for (std::size_t r = 0; r < bytes.size(); at += bytes[r++])
      for (auto& buffer : ranks)
        std::copy_n(ranks[r].begin() + static_cast<std::ptrdiff_t>(at), bytes[r],
                    buffer.begin() + static_cast<std::ptrdiff_t>(at));
  }
  for (const GatherPiece& p : pieces) {
    const auto& root = ranks[static_cast<std::size_t>(p.root)];
    for (auto& buffer : ranks)
      std::copy_n(root.begin() + static_cast<std::ptrdiff_t>(p.offset), p.bytes,
                  buffer.begin() + static_cast<std::ptrdiff_t>(p.offset));
  }
  return ranks;
}

std::vector<std::uint8_t> gathered(const std::vector<std::size_t>& bytes) {
  std::vector<std::uint8_t> all;
  for (std::size_t r = 0; r < bytes.size(); ++r) all.insert(all.end(), bytes[r], r + 1);
  return all;
}

TEST(GatherPieces, OneCallWhenTheWholeGatherFits) {
  EXPECT_TRUE(gather_pieces(std::vector<std::size_t>{3, 0, 5}, 8).empty());
  EXPECT_TRUE(gather_pieces(std::vector<std::size_t>{}, 1).empty());
  EXPECT_TRUE(gather_pieces(std::vector<std::size_t>{INT_MAX}, INT_MAX).empty());
}

// Parts of every size around small limits (empty parts, parts of exactly the limit, one byte
// over): each piece within the limit and its root's part, the parts covered once, in rank order,
// and every rank's buffer ends as the whole gather.
TEST(GatherPieces, SmallLimitsCoverEveryPartOnceAndEveryRankEndsWithAll) {
  const std::vector<std::vector<std::size_t>> cases = {
      {9, 0}, {0, 9}, {4, 4, 4}, {5, 3, 8, 1}, {1, 1, 1, 1, 1}, {16, 0, 0, 7}, {31, 2, 17}};
  for (const auto& bytes : cases)
    for (std::size_t limit : {1, 2, 3, 4, 5, 7, 8}) {
      SCOPED_TRACE("limit " + std::to_string(limit) + ", parts of " + std::to_string(bytes[0]) +
                   " ...");
      const std::vector<GatherPiece> pieces = gather_pieces(bytes, limit);
      const std::size_t total = std::accumulate(bytes.begin(), bytes.end(), std::size_t{0});
      EXPECT_EQ(pieces.empty(), total <= limit);
      std::size_t next = 0, at = 0;
      int root = 0;
      for (const GatherPiece& p : pieces) {
        ASSERT_GT(p.bytes, 0u);
        ASSERT_LE(p.bytes, limit);
        while (at + bytes[static_cast<std::size_t>(root)] <= p.offset &&
               static_cast<std::size_t>(root) + 1 < bytes.size())
          at += bytes[static_cast<std::size_t>(root++)];
        EXPECT_EQ(p.root, root) << "piece at " << p.offset;
        EXPECT_LE(p.offset + p.bytes, at + bytes[static_cast<std::size_t>(root)]);
        EXPECT_EQ(p.offset, next) << "pieces out of order or overlapping";
        next = p.offset + p.bytes;
      }
      if (!pieces.empty()) {
        EXPECT_EQ(next, total);
      }
      for (const auto& buffer : run_fake(bytes, pieces)) EXPECT_EQ(buffer, gathered(bytes));
    }
}

// A model of ~0.7 G parameters on 3 ranks: parts of 1 GiB, 3 GiB in all, past INT_MAX; planned
// only (nothing of that size is allocated).
TEST(GatherPieces, PartsPastIntMaxGoInPiecesOfAtMostIntMax) {
  const std::size_t gib = std::size_t{1} << 30;
  const std::vector<std::size_t> bytes{gib, gib, gib - 4};
  const std::vector<GatherPiece> pieces = gather_pieces(bytes, INT_MAX);
  ASSERT_EQ(pieces.size(), 3u);
  for (std::size_t r = 0; r < 3; ++r) {
    EXPECT_EQ(pieces[r].root, static_cast<int>(r));
    EXPECT_EQ(pieces[r].offset, r * gib);
    EXPECT_EQ(pieces[r].bytes, bytes[r]);
  }
  const std::vector<std::size_t> one{3 * gib};  // one rank's part alone past INT_MAX
  const std::vector<GatherPiece> cut = gather_pieces(one, INT_MAX);
  ASSERT_EQ(cut.size(), 2u);
  EXPECT_EQ(cut[0].bytes, std::size_t{INT_MAX});
  EXPECT_EQ(cut[1].offset, std::size_t{INT_MAX});
  EXPECT_EQ(cut[1].bytes, 3 * gib - INT_MAX);
}

}  // namespace gather_test
}  // namespace cohort::dist
