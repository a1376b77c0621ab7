// Staging (src/train/staging.hpp) on its own: whatever part of a step was staged ahead in the
// step before, the step's rows, labels and bf16 rows are those assembled from the data directly;
// only the rows not staged ahead are assembled again; rows staged for another step are not used.
#include "staging.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "cohort/data/augment.hpp"
#include "cohort/data/dataset.hpp"
#include "train_test_util.hpp"

namespace cohort::train {
namespace staging_test {

using testing::fixture;

struct Shape {
  std::size_t batch, micro_batch;
  bool augment;
  bool bf16;  // rows kept in bf16 (then only in bf16)
};

class StagingPieces : public ::testing::TestWithParam<Shape> {
 protected:
  void SetUp() override {
    const Shape& s = GetParam();
    if (s.augment)
      augmenter.emplace(data::parse_augment("crop:2,flip,erase:0.5"), fixture().train, 3);
    // Two steps of distinct samples (the second is short when the batch does not divide 100).
    for (std::uint32_t i = 0; i < s.batch; ++i) first.push_back((i * 7) % 512);
    for (std::uint32_t i = 0; i < s.batch - s.batch % 3; ++i) second.push_back((i * 13 + 5) % 512);
  }
  // The rows of `ids` in `epoch` assembled directly: x (ids, features) and y.
  void reference(const std::vector<std::uint32_t>& ids, std::uint64_t epoch, std::vector<float>& x,
                 std::vector<std::int32_t>& y) const {
    x.resize(ids.size() * fixture().train.features());
    y.resize(ids.size());
    if (augmenter)
      augmenter->assemble(fixture().train, ids, epoch, /*train=*/true, x.data(), y.data());
    else
      data::assemble_batch(fixture().train, ids, x.data(), y.data());
  }
  std::optional<data::Augmenter> augmenter;
  std::vector<std::uint32_t> first, second;
};

TEST_P(StagingPieces, AStepReadsTheSameRowsWhateverWasStagedAhead) {
  const Shape& s = GetParam();
  const std::size_t f = fixture().train.features();
  std::vector<float> want_x;
  std::vector<std::int32_t> want_y;
  reference(second, 4, want_x, want_y);
  const std::size_t leaves = (second.size() + s.micro_batch - 1) / s.micro_batch;
  const std::size_t pieces_per_leaf = (s.micro_batch + Staging::kPiece - 1) / Staging::kPiece;
  for (std::size_t ahead = 0; ahead <= leaves * pieces_per_leaf + 1; ++ahead) {
    SCOPED_TRACE("pieces staged ahead: " + std::to_string(ahead));
    Staging staging(fixture().train, augmenter ? &*augmenter : nullptr, s.batch, s.micro_batch,
                    s.bf16);
    const Staging::Step one{1, 3, first}, two{2, 4, second};
    staging.begin_step(one, two);
    std::size_t staged = 0;
    while (staged < ahead && staging.stage_ahead()) ++staged;
    // The pieces staged: round robin over the leaves (piece 0 of each leaf, then piece 1, ...).
    std::vector<std::uint8_t> row_ahead(second.size(), 0);
    for (std::size_t k = 0, done = 0; done < staged; ++k) {
      const std::size_t l = k % leaves, j = k / leaves;
      const std::size_t leaf_end = std::min((l + 1) * s.micro_batch, second.size());
      const std::size_t begin = std::min(l * s.micro_batch + j * Staging::kPiece, leaf_end);
      const std::size_t end = std::min(begin + Staging::kPiece, leaf_end);
      if (begin == end) continue;
      std::fill(row_ahead.begin() + begin, row_ahead.begin() + end, 1);
      ++done;
    }
    const std::size_t rows_ahead = std::accumulate(row_ahead.begin(), row_ahead.end(), 0u);
    staging.begin_step(two, {});
    std::size_t assembled = 0;
    for (std::size_t l = 0; l < leaves; ++l) {
      const std::size_t begin = l * s.micro_batch;
      assembled += staging.stage(begin, std::min(s.micro_batch, second.size() - begin));
    }
    EXPECT_EQ(assembled, second.size() - rows_ahead);
    EXPECT_EQ(staging.rows_staged_ahead(), rows_ahead);
    EXPECT_EQ(std::memcmp(staging.y(), want_y.data(), want_y.size() * sizeof(std::int32_t)), 0);
    if (s.bf16) {
      for (std::size_t i = 0; i < second.size() * f; ++i)
        ASSERT_EQ(staging.x16()[i].bits, to_bf16(want_x[i]).bits) << "value " << i;
    } else {
      EXPECT_EQ(std::memcmp(staging.x(), want_x.data(), want_x.size() * sizeof(float)), 0);
    }
  }
}

TEST_P(StagingPieces, RowsStagedForAnotherStepAreNotUsed) {
  const Shape& s = GetParam();
  std::vector<float> want_x;
  std::vector<std::int32_t> want_y;
  reference(second, 5, want_x, want_y);
  Staging staging(fixture().train, augmenter ? &*augmenter : nullptr, s.batch, s.micro_batch,
                  /*bf16_rows=*/false);
  staging.begin_step({1, 3, first}, {2, 4, second});
  while (staging.stage_ahead()) {
  }
  // The step that runs is another epoch's (its augmentation differs), or other ids.
  const std::vector<std::uint32_t> copy = second;
  for (const Staging::Step& other :
       {Staging::Step{2, 5, second}, Staging::Step{2, 4, copy}, Staging::Step{3, 4, second}}) {
    Staging fresh(fixture().train, augmenter ? &*augmenter : nullptr, s.batch, s.micro_batch,
                  false);
    fresh.begin_step({1, 3, first}, {2, 4, second});
    while (fresh.stage_ahead()) {
    }
    fresh.begin_step(other, {});
    EXPECT_EQ(fresh.stage(0, second.size()), second.size());
    EXPECT_EQ(fresh.rows_staged_ahead(), 0u);
  }
  staging.begin_step({2, 5, second}, {});
  staging.stage(0, second.size());
  EXPECT_EQ(std::memcmp(staging.x(), want_x.data(), want_x.size() * sizeof(float)), 0);
}

TEST_P(StagingPieces, RangesThatCutLeavesAreAssembledWhole) {
  // Several ranks stage another rank's rows in runs of 32 that need not match the leaves.
  const Shape& s = GetParam();
  std::vector<float> want_x;
  std::vector<std::int32_t> want_y;
  reference(first, 3, want_x, want_y);
  Staging staging(fixture().train, augmenter ? &*augmenter : nullptr, s.batch, s.micro_batch,
                  false);
  staging.begin_step({1, 3, first}, {});
  std::size_t assembled = 0;
  for (std::size_t at = 0; at < first.size(); at += 7)
    assembled += staging.stage(at, std::min<std::size_t>(7, first.size() - at));
  EXPECT_EQ(assembled, first.size());
  EXPECT_EQ(std::memcmp(staging.x(), want_x.data(), want_x.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(staging.y(), want_y.data(), want_y.size() * sizeof(std::int32_t)), 0);
}

std::string shape_name(const ::testing::TestParamInfo<Shape>& info) {
  return "B" + std::to_string(info.param.batch) + "_M" + std::to_string(info.param.micro_batch) +
         (info.param.augment ? "_augmented" : "") + (info.param.bf16 ? "_bf16" : "");
}

INSTANTIATE_TEST_SUITE_P(Shapes, StagingPieces,
                         ::testing::Values(Shape{64, 32, false, false}, Shape{60, 20, true, true},
                                           Shape{50, 8, false, true}, Shape{40, 40, true, false},
                                           Shape{44, 12, true, true}),
                         shape_name);

}  // namespace staging_test
}  // namespace cohort::train
