// The ranks' agreement before work (agreement.hpp, train_command, refuse_train) with ranks as
// threads (ThreadComm): a failure of any kind on one rank, or ranks that differ in what they
// would train, ends every rank with the same lines, printed by rank 0.
#include "agreement.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <future>
#include <iostream>
#include <new>
#include <sstream>
#include <thread>

#include "../train/thread_comm.hpp"
#include "cohort/data/dataset.hpp"
#include "commands.hpp"

namespace cohort::cli {
namespace agreement_test {

using train::testing::ThreadComm;
using train::testing::ThreadWorld;
using Lines = std::vector<std::string>;

// Runs `rank_body` on `ranks` threads, each with its rank's comm; returns each rank's outcome:
// the lines of its JobInputError, or "returned <code>". A rank still waiting after 30 s (for a
// peer that never joined a collective) ends the test binary: its thread cannot be stopped.
std::vector<Lines> on_ranks(int ranks, const std::function<int(int, dist::Comm&)>& rank_body) {
  auto world = std::make_shared<ThreadWorld>(ranks);
  std::vector<std::future<Lines>> outcomes;
  for (int r = 0; r < ranks; ++r) {
    std::packaged_task<Lines()> task([world, r, rank_body] {
      ThreadComm comm(*world, r);
      try {
        return Lines{"returned " + std::to_string(rank_body(r, comm))};
      } catch (const JobInputError& e) {
        return e.lines();
      }
    });
    outcomes.push_back(task.get_future());
    std::thread(std::move(task)).detach();
  }
  std::vector<Lines> lines;
  for (int r = 0; r < ranks; ++r) {
    auto& outcome = outcomes[static_cast<std::size_t>(r)];
    if (outcome.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
      std::cerr << "rank " << r << " still waiting after 30 s: a rank never joined\n";
      std::_Exit(1);
    }
    lines.push_back(outcome.get());
  }
  return lines;
}

// A quick run's options on the fixture (training never starts in these tests).
TrainOptions quick() {
  TrainOptions o;
  o.data_dir = COHORT_FIXTURE_DIR;
  o.config.model = "mlp:784-16-10";
  o.config.batch = 64;
  o.config.steps = 1;
  o.quiet = true;
  return o;
}

Loaders fixture_loaders() {
  Loaders l;
  l.data = [](const std::string& dir, std::size_t) {
    return std::make_shared<const data::Splits>(data::load_data_folder(dir));
  };
  return l;
}

TEST(Agreement, AnyExceptionOnOneRankEndsEveryRankWithItsMessage) {
  // std::bad_alloc while rank 1 loads its data: not an InputError, the rank's message all the same.
  const std::vector<Lines> got = on_ranks(3, [](int rank, dist::Comm& comm) {
    Loaders loaders = fixture_loaders();
    if (rank == 1)
      loaders.data = [](const std::string&, std::size_t) -> std::shared_ptr<const data::Splits> {
        throw std::bad_alloc();
      };
    std::ostringstream out;
    return train_command(quick(), loaders, out, out, comm);
  });
  for (const Lines& lines : got) EXPECT_EQ(lines, Lines{"rank 1: internal error: std::bad_alloc"});
}

TEST(Agreement, ARankWhoseCommandLineFailedJoinsTheOthers) {
  const std::vector<Lines> got = on_ranks(2, [](int rank, dist::Comm& comm) {
    if (rank == 1) throw JobInputError(refuse_train("--config x.toml: missing", comm));
    std::ostringstream out;
    return train_command(quick(), fixture_loaders(), out, out, comm);
  });
  for (const Lines& lines : got) EXPECT_EQ(lines, Lines{"rank 1: --config x.toml: missing"});
}

TEST(Agreement, RanksThatDifferAreNamedWithWhatEachHas) {
  const std::vector<Lines> got = on_ranks(2, [](int rank, dist::Comm& comm) {
    TrainOptions o = quick();
    if (rank == 1) o.config.seed = 7;
    std::ostringstream out;
    return train_command(o, fixture_loaders(), out, out, comm);
  });
  for (const Lines& lines : got)
    EXPECT_EQ(lines, Lines{"ranks differ in the effective config: seed (rank 0: 1; rank 1: 7)"});
}

Stand stand(std::optional<std::string> problem, std::uint64_t digest, std::string shown) {
  Stand s;
  s.problem = std::move(problem);
  s.facts.resize(2);
  s.facts[0] = {.what = "the thing", .known = true, .digest = digest, .shown = std::move(shown)};
  s.facts[1] = {.what = "the settings",
                .json_object = true,
                .known = true,
                .digest = 5,
                .shown = R"({"a":1,"b":{"c":"x"}})"};
  return s;
}

TEST(Agreement, ReturnsOnEveryRankWhenAllAgree) {
  const std::vector<Lines> got = on_ranks(3, [](int, dist::Comm& comm) {
    agree(comm, stand(std::nullopt, 9, "nine"));
    return 0;
  });
  for (const Lines& lines : got) EXPECT_EQ(lines, Lines{"returned 0"});
}

TEST(Agreement, DifferencesThenEachDistinctProblemOnce) {
  const std::vector<Lines> got = on_ranks(4, [](int rank, dist::Comm& comm) {
    Stand s = stand(rank >= 2 ? std::optional<std::string>("disk full") : std::nullopt,
                    rank == 1 ? 8 : 9, rank == 1 ? "nine" : "nine");
    if (rank == 3) {
      s.facts[1].digest = 6;
      s.facts[1].shown = R"({"a":1,"b":{"c":"y"}})";
    }
    agree(comm, s);
    return 0;
  });
  const Lines want{
      "ranks differ in the thing: ranks 0, 2, 3: nine (digest 0000000000000009); "
      "rank 1: nine (digest 0000000000000008)",
      "ranks differ in the settings: b.c (ranks 0, 1, 2: \"x\"; rank 3: \"y\")",
      "ranks 2, 3: disk full"};
  for (const Lines& lines : got) EXPECT_EQ(lines, want);
}

TEST(Agreement, AProblemEveryRankHasIsPrintedWithoutRanks) {
  const std::vector<Lines> got = on_ranks(3, [](int, dist::Comm& comm) {
    Stand s = stand("--batch: expected 1 .. 512, found 0", 9, "nine");
    s.facts[0].known = false;  // failed before it could tell
    agree(comm, s);
    return 0;
  });
  for (const Lines& lines : got) EXPECT_EQ(lines, Lines{"--batch: expected 1 .. 512, found 0"});
}

}  // namespace agreement_test
}  // namespace cohort::cli
