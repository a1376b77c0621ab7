// Shared helpers of the reduce tests: seeded data whose sums depend on the order of additions,
// an independent naive oracle (scalar, recursive, float64 too), and a driver that runs one step
// with W workers on a ThreadTeam. Not a fixture library: plain functions.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ostream>
#include <random>
#include <thread>
#include <vector>

#include "cohort/reduce/executor.hpp"
#include "cohort/reduce/reducer.hpp"
#include "cohort/reduce/tree_shape.hpp"
#include "cohort/tensor/buffer.hpp"

namespace cohort::reduce::testing {

// Values spread over 2^-12 .. 2^12 with random signs: float sums of these depend on the order.
inline void fill_leaf(float* data, std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> mantissa(0.5f, 1.0f);
  std::uniform_int_distribution<int> exponent(-12, 12);
  for (std::size_t i = 0; i < n; ++i) {
    const float v = std::ldexp(mantissa(rng), exponent(rng));
    data[i] = (rng() & 1) ? v : -v;
  }
}

struct Leaves {
  std::vector<AlignedBuffer<float>> buffers;
  std::vector<const float*> pointers;
  Leaves(std::size_t leaves, std::size_t n, std::uint64_t seed) {
    for (std::size_t l = 0; l < leaves; ++l) {
      buffers.emplace_back(n);
      fill_leaf(buffers.back().data(), n, seed * 1000003 + l);
      pointers.push_back(buffers.back().data());
    }
  }
};

// Independent oracle: the tree's order written as plain scalar recursion (no shared kernel).
inline float naive_node(const TreeShape& shape, const std::vector<const float*>& leaves,
                        std::uint32_t node, std::size_t i) {
  if (shape.is_leaf(node)) return leaves[node][i];
  const auto children = shape.children(node);
  float acc = naive_node(shape, leaves, children[0], i);
  for (std::size_t j = 1; j < children.size(); ++j)
    acc += naive_node(shape, leaves, children[j], i);
  return acc;
}

// Checks |got - sum64| <= (L-1) * u * sum|x| * scale + u * |sum64 * scale| per element, u = 2^-24:
// the standard bound for any order of L-1 float additions, plus the final multiply's rounding.
inline ::testing::AssertionResult within_float64(const std::vector<const float*>& leaves,
                                                 std::size_t n, const float* got, float scale) {
  const double u = std::ldexp(1.0, -24);
  for (std::size_t i = 0; i < n; ++i) {
    double sum = 0, abs_sum = 0;
    for (const float* leaf : leaves) {
      sum += leaf[i];
      abs_sum += std::fabs(leaf[i]);
    }
    const double s = std::fabs(static_cast<double>(scale));
    const double bound =
        static_cast<double>(leaves.size() - 1) * u * abs_sum * s + u * std::fabs(sum * s) + 1e-300;
    if (std::fabs(static_cast<double>(got[i]) - sum * scale) > bound) {
      return ::testing::AssertionFailure() << "element " << i << ": got " << got[i] << ", float64 "
                                           << sum * scale << ", bound " << bound;
    }
  }
  return ::testing::AssertionSuccess();
}

inline ::testing::AssertionResult bitwise_equal(const float* a, const float* b, std::size_t n) {
  if (n == 0 || std::memcmp(a, b, n * sizeof(float)) == 0) return ::testing::AssertionSuccess();
  for (std::size_t i = 0; i < n; ++i) {
    if (std::memcmp(a + i, b + i, sizeof(float)) != 0) {
      return ::testing::AssertionFailure() << "first difference at element " << i << " of " << n
                                           << ": " << a[i] << " vs " << b[i];
    }
  }
  return ::testing::AssertionFailure();
}

// Random assignment of leaves to W workers, each worker's leaves in random order.
inline std::vector<std::vector<std::size_t>> assign_leaves(std::size_t leaves, std::size_t workers,
                                                           std::mt19937_64& rng) {
  std::vector<std::vector<std::size_t>> plan(workers);
  for (std::size_t l = 0; l < leaves; ++l) plan[rng() % workers].push_back(l);
  for (auto& p : plan) std::shuffle(p.begin(), p.end(), rng);
  return plan;
}

// One step: team member w acts as worker w (team size == W): contributes its leaves, optionally
// after random short delays, then calls finish(w). Returns how many calls reported completion.
inline int run_step(ThreadTeam& team, Reducer& reducer, const std::vector<const float*>& leaves,
                    const std::vector<std::vector<std::size_t>>& plan, Sink sink,
                    std::uint64_t delay_seed = 0) {
  std::atomic<int> completions{0};
  reducer.begin_step(sink);
  team.run([&](std::size_t w) {
    std::mt19937_64 rng(delay_seed * 7919 + w);
    int done = 0;
    for (std::size_t leaf : plan[w]) {
      if (delay_seed != 0) {
        const auto r = rng() % 16;
        if (r == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 30));
        if (r < 4) std::this_thread::yield();
      }
      done += reducer.contribute(w, leaf, leaves[leaf]) ? 1 : 0;
    }
    done += reducer.finish(w) ? 1 : 0;
    completions.fetch_add(done, std::memory_order_relaxed);  // relaxed: read after run() joins
  });
  reducer.wait_step();
  return completions.load(std::memory_order_relaxed);
}

}  // namespace cohort::reduce::testing

namespace cohort::reduce {

// How gtest prints a Strategy (after GetParam() in test lists, and in failures): its name, not its
// bytes. gtest finds it by argument-dependent lookup, so it sits in Strategy's namespace.
inline void PrintTo(Strategy strategy, std::ostream* os) { *os << to_string(strategy); }

}  // namespace cohort::reduce
