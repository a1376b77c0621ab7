// dist::ShardPlan, dist::even_part, dist::intersect and dist::Watchdog: pure arithmetic and one
// thread, no MPI (built in every configuration).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "cohort/dist/shard_plan.hpp"
#include "cohort/dist/watchdog.hpp"

namespace cohort::dist {
namespace shard_plan_test {

// Counts of items (leaves or chunks): empty, one, small, uneven, and a few hundred.
const std::vector<std::size_t> kCounts = {0,  1,  2,  3,  5,   7,   8,   13,  16,  31,  32, 33,
                                          63, 64, 65, 97, 100, 127, 128, 255, 256, 257, 301};

std::vector<std::size_t> all_ranks() {
  std::vector<std::size_t> r;
  for (std::size_t i = 1; i <= 64; ++i) r.push_back(i);
  return r;
}

// Checks that even_part(n, parts, .) tiles [0, n) contiguously in part order, sizes differing by
// at most one, larger parts first.
void expect_tiling(std::size_t n, std::size_t parts) {
  SCOPED_TRACE("n=" + std::to_string(n) + " parts=" + std::to_string(parts));
  std::size_t next = 0, min_size = n, max_size = 0, prev_size = n + 1;
  for (std::size_t p = 0; p < parts; ++p) {
    const Range r = even_part(n, parts, p);
    ASSERT_EQ(r.begin, next) << "part " << p << " not contiguous with the previous";
    ASSERT_LE(r.begin, r.end);
    EXPECT_EQ(r.size(), r.end - r.begin);
    EXPECT_EQ(r.empty(), r.size() == 0);
    EXPECT_LE(r.size(), prev_size) << "part " << p << ": a smaller part before a larger one";
    prev_size = r.size();
    min_size = std::min(min_size, r.size());
    max_size = std::max(max_size, r.size());
    next = r.end;
  }
  EXPECT_EQ(next, n) << "the parts do not end at n";
  EXPECT_LE(max_size - min_size, 1u);
  EXPECT_EQ(max_size, (n + parts - 1) / parts);
  EXPECT_EQ(min_size, n / parts);
}

class EvenPartTest : public ::testing::TestWithParam<std::size_t> {};

TEST_P(EvenPartTest, TilesEveryCountContiguously) {
  const std::size_t parts = GetParam();
  for (std::size_t n : kCounts) expect_tiling(n, parts);
  for (std::size_t n = 0; n <= 3 * parts + 2; ++n) expect_tiling(n, parts);
}

INSTANTIATE_TEST_SUITE_P(Parts, EvenPartTest, ::testing::ValuesIn(all_ranks()),
                         [](const ::testing::TestParamInfo<std::size_t>& param_info) {
                           return "parts_" + std::to_string(param_info.param);
                         });

// Leaf counts (at least one) and chunk counts (zero allowed), against every rank count 1..64.
const std::vector<std::size_t> kLeafCounts = {1,  2,  3,  4,  5,  7,   8,   9,   15,  16,  17, 31,
                                              32, 33, 63, 64, 65, 100, 127, 128, 200, 257, 301};

void check_plan(std::size_t ranks, std::size_t leaves, std::size_t chunks) {
  SCOPED_TRACE("R=" + std::to_string(ranks) + " leaves=" + std::to_string(leaves) +
               " chunks=" + std::to_string(chunks));
  const ShardPlan plan(leaves, chunks, ranks);
  EXPECT_EQ(plan.ranks(), ranks);
  EXPECT_EQ(plan.leaves(), leaves);
  EXPECT_EQ(plan.chunks(), chunks);

  std::vector<int> leaf_seen(leaves, 0), chunk_seen(chunks, 0);
  std::size_t next_leaf = 0, next_chunk = 0;
  std::size_t leaf_min = leaves, leaf_max = 0, chunk_min = chunks, chunk_max = 0;
  for (std::size_t r = 0; r < ranks; ++r) {
    const Range lr = plan.leaves_of(r), cr = plan.chunks_of(r);
    ASSERT_EQ(lr.begin, next_leaf) << "rank " << r << ": leaf runs not contiguous in rank order";
    ASSERT_EQ(cr.begin, next_chunk) << "rank " << r << ": chunk runs not contiguous in rank order";
    ASSERT_LE(lr.begin, lr.end);
    ASSERT_LE(cr.begin, cr.end);
    ASSERT_LE(lr.end, leaves);
    ASSERT_LE(cr.end, chunks);
    for (std::size_t l = lr.begin; l < lr.end; ++l) {
      ++leaf_seen[l];
      ASSERT_EQ(plan.leaf_rank(l), r) << "leaf " << l;
    }
    for (std::size_t c = cr.begin; c < cr.end; ++c) {
      ++chunk_seen[c];
      ASSERT_EQ(plan.chunk_owner(c), r) << "chunk " << c;
    }
    leaf_min = std::min(leaf_min, lr.size());
    leaf_max = std::max(leaf_max, lr.size());
    chunk_min = std::min(chunk_min, cr.size());
    chunk_max = std::max(chunk_max, cr.size());
    next_leaf = lr.end;
    next_chunk = cr.end;
    // A rank has no leaves (chunks) exactly when there are fewer leaves (chunks) than ranks and
    // it is past the first ones; the first L % R ranks get one leaf more.
    EXPECT_EQ(lr.empty(), r >= leaves) << "rank " << r;
    EXPECT_EQ(cr.empty(), r >= chunks) << "rank " << r;
    EXPECT_EQ(lr.size(), leaves / ranks + (r < leaves % ranks ? 1 : 0)) << "rank " << r;
    EXPECT_EQ(cr.size(), chunks / ranks + (r < chunks % ranks ? 1 : 0)) << "rank " << r;
  }
  EXPECT_EQ(next_leaf, leaves);
  EXPECT_EQ(next_chunk, chunks);
  for (std::size_t l = 0; l < leaves; ++l) ASSERT_EQ(leaf_seen[l], 1) << "leaf " << l;
  for (std::size_t c = 0; c < chunks; ++c) ASSERT_EQ(chunk_seen[c], 1) << "chunk " << c;
  EXPECT_LE(leaf_max - leaf_min, 1u);
  if (chunks > 0) {
    EXPECT_LE(chunk_max - chunk_min, 1u);
  }

  // intersect: each window of [0, chunks + 5) meets the ranks' runs in pieces that tile it.
  const std::vector<std::size_t> cuts = {
      0, 1, chunks / 3, chunks / 2, chunks > 0 ? chunks - 1 : 0, chunks, chunks + 5};
  for (std::size_t b : cuts)
    for (std::size_t e : cuts) {
      if (b > e) continue;
      std::size_t covered = 0;
      for (std::size_t r = 0; r < ranks; ++r) {
        const Range run = plan.chunks_of(r);
        const Range x = intersect(run, b, e);
        ASSERT_LE(x.begin, x.end);
        if (x.empty()) {
          EXPECT_TRUE(b == e || run.empty() || run.end <= b || run.begin >= e)
              << "rank " << r << " window [" << b << ", " << e << ")";
          continue;
        }
        EXPECT_EQ(x.begin, std::max(run.begin, b));
        EXPECT_EQ(x.end, std::min(run.end, e));
        covered += x.size();
      }
      EXPECT_EQ(covered, std::min(e, chunks) - std::min(b, chunks))
          << "window [" << b << ", " << e << ")";
    }
}

class ShardPlanTest : public ::testing::TestWithParam<std::size_t> {};

TEST_P(ShardPlanTest, CoversEachLeafAndChunkOnceInRankOrder) {
  const std::size_t ranks = GetParam();
  for (std::size_t leaves : kLeafCounts)
    for (std::size_t chunks : kCounts) {
      check_plan(ranks, leaves, chunks);
      if (HasFatalFailure()) return;
    }
  // Every small leaf count around R (R > leaves, R == leaves, R < leaves).
  for (std::size_t leaves = 1; leaves <= ranks + 3; ++leaves) {
    check_plan(ranks, leaves, leaves + 1);
    if (HasFatalFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, ShardPlanTest, ::testing::ValuesIn(all_ranks()),
                         [](const ::testing::TestParamInfo<std::size_t>& param_info) {
                           return "R" + std::to_string(param_info.param);
                         });

TEST(IntersectTest, Cases) {
  const Range r{10, 20};
  Range x = intersect(r, 0, 5);
  EXPECT_TRUE(x.empty());
  x = intersect(r, 25, 30);
  EXPECT_TRUE(x.empty());
  x = intersect(r, 20, 30);  // touching: empty
  EXPECT_TRUE(x.empty());
  x = intersect(r, 0, 10);
  EXPECT_TRUE(x.empty());
  x = intersect(r, 5, 15);
  EXPECT_EQ(x.begin, 10u);
  EXPECT_EQ(x.end, 15u);
  x = intersect(r, 12, 18);
  EXPECT_EQ(x.begin, 12u);
  EXPECT_EQ(x.end, 18u);
  x = intersect(r, 0, 100);
  EXPECT_EQ(x.begin, 10u);
  EXPECT_EQ(x.end, 20u);
  x = intersect(Range{7, 7}, 0, 100);
  EXPECT_TRUE(x.empty());
  x = intersect(r, 15, 15);
  EXPECT_TRUE(x.empty());
}

using namespace std::chrono_literals;

// The watchdog's decisions on a clock the test moves by hand: no assertion depends on how fast
// this machine runs.
struct FakeClock {
  Watchdog::TimePoint t{};
  std::function<Watchdog::TimePoint()> fn() {
    return [this] { return t; };
  }
};

TEST(WatchdogTest, FiresOnceAfterTheTimeoutWithoutBeats) {
  FakeClock clock;
  std::vector<double> idle;
  Watchdog dog(
      2s, [&](double s) { idle.push_back(s); }, clock.fn());
  clock.t += 1999ms;
  EXPECT_FALSE(dog.check());
  clock.t += 1ms;
  EXPECT_TRUE(dog.check());
  ASSERT_EQ(idle.size(), 1u);
  EXPECT_DOUBLE_EQ(idle[0], 2.0);
  clock.t += 10s;  // still only once
  EXPECT_FALSE(dog.check());
  EXPECT_EQ(idle.size(), 1u);
}

TEST(WatchdogTest, EachBeatSeenRestartsTheTimeout) {
  FakeClock clock;
  int fired = 0;
  Watchdog dog(
      2s, [&](double) { ++fired; }, clock.fn());
  for (int i = 0; i < 100; ++i) {  // 150 s of clock time, a beat between checks 1.5 s apart
    clock.t += 1500ms;
    dog.beat();
    EXPECT_FALSE(dog.check()) << "check " << i;
  }
  clock.t += 1999ms;  // the beats stop: the timeout counts from the last check that saw one
  EXPECT_FALSE(dog.check());
  clock.t += 1ms;
  EXPECT_TRUE(dog.check());
  EXPECT_EQ(fired, 1);
}

TEST(WatchdogTest, TimeoutZeroOrBelowNeverFires) {
  FakeClock clock;
  int fired = 0;
  for (auto timeout : {0s, -1s}) {
    Watchdog dog(
        timeout, [&](double) { ++fired; }, clock.fn());
    clock.t += 1000s;
    EXPECT_FALSE(dog.check());
  }
  EXPECT_EQ(fired, 0);
}

// A pause (rank 0 writing a checkpoint, the others waiting for it) is not idle time, however
// long, nested or unseen by any check; after the last resume the timeout counts afresh.
TEST(WatchdogTest, TimePausedIsNotIdle) {
  FakeClock clock;
  int fired = 0;
  Watchdog dog(
      2s, [&](double) { ++fired; }, clock.fn());
  clock.t += 1500ms;  // idle before the pause
  dog.pause();
  for (int i = 0; i < 10; ++i) {
    clock.t += 1500ms;
    EXPECT_FALSE(dog.check()) << "paused, check " << i;
  }
  dog.pause();  // nested: still paused after the inner resume
  clock.t += 5s;
  dog.resume();
  clock.t += 5s;
  EXPECT_FALSE(dog.check());
  dog.resume();
  clock.t += 1999ms;
  EXPECT_FALSE(dog.check());  // sees the resume: the timeout counts from here
  clock.t += 1999ms;
  EXPECT_FALSE(dog.check());
  clock.t += 1ms;
  EXPECT_TRUE(dog.check());
  EXPECT_EQ(fired, 1);

  // A pause that no check saw (shorter than the thread's period) counts as a beat.
  Watchdog unseen(
      2s, [&](double) { ++fired; }, clock.fn());
  clock.t += 1500ms;
  {
    WatchdogPause writing(&unseen);
    clock.t += 30s;
  }
  EXPECT_FALSE(unseen.check());
  clock.t += 1999ms;
  EXPECT_FALSE(unseen.check());
  clock.t += 1ms;
  EXPECT_TRUE(unseen.check());
  EXPECT_EQ(fired, 2);
  WatchdogPause none(nullptr);  // no watchdog (one rank): nothing to pause
}

// The thread: with no beats it fires (waited for without a time bound of its own: ctest's
// timeout ends a hang), beats from another thread are seen, and destruction stops it.
TEST(WatchdogTest, ThreadFiresWithoutBeatsAndStopsWhenDestroyed) {
  std::atomic<int> fired{0};
  {
    Watchdog dog(0.05s, [&](double s) {
      EXPECT_GE(s, 0.05);
      fired.fetch_add(1);
    });
    while (fired.load() == 0) std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(fired.load(), 1);
  {
    Watchdog quiet(3600s, [&](double) { fired.fetch_add(1); });
    std::thread beater([&] { quiet.beat(); });
    beater.join();
  }  // returns without waiting out the period
  EXPECT_EQ(fired.load(), 1);
}

}  // namespace shard_plan_test
}  // namespace cohort::dist
