// ThreadTeam and InlineExecutor: every index exactly once, nesting, concurrency, errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "cohort/reduce/executor.hpp"

namespace cohort::reduce {
namespace executor_test {

TEST(InlineExecutor, RunsEveryIndexInOrder) {
  InlineExecutor ex;
  std::vector<std::size_t> order;
  ex.parallel_for(5, [&](std::size_t i) { order.push_back(i); });
  EXPECT_EQ(order, (std::vector<std::size_t>{0, 1, 2, 3, 4}));
}

TEST(ThreadTeam, RunCallsEveryMemberOnce) {
  for (std::size_t size : {1, 2, 3, 8}) {
    ThreadTeam team(size);
    for (int rep = 0; rep < 50; ++rep) {
      std::vector<int> calls(size, 0);  // distinct elements per member: no race
      team.run([&](std::size_t m) { ++calls[m]; });
      for (int c : calls) ASSERT_EQ(c, 1);
    }
  }
}

// Every member issues its own parallel_for at the same time; every index of every one runs once.
TEST(ThreadTeam, ConcurrentParallelForCoversEachIndexOnce) {
  for (std::size_t size : {1, 2, 4, 7}) {
    ThreadTeam team(size);
    const std::size_t n = 257;
    for (int rep = 0; rep < 20; ++rep) {
      std::vector<std::vector<int>> hits(size, std::vector<int>(n, 0));
      team.run([&](std::size_t m) {
        team.parallel_for(n, [&](std::size_t i) {
          ++hits[m][i];
          // nested: runs inline
          team.parallel_for(2, [&](std::size_t) {});
        });
      });
      for (const auto& h : hits) {
        for (int x : h) ASSERT_EQ(x, 1);
      }
    }
  }
}

// Only one member issues work; the others, idle, must help. The issuer holds its first index
// until another thread has run one (or 10 s have passed): an executor that left the issuer alone
// would pass a check of coverage only, but not this one.
TEST(ThreadTeam, IdleMembersHelpOneIssuer) {
  ThreadTeam team(4);
  std::vector<std::atomic<int>> hits(1000);
  std::atomic<bool> helped{false};
  team.run([&](std::size_t m) {
    if (m != 2) return;
    const std::thread::id issuer = std::this_thread::get_id();
    bool held = false;  // the issuer's own: only it reads or writes it
    team.parallel_for(hits.size(), [&](std::size_t i) {
      hits[i].fetch_add(1, std::memory_order_relaxed);  // relaxed: counted after run() joins
      if (std::this_thread::get_id() != issuer) {
        helped.store(true, std::memory_order_relaxed);  // relaxed: a flag, no data behind it
        return;
      }
      if (held) return;  // hold one index only: without help, wait once
      held = true;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (!helped.load(std::memory_order_relaxed) && std::chrono::steady_clock::now() < deadline)
        std::this_thread::yield();
    });
  });
  EXPECT_TRUE(helped.load()) << "no idle member ran an index of member 2's parallel_for";
  for (auto& h : hits) ASSERT_EQ(h.load(std::memory_order_relaxed), 1);
}

TEST(ThreadTeam, OutsideCallerRunsInline) {
  ThreadTeam team(3);
  const std::thread::id caller = std::this_thread::get_id();
  std::vector<std::size_t> order;  // a plain vector: only the caller may touch it
  team.parallel_for(10, [&](std::size_t i) {
    EXPECT_EQ(std::this_thread::get_id(), caller) << "index " << i;
    order.push_back(i);
  });
  std::sort(order.begin(), order.end());  // inline, in whatever order
  EXPECT_EQ(order, (std::vector<std::size_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
}

TEST(ThreadTeam, RethrowsFirstJobException) {
  ThreadTeam team(3);
  EXPECT_THROW(team.run([](std::size_t m) {
    if (m == 1) throw std::runtime_error("boom");
  }),
               std::runtime_error);
  int ran = 0;
  team.run([&](std::size_t m) {
    if (m == 0) ++ran;
  });
  EXPECT_EQ(ran, 1);  // the team is still usable
}

}  // namespace executor_test
}  // namespace cohort::reduce
