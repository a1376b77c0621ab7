// causal_softmax_backward against a float64 reference: causal softmax rows of random scores and a
// random output gradient, window lengths below, at and above the eight-wide partial sums and not
// a multiple of eight; the masked entries exactly 0; the bf16 form the f32 result rounded.
#include "cohort/nn/gpt_kernels.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "cohort/core/rng.hpp"

namespace cohort::nn {
namespace gpt_kernels_test {

constexpr std::uint64_t kSeed = 20261203;

struct Rows {
  std::vector<float> p, dp;
};

// `mats` (T, T) causal softmax outputs of scores in [-4, 4), and gradients in [-1, 1).
Rows random_rows(std::int64_t mats, std::int64_t T, std::uint64_t seed) {
  Rng rng({seed, static_cast<std::uint64_t>(T)});
  Rows r{std::vector<float>(static_cast<std::size_t>(mats * T * T)),
         std::vector<float>(static_cast<std::size_t>(mats * T * T))};
  for (std::int64_t row = 0; row < mats * T; ++row) {
    const std::int64_t n = row % T + 1;
    std::vector<double> e(static_cast<std::size_t>(n));
    double sum = 0;
    for (auto& v : e) sum += v = std::exp(8.0 * rng.next_unit() - 4.0);
    for (std::int64_t j = 0; j < T; ++j) {
      const std::size_t at = static_cast<std::size_t>(row * T + j);
      r.p[at] = j < n ? static_cast<float>(e[static_cast<std::size_t>(j)] / sum) : 0.0f;
      r.dp[at] = static_cast<float>(2.0 * rng.next_unit() - 1.0);
    }
  }
  return r;
}

class CausalSoftmaxBackward : public ::testing::TestWithParam<std::int64_t> {};

TEST_P(CausalSoftmaxBackward, MatchesTheFloat64Reference) {
  const std::int64_t T = GetParam(), mats = 3;
  std::printf("seed %llu, T %lld\n", static_cast<unsigned long long>(kSeed),
              static_cast<long long>(T));
  const Rows r = random_rows(mats, T, kSeed);
  // Unmasked entries past the row: the loop must not read them (NaN would spread).
  std::vector<float> dp = r.dp;
  for (std::int64_t row = 0; row < mats * T; ++row)
    for (std::int64_t j = row % T + 1; j < T; ++j)
      dp[static_cast<std::size_t>(row * T + j)] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> ds(r.p.size(), 1.0f);
  causal_softmax_backward(r.p.data(), dp.data(), ds.data(), mats, T);
  std::vector<bf16> ds16(r.p.size(), bf16{0x3f80});
  causal_softmax_backward(r.p.data(), dp.data(), ds16.data(), mats, T);
  for (std::int64_t row = 0; row < mats * T; ++row) {
    const std::int64_t n = row % T + 1;
    double dot = 0;
    for (std::int64_t k = 0; k < n; ++k) {
      const std::size_t at = static_cast<std::size_t>(row * T + k);
      dot += static_cast<double>(r.p[at]) * r.dp[at];
    }
    for (std::int64_t j = 0; j < T; ++j) {
      const std::size_t at = static_cast<std::size_t>(row * T + j);
      const double want = j < n ? r.p[at] * (r.dp[at] - dot) : 0.0;
      if (j >= n) {
        ASSERT_EQ(ds[at], 0.0f) << "row " << row << ", column " << j << " (masked)";
      } else {
        ASSERT_NEAR(ds[at], want, 2e-6 * (std::abs(want) + r.p[at]))
            << "row " << row << ", column " << j;
      }
      ASSERT_EQ(ds16[at].bits, to_bf16(ds[at]).bits) << "row " << row << ", column " << j;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Windows, CausalSoftmaxBackward, ::testing::Values(1, 7, 8, 13, 64),
                         [](const ::testing::TestParamInfo<std::int64_t>& w) {
                           return "T" + std::to_string(w.param);
                         });

}  // namespace gpt_kernels_test
}  // namespace cohort::nn
