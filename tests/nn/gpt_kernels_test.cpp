// A language model's own kernels against float64 references. causal_softmax_forward and
// causal_softmax_backward: causal softmax rows of random scores and a random output gradient,
// window lengths below, at and above the eight-wide partial sums and not a multiple of eight; the
// masked entries exactly 0 and never read; the bf16 form the f32 result rounded. gelu_forward
// and gelu_backward: GELU (erf form) and its slope over the range activations take and beyond.
// The attention kernels: each of the six products of random windows against float64 sums, the
// entries above the diagonal neither read nor needed, the other heads' and parts' columns
// untouched.
#include "cohort/nn/gpt_kernels.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
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

std::string window_name(const ::testing::TestParamInfo<std::int64_t>& w) {
  return "T" + std::to_string(w.param);
}

INSTANTIATE_TEST_SUITE_P(Windows, CausalSoftmaxBackward, ::testing::Values(1, 7, 8, 13, 64),
                         window_name);

class CausalSoftmaxForward : public ::testing::TestWithParam<std::int64_t> {};

// Scores in [-8, 8), and in one matrix in [-80, 80) (exponents far below the row's largest);
// the masked entries NaN, which must be neither read nor kept.
TEST_P(CausalSoftmaxForward, MatchesTheFloat64Reference) {
  const std::int64_t T = GetParam(), mats = 3;
  std::printf("seed %llu, T %lld\n", static_cast<unsigned long long>(kSeed),
              static_cast<long long>(T));
  Rng rng({kSeed, static_cast<std::uint64_t>(T), 1});
  std::vector<float> s(static_cast<std::size_t>(mats * T * T));
  for (std::int64_t row = 0; row < mats * T; ++row) {
    const float range = row / T == 1 ? 80.0f : 8.0f;
    for (std::int64_t j = 0; j < T; ++j)
      s[static_cast<std::size_t>(row * T + j)] =
          j <= row % T ? rng.uniform(-range, range) : std::numeric_limits<float>::quiet_NaN();
  }
  std::vector<float> p(s.size(), 1.0f);
  causal_softmax_forward(s.data(), p.data(), mats, T);
  for (std::int64_t row = 0; row < mats * T; ++row) {
    const std::int64_t n = row % T + 1;
    const float* sr = s.data() + row * T;
    double top = sr[0], sum = 0;
    for (std::int64_t k = 1; k < n; ++k) top = std::max<double>(top, sr[k]);
    for (std::int64_t k = 0; k < n; ++k) sum += std::exp(sr[k] - top);
    for (std::int64_t j = 0; j < T; ++j) {
      const float got = p[static_cast<std::size_t>(row * T + j)];
      if (j >= n) {
        ASSERT_EQ(got, 0.0f) << "row " << row << ", column " << j << " (masked)";
        continue;
      }
      const double want = std::exp(sr[j] - top) / sum;
      // Relative: a few float roundings, and that of the score less the largest (the exponent's
      // argument, rounded to float, moves the result by up to |argument| 2^-24 of itself).
      // Near float's smallest normal (1.2e-38 = exp(-87.3)) the kernel flushes to 0: from
      // exp(-88) on always.
      const double argument = std::abs(sr[j] - top);
      if (argument > 87) {
        if (argument > 88) {
          ASSERT_EQ(got, 0.0f) << "row " << row << ", column " << j;
        }
        ASSERT_NEAR(got, want, 1.2e-38) << "row " << row << ", column " << j;
        continue;
      }
      ASSERT_NEAR(got, want, (1e-6 + argument * 6e-8) * want) << "row " << row << ", column " << j;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Windows, CausalSoftmaxForward, ::testing::Values(1, 7, 8, 13, 64),
                         window_name);

// GELU(x) = x Phi(x) and its slope Phi(x) + x phi(x) in float64.
double gelu64(double x) { return 0.5 * x * std::erfc(-x / std::sqrt(2.0)); }
double gelu_slope64(double x) {
  return 0.5 * std::erfc(-x / std::sqrt(2.0)) + x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI);
}

// Every 1/64 from -16 to 16 and random points of [-6, 6), then 0, -0 and the extremes; the
// forward without slopes gives the same values; the backward is the gradient times the slope.
TEST(Gelu, ValuesAndSlopesMatchTheFloat64Reference) {
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  std::vector<float> x;
  for (int i = -16 * 64; i <= 16 * 64; ++i) x.push_back(static_cast<float>(i) / 64.0f);
  Rng rng({kSeed, 2});
  for (int i = 0; i < 1001; ++i) x.push_back(rng.uniform(-6.0f, 6.0f));
  for (const float v : {0.0f, -0.0f, 1e-30f, -1e-30f, 40.0f, -40.0f, 1e30f, -1e30f}) x.push_back(v);
  const auto n = static_cast<std::int64_t>(x.size());
  std::vector<float> g(x.size()), slope(x.size()), g_only(x.size()), dg(x.size()), df(x.size());
  gelu_forward(x.data(), g.data(), slope.data(), n);
  gelu_forward(x.data(), g_only.data(), nullptr, n);
  for (auto& v : dg) v = rng.uniform(-1.0f, 1.0f);
  gelu_backward(dg.data(), slope.data(), df.data(), n);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double v = x[i], want = gelu64(v), want_slope = gelu_slope64(v);
    // Phi to 1e-7 (erf's approximation: Abramowitz and Stegun 7.1.26, 1.5e-7) and float's
    // rounding of the products.
    ASSERT_NEAR(g[i], want, 1e-7 * (1 + std::abs(v)) + 1.2e-7 * std::abs(want)) << "x = " << v;
    ASSERT_NEAR(slope[i], want_slope, 3e-7) << "x = " << v;
    ASSERT_EQ(g_only[i], g[i]) << "x = " << v;
    ASSERT_EQ(df[i], dg[i] * slope[i]) << "x = " << v;
  }
  // Far below zero the function and its slope vanish (no NaN from exp's underflow).
  EXPECT_EQ(g[x.size() - 1], 0.0f);
  EXPECT_EQ(slope[x.size() - 1], 0.0f);
  EXPECT_EQ(g[x.size() - 2], 1e30f);
}

struct AttentionCase {
  const char* name;
  AttentionShape shape;
};

class AttentionKernels : public ::testing::TestWithParam<AttentionCase> {};

// A float64 product entry and the sum of its terms' magnitudes (the rounding scale).
struct Sum {
  double value = 0, magnitude = 0;
  void add(double a, double b) {
    value += a * b;
    magnitude += std::abs(a * b);
  }
};

void expect_close(float got, const Sum& want, double scale, const std::string& where) {
  ASSERT_NEAR(got, scale * want.value, 1e-5 * scale * want.magnitude + 1e-30) << where;
}

TEST_P(AttentionKernels, MatchTheFloat64Products) {
  const AttentionShape a = GetParam().shape;
  const std::int64_t N = a.N, H = a.H, T = a.T, hs = a.hs, C = a.C();
  std::printf("seed %llu, N %lld H %lld T %lld hs %lld\n", static_cast<unsigned long long>(kSeed),
              static_cast<long long>(N), static_cast<long long>(H), static_cast<long long>(T),
              static_cast<long long>(hs));
  ASSERT_TRUE(attention_kernels_fit(T, hs));
  Rng rng({kSeed, static_cast<std::uint64_t>(T), static_cast<std::uint64_t>(hs)});
  auto uniform = [&rng](std::size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = rng.uniform(-1.0f, 1.0f);
    return v;
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const auto tt = static_cast<std::size_t>(N * H * T * T);
  const std::vector<float> qkv = uniform(static_cast<std::size_t>(N * T * 3 * C));
  const std::vector<float> dy = uniform(static_cast<std::size_t>(N * T * C));
  std::vector<float> p = uniform(tt), ds = uniform(tt);  // above the diagonal: NaN, not read
  for (std::size_t r = 0; r < tt / static_cast<std::size_t>(T); ++r)
    for (std::int64_t j = static_cast<std::int64_t>(r) % T + 1; j < T; ++j)
      p[r * static_cast<std::size_t>(T) + static_cast<std::size_t>(j)] =
          ds[r * static_cast<std::size_t>(T) + static_cast<std::size_t>(j)] = nan;
  const float scale = 0.375f;
  auto at_qkv = [&](std::int64_t n, std::int64_t t, std::int64_t which, std::int64_t h,
                    std::int64_t e) {
    return static_cast<std::size_t>((n * T + t) * 3 * C + which * C + h * hs + e);
  };
  auto at_y = [&](std::int64_t n, std::int64_t t, std::int64_t h, std::int64_t e) {
    return static_cast<std::size_t>((n * T + t) * C + h * hs + e);
  };
  auto at_tt = [&](std::int64_t n, std::int64_t h, std::int64_t i, std::int64_t j) {
    return static_cast<std::size_t>(((n * H + h) * T + i) * T + j);
  };

  std::vector<float> s(tt), dp(tt), y(dy.size()), dqkv(qkv.size(), 7.0f);
  attention_scores(qkv.data(), s.data(), a, scale);
  attention_grad_weights(dy.data(), qkv.data(), dp.data(), a);
  attention_values(p.data(), qkv.data(), y.data(), a);
  attention_grad_values(p.data(), dy.data(), dqkv.data(), a);
  for (std::int64_t n = 0; n < N; ++n)  // the value columns only
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t e = 0; e < hs; ++e)
          for (std::int64_t which = 0; which < 2; ++which)
            ASSERT_EQ(dqkv[at_qkv(n, t, which, h, e)], 7.0f) << "dV wrote part " << which;
  attention_grad_queries_keys(ds.data(), qkv.data(), dqkv.data(), a, scale);

  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t h = 0; h < H; ++h) {
      const std::string head = "window " + std::to_string(n) + " head " + std::to_string(h);
      for (std::int64_t i = 0; i < T; ++i)
        for (std::int64_t j = 0; j <= i; ++j) {
          Sum qk, dyv;
          for (std::int64_t e = 0; e < hs; ++e) {
            qk.add(qkv[at_qkv(n, i, 0, h, e)], qkv[at_qkv(n, j, 1, h, e)]);
            dyv.add(dy[at_y(n, i, h, e)], qkv[at_qkv(n, j, 2, h, e)]);
          }
          const std::string where =
              head + " (" + std::to_string(i) + ", " + std::to_string(j) + ")";
          expect_close(s[at_tt(n, h, i, j)], qk, scale, "S " + where);
          expect_close(dp[at_tt(n, h, i, j)], dyv, 1.0, "dP " + where);
        }
      for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t e = 0; e < hs; ++e) {
          Sum pv, dq, dv, dk;
          for (std::int64_t j = 0; j <= t; ++j) {  // keys up to query t
            pv.add(p[at_tt(n, h, t, j)], qkv[at_qkv(n, j, 2, h, e)]);
            dq.add(ds[at_tt(n, h, t, j)], qkv[at_qkv(n, j, 1, h, e)]);
          }
          for (std::int64_t i = t; i < T; ++i) {  // queries from key t on
            dv.add(p[at_tt(n, h, i, t)], dy[at_y(n, i, h, e)]);
            dk.add(ds[at_tt(n, h, i, t)], qkv[at_qkv(n, i, 0, h, e)]);
          }
          const std::string where =
              head + " position " + std::to_string(t) + " column " + std::to_string(e);
          expect_close(y[at_y(n, t, h, e)], pv, 1.0, "Y " + where);
          expect_close(dqkv[at_qkv(n, t, 0, h, e)], dq, scale, "dQ " + where);
          expect_close(dqkv[at_qkv(n, t, 1, h, e)], dk, scale, "dK " + where);
          expect_close(dqkv[at_qkv(n, t, 2, h, e)], dv, 1.0, "dV " + where);
        }
    }
}

// Heads of 8 to 64 dimensions (1 to 8 vectors: groups of 4 and a remainder), windows of 8 to 72.
INSTANTIATE_TEST_SUITE_P(Shapes, AttentionKernels,
                         ::testing::Values(AttentionCase{"T16hs8", {2, 2, 16, 8}},
                                           AttentionCase{"T64hs32", {1, 4, 64, 32}},
                                           AttentionCase{"T8hs40", {2, 1, 8, 40}},
                                           AttentionCase{"T24hs16", {1, 3, 24, 16}},
                                           AttentionCase{"T72hs64", {1, 2, 72, 64}}),
                         [](const ::testing::TestParamInfo<AttentionCase>& c) {
                           return std::string(c.param.name);
                         });

TEST(AttentionKernels, FitWindowsAndHeadsOfWholeVectors) {
  EXPECT_TRUE(attention_kernels_fit(64, 32));
  EXPECT_FALSE(attention_kernels_fit(12, 32));
  EXPECT_FALSE(attention_kernels_fit(64, 12));
  EXPECT_FALSE(attention_kernels_fit(1, 8));
}

}  // namespace gpt_kernels_test
}  // namespace cohort::nn
