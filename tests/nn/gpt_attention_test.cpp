// attention_kernel_forward and attention_kernel_backward, each engine, against float64 references,
// on random bf16
// q, k, v and dy, with and without a dropout mask, heads of 32, 64 and 96 with windows of two to
// ten 16-row blocks (an odd and an even number of 32-key chunks): the softmax's statistics
// against softmax(scale q k^T) itself; y, dq, dk and dv within the rounding of their bf16
// operands (used and ds, 2^-9 relative a term) and of their own, plus f32 accumulation. Skipped
// where an engine cannot run (attention_kernel_usable: the CPU, the OS or a clang build).
#include "cohort/nn/gpt/gpt_attention.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "cohort/core/rng.hpp"
#include "cohort/nn/dropout.hpp"
#include "cohort/nn/gpt/gpt_kernels.hpp"

namespace cohort::nn {
namespace gpt_attention_test {

constexpr std::uint64_t kSeed = 20261204;
constexpr const char* kCannotRun =
    "the engine cannot run here (CPU, OS or compiler: attention_kernel_usable)";
constexpr AttentionEngine kEngines[] = {AttentionEngine::kAmx, AttentionEngine::kAvx512Bf16};

struct Shape {
  const char* name;
  AttentionShape s;
  float dropout;  // 0: no mask
};

std::vector<bf16> random_bf16(std::size_t n, Rng& rng, double scale) {
  std::vector<bf16> v(n);
  for (auto& x : v) x = to_bf16(static_cast<float>(scale * (2.0 * rng.next_unit() - 1.0)));
  return v;
}

double f(bf16 v) { return static_cast<double>(to_float(v)); }

// One head's operand: row t, column d of q (which 0), k (1) or v (2) of window n, head h.
struct Heads {
  const std::vector<bf16>& qkv;
  const AttentionShape& s;
  double at(std::int64_t n, std::int64_t h, int which, std::int64_t t, std::int64_t d) const {
    const std::int64_t C = s.H * s.hs;
    return f(qkv[static_cast<std::size_t>((n * s.T + t) * 3 * C + which * C + h * s.hs + d)]);
  }
};

// Within bf16's rounding of `want` (2^-8 relative, twice the half-ulp), plus f32 accumulation's
// error on a sum whose terms' magnitudes add up to `mass`.
void expect_close(double got, double want, double mass, const std::string& what) {
  const double tol = std::ldexp(std::abs(want), -8) + 1e-5 * mass + 1e-30;
  ASSERT_LE(std::abs(got - want), tol) << what << ": got " << got << ", want " << want;
}

class AttentionKernel : public ::testing::TestWithParam<std::tuple<AttentionEngine, Shape>> {};

TEST_P(AttentionKernel, MatchesTheFloat64Reference) {
  const auto& [engine, c] = GetParam();
  const AttentionShape& s = c.s;
  if (!attention_kernel_usable(engine, s.T, s.hs)) GTEST_SKIP() << kCannotRun;
  std::printf("engine %s, seed %llu, N %lld, T %lld, H %lld, hs %lld, dropout %g\n",
              attention_engine_name(engine), static_cast<unsigned long long>(kSeed),
              static_cast<long long>(s.N), static_cast<long long>(s.T), static_cast<long long>(s.H),
              static_cast<long long>(s.hs), static_cast<double>(c.dropout));
  const std::int64_t C = s.H * s.hs, T = s.T, M = s.N * s.T;
  const auto mats = static_cast<std::size_t>(s.N * s.H), tt = static_cast<std::size_t>(T * T);
  Rng rng({kSeed, static_cast<std::uint64_t>(T * 1000 + s.hs)});
  const std::vector<bf16> qkv = random_bf16(static_cast<std::size_t>(M * 3 * C), rng, 2.0);
  const std::vector<bf16> dy = random_bf16(static_cast<std::size_t>(M * C), rng, 1.0);
  std::vector<float> mask;
  if (c.dropout > 0) {
    mask.assign(mats * tt, -1.0f);  // entries past the diagonal: never read
    causal_dropout_mask(StreamKey{kSeed, 1, 0}, 1, c.dropout, mats, static_cast<std::size_t>(T),
                        mask.data());
  }
  const float* mk = mask.empty() ? nullptr : mask.data();
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.hs));
  std::vector<float> stats(mats * static_cast<std::size_t>(2 * T), -7.0f);
  std::vector<bf16> y(static_cast<std::size_t>(M * C), to_bf16(-7.0f));
  std::vector<bf16> dqkv(static_cast<std::size_t>(M * 3 * C), to_bf16(-7.0f));
  attention_kernel_forward(engine, qkv.data(), mk, stats.data(), y.data(), s, scale);
  attention_kernel_backward(engine, qkv.data(), stats.data(), mk, dy.data(), dqkv.data(), s, scale);

  // A bf16 operand's terms: 2^-9 relative each, i.e. 2^-9 of the terms' magnitudes (`mass`,
  // which expect_close weighs 1e-5 a unit).
  constexpr double kRounded = 400;
  const Heads x{qkv, s};
  for (std::int64_t n = 0; n < s.N; ++n)
    for (std::int64_t h = 0; h < s.H; ++h) {
      const std::size_t head = static_cast<std::size_t>(n * s.H + h) * tt;
      const std::string where = "window " + std::to_string(n) + ", head " + std::to_string(h);
      auto G = [&](std::int64_t t, std::int64_t d) {
        return f(dy[static_cast<std::size_t>((n * T + t) * C + h * s.hs + d)]);
      };
      auto Mask = [&](std::int64_t i, std::int64_t j) {
        return mk ? double(mk[head + static_cast<std::size_t>(i * T + j)]) : 1.0;
      };
      // The reference's weights and score gradient, and ds's size for the products' tolerance: its
      // own plus its f32 rounding (some 16 ulps of its terms, 1e-6; where d - sum_k p d cancels,
      // as on row 0, ds is that rounding), the latter as a mass (over kRounded 1e-5).
      std::vector<double> P(tt, 0.0), ds(tt, 0.0), ds_size(tt, 0.0);
      for (std::int64_t i = 0; i < T; ++i) {
        // Forward: p = softmax(scale q k^T) over j <= i; the kernel's top and 1 / sum.
        std::vector<double> e(static_cast<std::size_t>(i + 1));
        double top = -1e300, sum = 0;
        for (std::int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (std::int64_t d = 0; d < s.hs; ++d) dot += x.at(n, h, 0, i, d) * x.at(n, h, 1, j, d);
          top = std::max(top, e[static_cast<std::size_t>(j)] = scale * dot);
        }
        for (auto& v : e) sum += v = std::exp(v - top);
        for (std::int64_t j = 0; j <= i; ++j)
          P[static_cast<std::size_t>(i * T + j)] = e[static_cast<std::size_t>(j)] / sum;
        const float* st = stats.data() + (static_cast<std::size_t>(n * s.H + h) * T + i) * 2;
        const std::string row = where + ", row " + std::to_string(i);
        ASSERT_NEAR(st[0], top, 1e-5 * (1 + std::abs(top))) << "top, " << row;
        ASSERT_NEAR(st[1], 1 / sum, 1e-5 / sum) << "1 / sum, " << row;
        // y = (p mask) v.
        for (std::int64_t d = 0; d < s.hs; ++d) {
          double want = 0, mass = 0;
          for (std::int64_t j = 0; j <= i; ++j) {
            const double term =
                P[static_cast<std::size_t>(i * T + j)] * Mask(i, j) * x.at(n, h, 2, j, d);
            want += term;
            mass += std::abs(term);
          }
          const double got = f(y[static_cast<std::size_t>((n * T + i) * C + h * s.hs + d)]);
          expect_close(got, want, kRounded * mass, "y, " + row);
        }
        // Backward: dused = dy v^T; ds = scale p (dused mask - sum_k p dused mask).
        std::vector<double> dm(static_cast<std::size_t>(i + 1));
        double dot = 0;
        for (std::int64_t j = 0; j <= i; ++j) {
          double g = 0;
          for (std::int64_t d = 0; d < s.hs; ++d) g += G(i, d) * x.at(n, h, 2, j, d);
          dm[static_cast<std::size_t>(j)] = g * Mask(i, j);
          dot += P[static_cast<std::size_t>(i * T + j)] * dm[static_cast<std::size_t>(j)];
        }
        for (std::int64_t j = 0; j <= i; ++j) {
          const std::size_t at = static_cast<std::size_t>(i * T + j);
          const double d = dm[static_cast<std::size_t>(j)];
          ds[at] = scale * P[at] * (d - dot);
          ds_size[at] = std::abs(ds[at]) +
                        1e-6 / (kRounded * 1e-5) * scale * P[at] * (std::abs(d) + std::abs(dot));
        }
      }
      // dq = ds k, dk = ds^T q, dv = (p mask)^T dy.
      for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t d = 0; d < s.hs; ++d) {
          double dq = 0, dk = 0, dv = 0, mq = 0, mk2 = 0, mv = 0;
          for (std::int64_t j = 0; j <= t; ++j) {
            const std::size_t at = static_cast<std::size_t>(t * T + j);
            dq += ds[at] * x.at(n, h, 1, j, d);
            mq += ds_size[at] * std::abs(x.at(n, h, 1, j, d));
          }
          for (std::int64_t i = t; i < T; ++i) {
            const std::size_t at = static_cast<std::size_t>(i * T + t);
            const double v = P[at] * Mask(i, t) * G(i, d);
            dk += ds[at] * x.at(n, h, 0, i, d);
            mk2 += ds_size[at] * std::abs(x.at(n, h, 0, i, d));
            dv += v;
            mv += std::abs(v);
          }
          const std::size_t at = static_cast<std::size_t>((n * T + t) * 3 * C + h * s.hs + d);
          const std::string row =
              where + ", row " + std::to_string(t) + ", column " + std::to_string(d);
          expect_close(f(dqkv[at]), dq, kRounded * mq, "dq, " + row);
          expect_close(f(dqkv[at + static_cast<std::size_t>(C)]), dk, kRounded * mk2, "dk, " + row);
          expect_close(f(dqkv[at + 2 * static_cast<std::size_t>(C)]), dv, kRounded * mv,
                       "dv, " + row);
        }
    }
}

// The same call twice gives the same bits, and each window's results do not depend on the
// others in the call (one window alone against the same window among three).
class AttentionKernelBits : public ::testing::TestWithParam<AttentionEngine> {};

TEST_P(AttentionKernelBits, AWindowsResultsAreItsOwnBitForBit) {
  const AttentionEngine engine = GetParam();
  const AttentionShape s{3, 64, 2, 32};
  if (!attention_kernel_usable(engine, s.T, s.hs)) GTEST_SKIP() << kCannotRun;
  std::printf("engine %s, seed %llu\n", attention_engine_name(engine),
              static_cast<unsigned long long>(kSeed));
  const std::int64_t C = s.H * s.hs, T = s.T, M = s.N * T;
  Rng rng({kSeed, 7});
  const std::vector<bf16> qkv = random_bf16(static_cast<std::size_t>(M * 3 * C), rng, 2.0);
  const std::vector<bf16> dy = random_bf16(static_cast<std::size_t>(M * C), rng, 1.0);
  const float scale = 1.0f / std::sqrt(32.0f);
  struct Out {
    std::vector<float> stats;
    std::vector<bf16> y, dqkv;
  };
  auto run = [&](const AttentionShape& shape, std::int64_t first) {
    const auto rows = static_cast<std::size_t>(shape.N * T);
    Out o{std::vector<float>(rows * shape.H * 2), std::vector<bf16>(rows * C),
          std::vector<bf16>(rows * 3 * C)};
    const bf16* x = qkv.data() + first * T * 3 * C;
    attention_kernel_forward(engine, x, nullptr, o.stats.data(), o.y.data(), shape, scale);
    attention_kernel_backward(engine, x, o.stats.data(), nullptr, dy.data() + first * T * C,
                              o.dqkv.data(), shape, scale);
    return o;
  };
  const Out all = run(s, 0), again = run(s, 0), one = run({1, T, s.H, s.hs}, 2);
  auto bits = [](const auto& v, std::size_t from, std::size_t count) {
    std::vector<std::uint8_t> b(count * sizeof(v[0]));
    std::memcpy(b.data(), v.data() + from, b.size());
    return b;
  };
  EXPECT_EQ(bits(all.y, 0, all.y.size()), bits(again.y, 0, again.y.size()));
  EXPECT_EQ(bits(all.dqkv, 0, all.dqkv.size()), bits(again.dqkv, 0, again.dqkv.size()));
  const auto rows = static_cast<std::size_t>(T), stat = static_cast<std::size_t>(s.H * T * 2);
  EXPECT_EQ(bits(all.stats, 2 * stat, stat), bits(one.stats, 0, stat));
  EXPECT_EQ(bits(all.y, 2 * rows * C, rows * C), bits(one.y, 0, rows * C));
  EXPECT_EQ(bits(all.dqkv, 2 * rows * 3 * C, rows * 3 * C), bits(one.dqkv, 0, rows * 3 * C));
}

INSTANTIATE_TEST_SUITE_P(
    Heads, AttentionKernel,
    ::testing::Combine(::testing::ValuesIn(kEngines),
                       ::testing::Values(Shape{"T32_Head32_TwoWindows", {2, 32, 2, 32}, 0.0f},
                                         Shape{"T64_Head32_FourHeads", {1, 64, 4, 32}, 0.0f},
                                         Shape{"T96_Head64_Dropout", {2, 96, 1, 64}, 0.3f},
                                         Shape{"T160_Head64", {1, 160, 2, 64}, 0.0f},
                                         Shape{"T128_Head96_Dropout", {1, 128, 1, 96}, 0.2f})),
    [](const auto& p) {
      return std::string(attention_engine_name(std::get<0>(p.param))) + "_" +
             std::get<1>(p.param).name;
    });
INSTANTIATE_TEST_SUITE_P(Engines, AttentionKernelBits, ::testing::ValuesIn(kEngines),
                         [](const auto& p) { return std::string(attention_engine_name(p.param)); });

}  // namespace gpt_attention_test
}  // namespace cohort::nn
