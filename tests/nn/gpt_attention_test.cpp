// amx_attention_forward and amx_attention_backward against float64 references, on random bf16
// q, k, v and dy, with and without a dropout mask, heads of 32 and 64 with windows of one to ten
// 16-row blocks (an odd and an even number of 32-key chunks). Each product is checked on the
// kernel's own rounded inputs (used, ds), so its tolerance is f32 accumulation and the output's
// rounding; the softmax's outputs against softmax(scale q k^T) itself. Skipped where the CPU or
// the OS offers no AMX tiles (amx_attention_usable).
#include "cohort/nn/gpt_attention.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cohort/core/rng.hpp"
#include "cohort/nn/dropout.hpp"
#include "cohort/nn/gpt_kernels.hpp"

namespace cohort::nn {
namespace gpt_attention_test {

constexpr std::uint64_t kSeed = 20261204;

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

class AmxAttention : public ::testing::TestWithParam<Shape> {};

TEST_P(AmxAttention, MatchesTheFloat64Reference) {
  const Shape& c = GetParam();
  const AttentionShape& s = c.s;
  if (!amx_attention_usable(s.T, s.hs)) GTEST_SKIP() << "no AMX tiles on this CPU or OS";
  std::printf("seed %llu, N %lld, T %lld, H %lld, hs %lld, dropout %g\n",
              static_cast<unsigned long long>(kSeed), static_cast<long long>(s.N),
              static_cast<long long>(s.T), static_cast<long long>(s.H),
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
  std::vector<float> p(mats * tt, -7.0f);
  std::vector<bf16> used(mats * tt, to_bf16(-7.0f)), y(static_cast<std::size_t>(M * C));
  std::vector<bf16> dqkv(static_cast<std::size_t>(M * 3 * C), to_bf16(-7.0f));
  amx_attention_forward(qkv.data(), mk, p.data(), used.data(), y.data(), s, scale);
  amx_attention_backward(qkv.data(), p.data(), used.data(), mk, dy.data(), dqkv.data(), s, scale);

  const Heads x{qkv, s};
  for (std::int64_t n = 0; n < s.N; ++n)
    for (std::int64_t h = 0; h < s.H; ++h) {
      const std::size_t head = static_cast<std::size_t>(n * s.H + h) * tt;
      const std::string where = "window " + std::to_string(n) + ", head " + std::to_string(h);
      auto P = [&](std::int64_t i, std::int64_t j) { return double(p[head + i * T + j]); };
      auto U = [&](std::int64_t i, std::int64_t j) { return f(used[head + i * T + j]); };
      auto G = [&](std::int64_t t, std::int64_t d) {
        return f(dy[static_cast<std::size_t>((n * T + t) * C + h * s.hs + d)]);
      };
      std::vector<double> ds(tt, 0.0);  // the reference's gradient of the scores
      for (std::int64_t i = 0; i < T; ++i) {
        // Forward: p = softmax(scale q k^T) over j <= i, 0 after; used = p mask rounded.
        std::vector<double> e(static_cast<std::size_t>(i + 1));
        double top = -1e300, sum = 0;
        for (std::int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (std::int64_t d = 0; d < s.hs; ++d) dot += x.at(n, h, 0, i, d) * x.at(n, h, 1, j, d);
          top = std::max(top, e[static_cast<std::size_t>(j)] = scale * dot);
        }
        for (auto& v : e) sum += v = std::exp(v - top);
        for (std::int64_t j = 0; j < T; ++j) {
          const double want = j <= i ? e[static_cast<std::size_t>(j)] / sum : 0.0;
          const std::string at = where + ", p[" + std::to_string(i) + "][" + std::to_string(j) + "]";
          if (j > i) {
            ASSERT_EQ(P(i, j), 0.0) << at;
            ASSERT_EQ(U(i, j), 0.0) << at;
            continue;
          }
          ASSERT_NEAR(P(i, j), want, 2e-6 + 1e-5 * want) << at;
          const double m = mk ? double(mk[head + i * T + j]) : 1.0;
          expect_close(U(i, j), P(i, j) * m, 0, "used " + at);
        }
        // y = used v (the kernel's used).
        for (std::int64_t d = 0; d < s.hs; ++d) {
          double want = 0, mass = 0;
          for (std::int64_t j = 0; j <= i; ++j) {
            want += U(i, j) * x.at(n, h, 2, j, d);
            mass += std::abs(U(i, j) * x.at(n, h, 2, j, d));
          }
          const double got = f(y[static_cast<std::size_t>((n * T + i) * C + h * s.hs + d)]);
          expect_close(got, want, mass, where + ", y row " + std::to_string(i));
        }
        // Backward: dused = dy v^T; ds = scale p (dused mask - sum_k p dused mask).
        std::vector<double> dm(static_cast<std::size_t>(i + 1));
        double dot = 0;
        for (std::int64_t j = 0; j <= i; ++j) {
          double g = 0;
          for (std::int64_t d = 0; d < s.hs; ++d) g += G(i, d) * x.at(n, h, 2, j, d);
          dm[static_cast<std::size_t>(j)] = g * (mk ? double(mk[head + i * T + j]) : 1.0);
          dot += P(i, j) * dm[static_cast<std::size_t>(j)];
        }
        for (std::int64_t j = 0; j <= i; ++j)
          ds[static_cast<std::size_t>(i * T + j)] =
              scale * P(i, j) * (dm[static_cast<std::size_t>(j)] - dot);
      }
      // dq = ds k, dk = ds^T q, dv = used^T dy. ds reaches the products rounded to bf16: its
      // terms carry 2^-9 more relative error (the mass's tolerance widened to match).
      for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t d = 0; d < s.hs; ++d) {
          double dq = 0, dk = 0, dv = 0, mq = 0, mk2 = 0, mv = 0;
          for (std::int64_t j = 0; j <= t; ++j) {
            dq += ds[static_cast<std::size_t>(t * T + j)] * x.at(n, h, 1, j, d);
            mq += std::abs(ds[static_cast<std::size_t>(t * T + j)] * x.at(n, h, 1, j, d));
          }
          for (std::int64_t i = t; i < T; ++i) {
            dk += ds[static_cast<std::size_t>(i * T + t)] * x.at(n, h, 0, i, d);
            mk2 += std::abs(ds[static_cast<std::size_t>(i * T + t)] * x.at(n, h, 0, i, d));
            dv += U(i, t) * G(i, d);
            mv += std::abs(U(i, t) * G(i, d));
          }
          const std::size_t row = static_cast<std::size_t>((n * T + t) * 3 * C + h * s.hs + d);
          const std::string at = where + ", row " + std::to_string(t) + ", column " +
                                 std::to_string(d);
          expect_close(f(dqkv[row]), dq, 400 * mq, "dq " + at);
          expect_close(f(dqkv[row + static_cast<std::size_t>(C)]), dk, 400 * mk2, "dk " + at);
          expect_close(f(dqkv[row + 2 * static_cast<std::size_t>(C)]), dv, mv, "dv " + at);
        }
    }
}

// The same call twice gives the same bits, and each window's results do not depend on the
// others in the call (one window alone against the same window among three).
TEST(AmxAttention, AWindowsResultsAreItsOwnBitForBit) {
  const AttentionShape s{3, 64, 2, 32};
  if (!amx_attention_usable(s.T, s.hs)) GTEST_SKIP() << "no AMX tiles on this CPU or OS";
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  const std::int64_t C = s.H * s.hs, T = s.T, M = s.N * T;
  Rng rng({kSeed, 7});
  const std::vector<bf16> qkv = random_bf16(static_cast<std::size_t>(M * 3 * C), rng, 2.0);
  const std::vector<bf16> dy = random_bf16(static_cast<std::size_t>(M * C), rng, 1.0);
  const float scale = 1.0f / std::sqrt(32.0f);
  struct Out {
    std::vector<float> p;
    std::vector<bf16> used, y, dqkv;
  };
  auto run = [&](const AttentionShape& shape, std::int64_t first) {
    const auto rows = static_cast<std::size_t>(shape.N * T);
    const auto mats = static_cast<std::size_t>(shape.N * shape.H * T * T);
    Out o{std::vector<float>(mats), std::vector<bf16>(mats), std::vector<bf16>(rows * C),
          std::vector<bf16>(rows * 3 * C)};
    const bf16* x = qkv.data() + first * T * 3 * C;
    amx_attention_forward(x, nullptr, o.p.data(), o.used.data(), o.y.data(), shape, scale);
    amx_attention_backward(x, o.p.data(), o.used.data(), nullptr, dy.data() + first * T * C,
                           o.dqkv.data(), shape, scale);
    return o;
  };
  const Out all = run(s, 0), again = run(s, 0), one = run({1, T, s.H, s.hs}, 2);
  auto bits = [](const auto& v, std::size_t from, std::size_t count) {
    std::vector<std::uint8_t> b(count * sizeof(v[0]));
    std::memcpy(b.data(), v.data() + from, b.size());
    return b;
  };
  EXPECT_EQ(bits(all.p, 0, all.p.size()), bits(again.p, 0, again.p.size()));
  EXPECT_EQ(bits(all.dqkv, 0, all.dqkv.size()), bits(again.dqkv, 0, again.dqkv.size()));
  const auto mats = static_cast<std::size_t>(s.H * T * T), rows = static_cast<std::size_t>(T);
  EXPECT_EQ(bits(all.p, 2 * mats, mats), bits(one.p, 0, mats));
  EXPECT_EQ(bits(all.used, 2 * mats, mats), bits(one.used, 0, mats));
  EXPECT_EQ(bits(all.y, 2 * rows * C, rows * C), bits(one.y, 0, rows * C));
  EXPECT_EQ(bits(all.dqkv, 2 * rows * 3 * C, rows * 3 * C), bits(one.dqkv, 0, rows * 3 * C));
}

INSTANTIATE_TEST_SUITE_P(
    Heads, AmxAttention,
    ::testing::Values(Shape{"T32_Head32_TwoWindows", {2, 32, 2, 32}, 0.0f},
                      Shape{"T64_Head32_FourHeads", {1, 64, 4, 32}, 0.0f},
                      Shape{"T96_Head64_Dropout", {2, 96, 1, 64}, 0.3f},
                      Shape{"T160_Head64", {1, 160, 2, 64}, 0.0f},
                      Shape{"T128_Head96_Dropout", {1, 128, 1, 96}, 0.2f}),
    [](const auto& p) { return std::string(p.param.name); });

}  // namespace gpt_attention_test
}  // namespace cohort::nn
