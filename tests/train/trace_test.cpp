// Traces: every leaf of every step has one forward and one backward span on one replica's track,
// root chunks cover the model once per step, and spans on a track nest or are disjoint (so a
// trace viewer draws them as a call stack).
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <tuple>

#include "cohort/train/trainer.hpp"
#include "train_test_util.hpp"
#include "tuning.hpp"

namespace cohort::train {
namespace trace_test {

using testing::fixture;
using testing::Recorder;

TrainConfig traced(std::size_t workers, float clip) {
  TrainConfig c;
  c.model = "mlp:784-64-10";
  c.batch = 64;
  c.micro_batch = 16;
  c.workers = workers;
  c.steps = 9;  // the fixture's first epoch (8 steps) and one more: two evaluations
  c.clip_norm = clip;
  c.trace = true;
  return c;
}

class Trace : public ::testing::TestWithParam<std::tuple<std::size_t, float>> {};

TEST_P(Trace, CoversEveryLeafAndChunkAndNestsPerTrack) {
  const auto [workers, clip] = GetParam();
  Trainer t(traced(workers, clip), fixture());
  Recorder r;
  t.run(r);
  const auto spans = t.trace();
  const auto tracks = t.trace_tracks();
  ASSERT_EQ(tracks.size(), workers + 2);
  EXPECT_EQ(tracks.front(), "replica 0");
  EXPECT_EQ(tracks.back(), "controller");
  EXPECT_FALSE(t.trace_truncated());
  const std::size_t n = t.model().layout().total(), chunk = kRootChunk;
  const std::size_t chunks = (n + chunk - 1) / chunk;
  std::map<std::tuple<std::uint64_t, std::size_t>, std::uint32_t> forward_track;
  std::map<std::string, int> count;
  std::map<std::uint64_t, std::set<std::size_t>> applied_chunks;
  for (const TraceSpan& s : spans) {
    ASSERT_LE(s.begin_us, s.end_us) << s.name;
    ASSERT_LT(s.track, tracks.size());
    ++count[s.name];
    const std::string name = s.name;
    if (name == "forward") {
      EXPECT_TRUE(forward_track.emplace(std::make_tuple(s.step, s.index), s.track).second)
          << "two forwards of step " << s.step << " leaf " << s.index;
      EXPECT_LT(s.track, workers);
    }
    if (name == "sum+optimizer" || name == "optimizer") applied_chunks[s.step].insert(s.index);
  }
  for (const TraceSpan& s : spans) {
    if (std::string(s.name) != "backward") continue;
    EXPECT_EQ(forward_track.at({s.step, s.index}), s.track) << "backward on another track";
  }
  EXPECT_EQ(forward_track.size(), 9u * 4u);  // 4 leaves per step
  EXPECT_EQ(count["backward"], 36);
  EXPECT_EQ(count["combine"], 36);
  EXPECT_EQ(count["step"], 9);
  EXPECT_EQ(count["evaluate"], 2);
  if (clip > 0) {
    EXPECT_EQ(count["sum"], int(9 * chunks));
  }
  for (std::uint64_t step = 1; step <= 9; ++step)
    EXPECT_EQ(applied_chunks[step].size(), chunks) << "step " << step;
  // Per track, sorted by start: each span ends before the next starts or contains it.
  for (std::size_t i = 1; i < spans.size(); ++i) {
    if (spans[i].track != spans[i - 1].track) continue;
    std::size_t j = i - 1;  // the nearest earlier span that is still open contains this one
    while (j > 0 && spans[j].track == spans[i].track && spans[j].end_us <= spans[i].begin_us) --j;
    if (spans[j].track == spans[i].track && spans[j].end_us > spans[i].begin_us) {
      EXPECT_GE(spans[j].end_us, spans[i].end_us)
          << spans[j].name << " and " << spans[i].name << " overlap on track " << spans[i].track;
    }
  }
}

// W3_clip: 3 workers, clipping on (the two-phase root).
std::string trace_name(const ::testing::TestParamInfo<std::tuple<std::size_t, float>>& info) {
  const auto [workers, clip] = info.param;
  return "W" + std::to_string(workers) + (clip > 0 ? "_clip" : "");
}

INSTANTIATE_TEST_SUITE_P(WorkersAndRoot, Trace,
                         ::testing::Values(std::make_tuple(std::size_t{1}, 0.0f),
                                           std::make_tuple(std::size_t{2}, 0.0f),
                                           std::make_tuple(std::size_t{3}, 1.0f)),
                         trace_name);

TEST(Trace, OffRecordsNothing) {
  TrainConfig c = traced(2, 0);
  c.trace = false;
  Trainer t(c, fixture());
  Recorder r;
  t.run(r);
  EXPECT_TRUE(t.trace().empty());
}

}  // namespace trace_test
}  // namespace cohort::train
