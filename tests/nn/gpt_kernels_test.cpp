// A language model's own kernels against float64 references. causal_softmax_forward and
// causal_softmax_backward: causal softmax rows of random scores and a random output gradient,
// window lengths below, at and above the eight-wide partial sums and not a multiple of eight, at
// the scales 1, 1/8 (a head size of 64) and 1/sqrt(32) (not a power of two); the masked entries
// exactly 0 and never read; the bf16 forms the f32 results rounded. gelu_forward and
// gelu_backward: GELU (the erf form and GPT-2's tanh form) and its slope over the range
// activations take and beyond; their bf16 forms the f32 results rounded, the forward's table
// lookups at every bf16 value. LayerNorm with and without its bias; bias_backward's column sums;
// token_cross_entropy, the head's loss and its gradient.
#include "cohort/nn/gpt/gpt_kernels.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
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

// A window length and the scores' scale.
using Window = std::tuple<std::int64_t, float>;

class CausalSoftmaxBackward : public ::testing::TestWithParam<Window> {};

TEST_P(CausalSoftmaxBackward, MatchesTheFloat64Reference) {
  const auto [T, scale] = GetParam();
  const std::int64_t mats = 3;
  std::printf("seed %llu, T %lld, scale %.9g\n", static_cast<unsigned long long>(kSeed),
              static_cast<long long>(T), static_cast<double>(scale));
  const Rows r = random_rows(mats, T, kSeed);
  // Unmasked entries past the row: the loop must not read them (NaN would spread).
  std::vector<float> dp = r.dp;
  for (std::int64_t row = 0; row < mats * T; ++row)
    for (std::int64_t j = row % T + 1; j < T; ++j)
      dp[static_cast<std::size_t>(row * T + j)] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> ds(r.p.size(), 1.0f);
  causal_softmax_backward(r.p.data(), dp.data(), nullptr, ds.data(), mats, T, scale);
  std::vector<bf16> ds16(r.p.size(), bf16{0x3f80});
  causal_softmax_backward(r.p.data(), dp.data(), nullptr, ds16.data(), mats, T, scale);
  for (std::int64_t row = 0; row < mats * T; ++row) {
    const std::int64_t n = row % T + 1;
    double dot = 0;
    for (std::int64_t k = 0; k < n; ++k) {
      const std::size_t at = static_cast<std::size_t>(row * T + k);
      dot += static_cast<double>(r.p[at]) * r.dp[at];
    }
    for (std::int64_t j = 0; j < T; ++j) {
      const std::size_t at = static_cast<std::size_t>(row * T + j);
      const double want = j < n ? scale * (r.p[at] * (r.dp[at] - dot)) : 0.0;
      if (j >= n) {
        ASSERT_EQ(ds[at], 0.0f) << "row " << row << ", column " << j << " (masked)";
      } else {
        ASSERT_NEAR(ds[at], want, 2e-6 * (std::abs(want) + scale * r.p[at]))
            << "row " << row << ", column " << j;
      }
      ASSERT_EQ(ds16[at].bits, to_bf16(ds[at]).bits) << "row " << row << ", column " << j;
    }
  }
  // Through a dropout mask (0 or 1.25; NaN past each row's diagonal, never read): the same bits
  // as the unmasked form given dp times the mask.
  Rng rng({kSeed, static_cast<std::uint64_t>(T), 2});
  std::vector<float> mask(dp.size()), masked(dp);
  for (std::int64_t row = 0; row < mats * T; ++row)
    for (std::int64_t j = 0; j < T; ++j) {
      const auto at = static_cast<std::size_t>(row * T + j);
      mask[at] = j > row % T              ? std::numeric_limits<float>::quiet_NaN()
                 : rng.next_unit() < 0.2f ? 0.0f
                                          : 1.25f;
      if (j <= row % T) masked[at] = dp[at] * mask[at];
    }
  std::vector<float> want(ds.size()), got(ds.size());
  std::vector<bf16> got16(ds.size());
  causal_softmax_backward(r.p.data(), masked.data(), nullptr, want.data(), mats, T, scale);
  causal_softmax_backward(r.p.data(), dp.data(), mask.data(), got.data(), mats, T, scale);
  causal_softmax_backward(r.p.data(), dp.data(), mask.data(), got16.data(), mats, T, scale);
  for (std::size_t i = 0; i < ds.size(); ++i) {
    ASSERT_EQ(std::bit_cast<std::uint32_t>(got[i]), std::bit_cast<std::uint32_t>(want[i]))
        << "entry " << i << ", dropout";
    ASSERT_EQ(got16[i].bits, to_bf16(want[i]).bits) << "entry " << i << ", dropout";
  }
}

const float kRsqrt32 = 1.0f / std::sqrt(32.0f);

std::string window_name(const ::testing::TestParamInfo<Window>& w) {
  const float scale = std::get<1>(w.param);
  return "T" + std::to_string(std::get<0>(w.param)) + "_Scale" +
         (scale == 1.0f     ? "1"
          : scale == 0.125f ? "OneEighth"
                            : "Rsqrt32");
}

const auto kWindows = ::testing::Combine(::testing::Values(1, 7, 8, 13, 64),
                                         ::testing::Values(1.0f, 0.125f, kRsqrt32));

INSTANTIATE_TEST_SUITE_P(Windows, CausalSoftmaxBackward, kWindows, window_name);

class CausalSoftmaxForward : public ::testing::TestWithParam<Window> {};

// Scores in [-8, 8), and in one matrix in [-80, 80) (exponents far below the row's largest);
// the masked entries NaN, which must be neither read nor kept. The reference is the softmax of
// the scaled scores each rounded to float (the kernel may skip that rounding: within the
// tolerance's rounding of the exponent's argument).
TEST_P(CausalSoftmaxForward, MatchesTheFloat64Reference) {
  const auto [T, scale] = GetParam();
  const std::int64_t mats = 3;
  std::printf("seed %llu, T %lld, scale %.9g\n", static_cast<unsigned long long>(kSeed),
              static_cast<long long>(T), static_cast<double>(scale));
  Rng rng({kSeed, static_cast<std::uint64_t>(T), 1});
  std::vector<float> s(static_cast<std::size_t>(mats * T * T));
  for (std::int64_t row = 0; row < mats * T; ++row) {
    const float range = row / T == 1 ? 80.0f : 8.0f;
    for (std::int64_t j = 0; j < T; ++j)
      s[static_cast<std::size_t>(row * T + j)] =
          j <= row % T ? rng.uniform(-range, range) : std::numeric_limits<float>::quiet_NaN();
  }
  std::vector<float> p(s.size(), 1.0f);
  causal_softmax_forward(s.data(), p.data(), mats, T, scale);
  std::vector<float> scaled(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) scaled[i] = scale * s[i];
  for (std::int64_t row = 0; row < mats * T; ++row) {
    const std::int64_t n = row % T + 1;
    const float* sr = scaled.data() + row * T;
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
  // The forms that also write the weights the next matmul reads: the same P, and P times the
  // mask (none, or dropout's 0 and 1.25; NaN past each row's diagonal, never read) in f32 or
  // rounded to bf16, 0 where masked by causality.
  std::vector<float> drop(s.size());
  for (std::size_t i = 0; i < drop.size(); ++i)
    drop[i] = static_cast<std::int64_t>(i) % T > static_cast<std::int64_t>(i) / T % T
                  ? std::numeric_limits<float>::quiet_NaN()
              : rng.next_unit() < 0.2 ? 0.0f
                                      : 1.25f;
  for (const float* mask : {static_cast<const float*>(nullptr), std::as_const(drop).data()}) {
    std::vector<float> p2(s.size(), 1.0f), used(s.size(), 1.0f);
    std::vector<bf16> half(s.size(), to_bf16(1.0f));
    causal_softmax_forward(s.data(), p2.data(), mask, used.data(), mats, T, scale);
    ASSERT_EQ(p2, p);
    std::fill(p2.begin(), p2.end(), 1.0f);
    causal_softmax_forward(s.data(), p2.data(), mask, half.data(), mats, T, scale);
    ASSERT_EQ(p2, p);
    for (std::size_t i = 0; i < s.size(); ++i) {
      const bool causal = static_cast<std::int64_t>(i) % T <= static_cast<std::int64_t>(i) / T % T;
      const float want = mask && causal ? p[i] * mask[i] : p[i];
      ASSERT_EQ(used[i], want) << "entry " << i << (mask ? ", dropout" : "");
      ASSERT_EQ(half[i].bits, to_bf16(want).bits) << "entry " << i << (mask ? ", dropout" : "");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Windows, CausalSoftmaxForward, kWindows, window_name);

// GELU(x) = x Phi(x) and its slope Phi(x) + x phi(x) in float64; GPT-2's tanh form
// x sigmoid(2u), u = sqrt(2 / pi) (x + 0.044715 x^3), and its slope.
double gelu64(double x, Gelu form = Gelu::kErf) {
  if (form == Gelu::kTanh) {
    const double u = std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x);
    return x / (1 + std::exp(-2 * u));
  }
  return 0.5 * x * std::erfc(-x / std::sqrt(2.0));
}
double gelu_slope64(double x, Gelu form = Gelu::kErf) {
  if (form == Gelu::kTanh) {
    const double u = std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x);
    const double s = 1 / (1 + std::exp(-2 * u));
    return s + 2 * x * s * (1 - s) * std::sqrt(2 / M_PI) * (1 + 3 * 0.044715 * x * x);
  }
  return 0.5 * std::erfc(-x / std::sqrt(2.0)) + x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI);
}

std::string form_name(Gelu form) { return form == Gelu::kTanh ? "Tanh" : "Erf"; }

class Gelu64 : public ::testing::TestWithParam<Gelu> {};

// Every 1/64 from -16 to 16 and random points of [-6, 6), then 0, -0 and the extremes; the
// forward without slopes gives the same values; the backward is the gradient times the slope.
TEST_P(Gelu64, ValuesAndSlopesMatchTheFloat64Reference) {
  const Gelu form = GetParam();
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  std::vector<float> x;
  for (int i = -16 * 64; i <= 16 * 64; ++i) x.push_back(static_cast<float>(i) / 64.0f);
  Rng rng({kSeed, 2});
  for (int i = 0; i < 1001; ++i) x.push_back(rng.uniform(-6.0f, 6.0f));
  for (const float v : {0.0f, -0.0f, 1e-30f, -1e-30f, 40.0f, -40.0f, 1e30f, -1e30f}) x.push_back(v);
  const auto n = static_cast<std::int64_t>(x.size());
  std::vector<float> g(x.size()), slope(x.size()), g_only(x.size()), dg(x.size()), df(x.size());
  gelu_forward(x.data(), g.data(), slope.data(), n, form);
  gelu_forward(x.data(), g_only.data(), nullptr, n, form);
  for (auto& v : dg) v = rng.uniform(-1.0f, 1.0f);
  gelu_backward(dg.data(), slope.data(), df.data(), n);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double v = x[i], want = gelu64(v, form), want_slope = gelu_slope64(v, form);
    // Phi to 1e-7 (erf's approximation: Abramowitz and Stegun 7.1.26, 1.5e-7), the tanh form's
    // sigmoid to a few of float's roundings, and float's rounding of the products.
    ASSERT_NEAR(g[i], want, 1e-7 * (1 + std::abs(v)) + 1.2e-7 * std::abs(want)) << "x = " << v;
    ASSERT_NEAR(slope[i], want_slope, 3e-7 * (1 + std::abs(want_slope))) << "x = " << v;
    ASSERT_EQ(g_only[i], g[i]) << "x = " << v;
    ASSERT_EQ(df[i], dg[i] * slope[i]) << "x = " << v;
  }
  // Far below zero the function and its slope vanish (no NaN from exp's underflow).
  EXPECT_EQ(g[x.size() - 1], 0.0f);
  EXPECT_EQ(slope[x.size() - 1], 0.0f);
  EXPECT_EQ(g[x.size() - 2], 1e30f);
}

INSTANTIATE_TEST_SUITE_P(Forms, Gelu64, ::testing::Values(Gelu::kErf, Gelu::kTanh),
                         [](const auto& test) { return form_name(test.param); });

// The two forms differ (by up to 4.7e-4, at |x| = 2.7): a plan that ran the other would show.
TEST(Gelu, TheTwoFormsDiffer) {
  std::vector<float> x{-2.7f, 2.7f}, erf(2), tanh(2);
  gelu_forward(x.data(), erf.data(), nullptr, 2, Gelu::kErf);
  gelu_forward(x.data(), tanh.data(), nullptr, 2, Gelu::kTanh);
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_GT(std::abs(erf[i] - tanh[i]), 4e-4f) << "x = " << x[i];
    EXPECT_NEAR(tanh[i], gelu64(x[i], Gelu::kTanh), 1e-6) << "x = " << x[i];
  }
}

// The bf16 forms are the f32 ones on the same (bf16) values, rounded: values and slopes, and the
// backward's product of bf16 gradient and slope; every length mod 16 (the last values go through
// a full vector), a NaN kept a NaN in the vector part and in the last values.
TEST_P(Gelu64, Bf16IsTheF32KernelRounded) {
  const Gelu form = GetParam();
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  Rng rng({kSeed, 3});
  for (std::int64_t n = 1; n <= 40; ++n) {
    std::vector<bf16> x(static_cast<std::size_t>(n)), dg(x.size());
    for (auto& v : x) v = to_bf16(rng.uniform(-6.0f, 6.0f));
    for (auto& v : dg) v = to_bf16(rng.uniform(-1.0f, 1.0f));
    const std::size_t nan_at = n == 13 ? 5 : n == 37 ? 20 : x.size();
    if (nan_at < x.size()) x[nan_at] = to_bf16(std::numeric_limits<float>::quiet_NaN());
    std::vector<float> xf(x.size()), g(x.size()), slope(x.size());
    to_float(x.data(), xf.data(), x.size());
    gelu_forward(xf.data(), g.data(), slope.data(), n, form);
    std::vector<bf16> g16(x.size()), slope16(x.size()), g16_only(x.size()), df16(x.size());
    gelu_forward(x.data(), g16.data(), slope16.data(), n, form);
    gelu_forward(x.data(), g16_only.data(), nullptr, n, form);
    gelu_backward(dg.data(), slope16.data(), df16.data(), n);
    for (std::size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(g16[i].bits, to_bf16(g[i]).bits) << "n " << n << ", x = " << xf[i];
      ASSERT_EQ(slope16[i].bits, to_bf16(slope[i]).bits) << "n " << n << ", x = " << xf[i];
      ASSERT_EQ(g16_only[i].bits, g16[i].bits) << "n " << n << ", x = " << xf[i];
      ASSERT_EQ(df16[i].bits, to_bf16(to_float(dg[i]) * to_float(slope16[i])).bits)
          << "n " << n << ", x = " << xf[i];
    }
    if (nan_at < x.size()) {
      EXPECT_TRUE(std::isnan(to_float(g16[nan_at]))) << "n " << n;
      EXPECT_TRUE(std::isnan(to_float(df16[nan_at]))) << "n " << n;
    }
  }
}

// Every bf16 value through each lookup this CPU runs (the vector part and the last values): g and
// the slope are the f32 kernel's at the same value, rounded; NaN where the value is NaN (which NaN
// is the compiler's: its operand order sets the sign, and the kernel's two copies may differ);
// and the f32 kernel's values themselves stay near float64's where they are finite.
class GeluTable : public ::testing::TestWithParam<std::tuple<GeluLookup, Gelu>> {};

TEST_P(GeluTable, EveryBf16ValueIsTheF32KernelRounded) {
  const auto [how, form] = GetParam();
  if (!gelu_lookup_available(how)) GTEST_SKIP() << "this CPU lacks the instructions";
  const std::size_t n = std::size_t{1} << 16;
  std::vector<bf16> x(n + 1);
  for (std::size_t i = 0; i < n; ++i) x[i + 1].bits = static_cast<std::uint16_t>(i);
  std::vector<float> xf(n), g(n), slope(n);
  to_float(x.data() + 1, xf.data(), n);
  gelu_forward(xf.data(), g.data(), slope.data(), static_cast<std::int64_t>(n), form);
  // Start 0: all 65,536 values, through the vector part only; start 1: the 65,535 after the
  // first, so the last ones go through the scalar lookups.
  for (const std::size_t start : {std::size_t{0}, std::size_t{1}}) {
    const auto count = static_cast<std::int64_t>(n - start);
    std::vector<bf16> g16(n), slope16(n), g16_only(n);
    gelu_forward(x.data() + 1 + start, g16.data(), slope16.data(), count, form, how);
    gelu_forward(x.data() + 1 + start, g16_only.data(), nullptr, count, form, how);
    for (std::size_t k = 0; k < n - start; ++k) {
      const std::size_t i = k + start;
      ASSERT_EQ(g16_only[k].bits, g16[k].bits) << "bits " << std::hex << x[i + 1].bits;
      if (std::isnan(xf[i])) {
        ASSERT_TRUE(std::isnan(to_float(g16[k])) && std::isnan(to_float(slope16[k])))
            << "bits " << std::hex << x[i + 1].bits;
        continue;
      }
      ASSERT_EQ(g16[k].bits, to_bf16(g[i]).bits) << "bits " << std::hex << x[i + 1].bits;
      ASSERT_EQ(slope16[k].bits, to_bf16(slope[i]).bits) << "bits " << std::hex << x[i + 1].bits;
    }
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (!std::isfinite(xf[i]) || std::abs(xf[i]) >= 1e4f) continue;
    ASSERT_NEAR(g[i], gelu64(xf[i], form), 1e-7 * (1 + std::abs(xf[i])) + 1.2e-7 * std::abs(g[i]))
        << "x = " << xf[i];
  }
}

// "Gather16Tanh" and so on.
std::string lookup_name(const ::testing::TestParamInfo<std::tuple<GeluLookup, Gelu>>& test) {
  static const char* const kNames[] = {"Auto", "Scalar", "Gather8", "Gather16"};
  return kNames[static_cast<int>(std::get<0>(test.param))] + form_name(std::get<1>(test.param));
}

INSTANTIATE_TEST_SUITE_P(
    Lookups, GeluTable,
    ::testing::Combine(::testing::Values(GeluLookup::kAuto, GeluLookup::kScalar,
                                         GeluLookup::kGather8, GeluLookup::kGather16),
                       ::testing::Values(Gelu::kErf, Gelu::kTanh)),
    lookup_name);

// LayerNorm over rows of C values against float64: forward (values, mean, 1 / std) and backward
// (dx, dgamma), f32 and bf16 (y the f32 result rounded; dy read from bf16: its float's result),
// widths below, at and above the eight partial sums; one row far from zero (mean 100, spread 1:
// E[x^2] - E[x]^2 in float would be off by about 0.2%, the two passes by 1e-5), backward written
// and added.
class LayerNorm : public ::testing::TestWithParam<std::tuple<std::int64_t, bool>> {};

TEST_P(LayerNorm, MatchesTheFloat64Reference) {
  const auto [C, with_bias] = GetParam();
  const std::int64_t rows = 5;
  const float eps = 1e-5f;
  std::printf("seed %llu, C %lld\n", static_cast<unsigned long long>(kSeed),
              static_cast<long long>(C));
  Rng rng({kSeed, static_cast<std::uint64_t>(C), 4});
  const std::size_t n = static_cast<std::size_t>(rows * C);
  std::vector<float> x(n), gamma(static_cast<std::size_t>(C)), dy(n), base(n);
  for (std::size_t i = 0; i < n; ++i)
    x[i] = i / static_cast<std::size_t>(C) == 2 ? 100.0f + rng.uniform(-1.0f, 1.0f)
                                                : rng.uniform(-3.0f, 3.0f);
  for (auto& v : gamma) v = rng.uniform(0.5f, 1.5f);
  std::vector<float> beta_values(gamma.size());
  for (auto& v : beta_values) v = rng.uniform(-1.0f, 1.0f);
  const float* beta = with_bias ? beta_values.data() : nullptr;
  std::vector<bf16> dy16(n);
  for (std::size_t i = 0; i < n; ++i) {
    dy16[i] = to_bf16(rng.uniform(-1.0f, 1.0f));
    dy[i] = to_float(dy16[i]);  // the same values in both precisions
    base[i] = rng.uniform(-1.0f, 1.0f);
  }
  std::vector<float> y(n), mean(static_cast<std::size_t>(rows)), rstd(mean.size());
  layer_norm_forward(x.data(), gamma.data(), beta, y.data(), mean.data(), rstd.data(), rows, C,
                     eps);
  std::vector<bf16> y16(n);
  std::vector<float> mean16(mean.size()), rstd16(mean.size());
  layer_norm_forward(x.data(), gamma.data(), beta, y16.data(), mean16.data(), rstd16.data(), rows,
                     C, eps);
  std::vector<float> dx(n, 7.0f), dx_added(base), dx16(n), dgamma(gamma.size(), 7.0f),
      dgamma_added(gamma.size()), dgamma16(gamma.size()), dbeta(gamma.size(), 7.0f),
      dbeta_added(gamma.size()), dbeta16(gamma.size());
  float* db = with_bias ? dbeta.data() : nullptr;
  layer_norm_backward(x.data(), gamma.data(), mean.data(), rstd.data(), dy.data(), dx.data(), false,
                      dgamma.data(), db, rows, C);
  layer_norm_backward(x.data(), gamma.data(), mean.data(), rstd.data(), dy.data(), dx_added.data(),
                      true, dgamma_added.data(), with_bias ? dbeta_added.data() : nullptr, rows, C);
  layer_norm_backward(x.data(), gamma.data(), mean.data(), rstd.data(), dy16.data(), dx16.data(),
                      false, dgamma16.data(), with_bias ? dbeta16.data() : nullptr, rows, C);
  std::vector<double> dgamma64(gamma.size(), 0.0), dbeta64(gamma.size(), 0.0);
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::size_t at = static_cast<std::size_t>(r * C);
    double mu = 0, var = 0;
    for (std::int64_t j = 0; j < C; ++j) mu += x[at + j];
    mu /= C;
    for (std::int64_t j = 0; j < C; ++j) var += (x[at + j] - mu) * (x[at + j] - mu);
    var /= C;
    const double rs = 1.0 / std::sqrt(var + eps);
    ASSERT_NEAR(mean[r], mu, 1e-6 * (1 + std::abs(mu))) << "row " << r;
    ASSERT_NEAR(rstd[r], rs, (r == 2 ? 1e-4 : 1e-6) * rs) << "row " << r;
    ASSERT_EQ(mean16[r], mean[r]);
    ASSERT_EQ(rstd16[r], rstd[r]);
    double a = 0, b = 0;
    std::vector<double> xhat(static_cast<std::size_t>(C));
    for (std::int64_t j = 0; j < C; ++j) {
      xhat[j] = (x[at + j] - mu) * rs;
      const double g = dy[at + j] * static_cast<double>(gamma[j]);
      a += g;
      b += g * xhat[j];
      dgamma64[j] += dy[at + j] * xhat[j];
      dbeta64[j] += dy[at + j];
    }
    a /= C;
    b /= C;
    const double tol = r == 2 ? 1e-4 : 1e-5;  // the row far from zero: x - mean loses digits
    for (std::int64_t j = 0; j < C; ++j) {
      const std::size_t i = at + static_cast<std::size_t>(j);
      const double want_y = xhat[j] * gamma[j] + (beta ? beta[j] : 0.0);
      ASSERT_NEAR(y[i], want_y, tol * (1 + std::abs(want_y))) << "row " << r << ", column " << j;
      ASSERT_EQ(y16[i].bits, to_bf16(y[i]).bits) << "row " << r << ", column " << j;
      const double want_dx = rs * (dy[i] * static_cast<double>(gamma[j]) - a - xhat[j] * b);
      ASSERT_NEAR(dx[i], want_dx, tol * rs) << "row " << r << ", column " << j;
      // Added: the same sum but for a rounding (the add fused into the last multiply).
      const float ulp = std::ldexp(1.0f, -23);
      ASSERT_NEAR(dx_added[i], base[i] + dx[i], 2 * ulp * (std::abs(base[i]) + std::abs(dx[i])))
          << "row " << r << ", column " << j;
      ASSERT_NEAR(dx16[i], dx[i], 2 * ulp * rs * (1 + std::abs(xhat[j])))
          << "row " << r << ", column " << j;
    }
  }
  for (std::int64_t j = 0; j < C; ++j) {
    ASSERT_NEAR(dgamma[j], dgamma64[j], 1e-3 * (1 + std::abs(dgamma64[j]))) << "column " << j;
    ASSERT_EQ(dgamma_added[j], dgamma[j]) << "column " << j << ": overwritten, not added";
    ASSERT_NEAR(dgamma16[j], dgamma[j], 1e-6 * (1 + std::abs(dgamma[j]))) << "column " << j;
    if (!with_bias) {
      ASSERT_EQ(dbeta[j], 7.0f) << "column " << j << ": no bias, not written";
      continue;
    }
    ASSERT_NEAR(dbeta[j], dbeta64[j], 1e-5 * (1 + std::abs(dbeta64[j]))) << "column " << j;
    ASSERT_EQ(dbeta_added[j], dbeta[j]) << "column " << j << ": overwritten, not added";
    ASSERT_EQ(dbeta16[j], dbeta[j]) << "column " << j;
  }
  // A row's results do not depend on the rows around it (the loops take rows four at a time and
  // the rest one by one): each row alone gives the same bits.
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::size_t at = static_cast<std::size_t>(r * C), width = gamma.size();
    std::vector<float> y1(width), added(base.begin() + at, base.begin() + at + width), dx1(width),
        dgamma1(width);
    std::vector<bf16> y1_16(width);
    float mean1 = 0, rstd1 = 0;
    layer_norm_forward(x.data() + at, gamma.data(), beta, y1.data(), &mean1, &rstd1, 1, C, eps);
    layer_norm_forward(x.data() + at, gamma.data(), beta, y1_16.data(), &mean1, &rstd1, 1, C, eps);
    ASSERT_EQ(mean1, mean[r]) << "row " << r;
    ASSERT_EQ(rstd1, rstd[r]) << "row " << r;
    layer_norm_backward(x.data() + at, gamma.data(), &mean[r], &rstd[r], dy.data() + at,
                        added.data(), true, dgamma1.data(), nullptr, 1, C);
    layer_norm_backward(x.data() + at, gamma.data(), &mean[r], &rstd[r], dy16.data() + at,
                        dx1.data(), false, dgamma1.data(), nullptr, 1, C);
    for (std::size_t j = 0; j < width; ++j) {
      ASSERT_EQ(y1[j], y[at + j]) << "row " << r << ", column " << j;
      ASSERT_EQ(y1_16[j].bits, y16[at + j].bits) << "row " << r << ", column " << j;
      ASSERT_EQ(added[j], dx_added[at + j]) << "row " << r << ", column " << j;
      ASSERT_EQ(dx1[j], dx16[at + j]) << "row " << r << ", column " << j;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Widths, LayerNorm,
                         ::testing::Combine(::testing::Values(1, 7, 8, 13, 64, 256),
                                            ::testing::Bool()),
                         [](const auto& w) {
                           return "C" + std::to_string(std::get<0>(w.param)) +
                                  (std::get<1>(w.param) ? "WithBias" : "");
                         });

// A bias's gradient: each column summed over the rows in row order (a float loop in that order
// gives the same bits), from f32 and from bf16, widths below, at and past the 16-wide vectors;
// near float64's sums; written over what the output held.
class BiasBackward : public ::testing::TestWithParam<std::int64_t> {};

TEST_P(BiasBackward, IsTheColumnSumsInRowOrder) {
  const std::int64_t O = GetParam(), rows = 37;
  std::printf("seed %llu, O %lld\n", static_cast<unsigned long long>(kSeed),
              static_cast<long long>(O));
  Rng rng({kSeed, static_cast<std::uint64_t>(O), 5});
  const auto n = static_cast<std::size_t>(rows * O);
  std::vector<float> dy(n);
  std::vector<bf16> dy16(n);
  for (std::size_t i = 0; i < n; ++i) {
    dy16[i] = to_bf16(rng.uniform(-1.0f, 1.0f));
    dy[i] = to_float(dy16[i]);
  }
  std::vector<float> db(static_cast<std::size_t>(O), 7.0f), db16(db);
  bias_backward(dy.data(), db.data(), rows, O);
  bias_backward(dy16.data(), db16.data(), rows, O);
  for (std::int64_t o = 0; o < O; ++o) {
    float in_order = 0.0f;
    double exact = 0;
    for (std::int64_t r = 0; r < rows; ++r) {
      in_order += dy[static_cast<std::size_t>(r * O + o)];
      exact += dy[static_cast<std::size_t>(r * O + o)];
    }
    ASSERT_EQ(db[o], in_order) << "column " << o;
    ASSERT_EQ(db16[o], in_order) << "column " << o;
    ASSERT_NEAR(db[o], exact, 1e-5) << "column " << o;
  }
}

INSTANTIATE_TEST_SUITE_P(Widths, BiasBackward, ::testing::Values(1, 15, 16, 17, 48, 100),
                         [](const auto& w) { return "O" + std::to_string(w.param); });

// The head's cross-entropy: a vocabulary and the logits' row stride (its padded width).
using Vocab = std::tuple<std::int64_t, std::int64_t>;
class TokenCrossEntropy : public ::testing::TestWithParam<Vocab> {};

// Logits in [-8, 8), one row in [-100, 100) (exponentials below float's normals, flushed to 0),
// and one whose label is its largest logit; the padding past the vocabulary NaN, never read. The
// loss and the gradient against float64's, at scale 1 and 1/3; the padding's gradient 0; the
// gradient written over the logits the same bits; without a gradient, the same loss.
TEST_P(TokenCrossEntropy, MatchesTheFloat64Reference) {
  const auto [V, stride] = GetParam();
  const std::int64_t rows = 5;
  std::printf("seed %llu, vocab %lld, stride %lld\n", static_cast<unsigned long long>(kSeed),
              static_cast<long long>(V), static_cast<long long>(stride));
  Rng rng({kSeed, static_cast<std::uint64_t>(V), 6});
  const auto n = static_cast<std::size_t>(rows * stride);
  std::vector<float> z(n, std::numeric_limits<float>::quiet_NaN());
  std::vector<std::int32_t> y(static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r) {
    const float range = r == 1 ? 100.0f : 8.0f;
    for (std::int64_t c = 0; c < V; ++c)
      z[static_cast<std::size_t>(r * stride + c)] = rng.uniform(-range, range);
    y[static_cast<std::size_t>(r)] = static_cast<std::int32_t>(rng.next_unit() * double(V));
  }
  const float* last = z.data() + (rows - 1) * stride;
  y.back() = static_cast<std::int32_t>(std::max_element(last, last + V) - last);
  const double sum_bound = (double(V) / 8 + 3) * 6e-8;
  for (const float scale : {1.0f, 1.0f / 3.0f}) {
    std::vector<float> d(n, 7.0f);
    const double loss = token_cross_entropy(z.data(), y.data(), rows, V, stride, scale, d.data());
    double want_loss = 0;
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* zr = z.data() + r * stride;
      const double top = *std::max_element(zr, zr + V);
      double sum = 0;
      for (std::int64_t c = 0; c < V; ++c) sum += std::exp(double(zr[c]) - top);
      const std::int32_t label = y[static_cast<std::size_t>(r)];
      want_loss += std::log(sum) - (zr[label] - top);
      for (std::int64_t c = 0; c < stride; ++c) {
        const float got = d[static_cast<std::size_t>(r * stride + c)];
        if (c >= V) {
          ASSERT_EQ(got, 0.0f) << "row " << r << ", padded column " << c;
          continue;
        }
        const double p = std::exp(double(zr[c]) - top) / sum;
        const double want = scale * (p - (c == label ? 1.0 : 0.0));
        // Relative to the probability: a few roundings, the exponential's 2 ulp, the rounding
        // of its argument (the logit less the largest, to float: up to |argument| 2^-24 of the
        // result) and the float sum's bound (V / 8 + 3 roundings of positive terms); the
        // label's 1 to a few roundings. Below float's normals (an argument past 87) the kernel's
        // exponential is 0.
        const double argument = top - zr[c];
        const double tol =
            scale * ((1e-6 + sum_bound + argument * 6e-8) * p + (c == label ? 1e-6 : 0.0)) + 1e-38;
        ASSERT_NEAR(got, want, argument > 87 ? scale * p + 1e-38 : tol)
            << "row " << r << ", column " << c << ", scale " << scale;
      }
    }
    ASSERT_NEAR(loss, want_loss, rows * (1e-6 * (1 + std::log(double(V))) + sum_bound))
        << "scale " << scale;
    ASSERT_EQ(token_cross_entropy(z.data(), y.data(), rows, V, stride, scale, nullptr), loss);
    std::vector<float> in_place(z);
    ASSERT_EQ(
        token_cross_entropy(in_place.data(), y.data(), rows, V, stride, scale, in_place.data()),
        loss);
    for (std::size_t i = 0; i < n; ++i)
      ASSERT_EQ(std::bit_cast<std::uint32_t>(in_place[i]), std::bit_cast<std::uint32_t>(d[i]))
          << "entry " << i << ", scale " << scale;
  }
}

INSTANTIATE_TEST_SUITE_P(Vocabularies, TokenCrossEntropy,
                         ::testing::Values(Vocab{1, 1}, Vocab{7, 8}, Vocab{8, 8}, Vocab{65, 128},
                                           Vocab{100, 100}, Vocab{50257, 50304}),
                         [](const auto& v) {
                           return "V" + std::to_string(std::get<0>(v.param)) + "_stride" +
                                  std::to_string(std::get<1>(v.param));
                         });

}  // namespace gpt_kernels_test
}  // namespace cohort::nn
