// The max pooling kernels (max_pool.hpp) against a naive float64 reference on logical (N, C, H, W)
// indices, in the layouts a Net hands them (nhwc, channel blocks of 8 and 16) and both
// precisions: the maxima, the window index of the first maximum, the gradient routed there, zero
// elsewhere (also rows and columns no window covers), ties and NaNs; with a fused ReLU, +0 out
// and no gradient where the maximum is not above 0 (a NaN stays). The Net's own tests
// (net_test.cpp, net_bf16_test.cpp) run it inside models against the model reference.
#include "cohort/nn/max_pool.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "cohort/core/rng.hpp"
#include "cohort/tensor/bf16.hpp"

namespace cohort::nn {
namespace max_pool_test {

constexpr std::uint64_t kSeed = 20261202;

struct Case {
  std::string layout;  // "nhwc", "blocked8", "blocked16"
  std::int64_t N, C, IH, IW, K;
  bool bf16;
  bool relu = false;
  PoolIsa isa = PoolIsa::kAuto;  // each kernel build: the baseline's and AVX-512's
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return c.layout + "_N" + std::to_string(c.N) + "_C" + std::to_string(c.C) + "_" +
         std::to_string(c.IH) + "x" + std::to_string(c.IW) + "_K" + std::to_string(c.K) +
         (c.bf16 ? "_bf16" : "_f32") + (c.relu ? "_relu" : "") +
         (c.isa == PoolIsa::kAvx512 ? "_avx512" : "_portable");
}

PoolLayout layout_of(const std::string& name, std::int64_t C, std::int64_t H, std::int64_t W) {
  if (name == "nhwc") return {C, H * W * C, 0, W * C, C};
  const std::int64_t b = name == "blocked8" ? 8 : 16;
  return {b, C * H * W, H * W * b, W * b, b};
}

std::int64_t offset(const PoolLayout& l, std::int64_t n, std::int64_t c, std::int64_t h,
                    std::int64_t w) {
  return n * l.n_stride + (c / l.lanes) * l.group_stride + h * l.h_stride + w * l.w_stride +
         c % l.lanes;
}

// Values from a set of five, so that windows often hold equal maxima; NaNs in some windows'
// corners, and every 41st window all -inf.
std::vector<double> logical_input(const Case& c) {
  Rng rng({kSeed, static_cast<std::uint64_t>(c.C * 1000 + c.IH)});
  std::vector<double> x(static_cast<std::size_t>(c.N * c.C * c.IH * c.IW));
  const double values[] = {-1.0, 0.0, 0.5, 0.75, 1.0};
  for (double& v : x) v = values[rng.below(5)];
  const std::int64_t OH = c.IH / c.K, OW = c.IW / c.K;
  std::int64_t window = 0;
  for (std::int64_t n = 0; n < c.N; ++n)
    for (std::int64_t ch = 0; ch < c.C; ++ch)
      for (std::int64_t oh = 0; oh < OH; ++oh)
        for (std::int64_t ow = 0; ow < OW; ++ow, ++window) {
          auto at = [&](std::int64_t kh, std::int64_t kw) -> double& {
            return x[static_cast<std::size_t>(((n * c.C + ch) * c.IH + oh * c.K + kh) * c.IW +
                                              ow * c.K + kw)];
          };
          // NaNs at three corners, some windows holding two of them: which one is first
          // matters to the index (and K = 2 compares its window as a tree).
          const double nan = std::numeric_limits<double>::quiet_NaN();
          if (window % 37 == 5) at(c.K - 1, 0) = nan;
          if (window % 31 == 3) at(0, c.K - 1) = nan;
          if (window % 29 == 13) at(c.K - 1, c.K - 1) = nan;
          if (window % 41 == 7)
            for (std::int64_t kh = 0; kh < c.K; ++kh)
              for (std::int64_t kw = 0; kw < c.K; ++kw)
                at(kh, kw) = -std::numeric_limits<double>::infinity();
        }
  return x;
}

template <class T>
T from_double(double v) {
  if constexpr (std::is_same_v<T, bf16>)
    return to_bf16(static_cast<float>(v));
  else
    return static_cast<float>(v);
}
template <class T>
double to_double(T v) {
  if constexpr (std::is_same_v<T, bf16>)
    return to_float(v);
  else
    return v;
}

template <class T>
void check_case(const Case& c) {
  const PoolLayout a = layout_of(c.layout, c.C, c.IH, c.IW);
  const std::int64_t OH = c.IH / c.K, OW = c.IW / c.K;
  const PoolLayout b = layout_of(c.layout, c.C, OH, OW);
  const MaxPoolShape shape{c.N, c.C, c.IH, c.IW, c.K, a, b, c.relu};
  ASSERT_TRUE(max_pool_supported(shape));
  const std::vector<double> x = logical_input(c);
  auto xat = [&](std::int64_t n, std::int64_t ch, std::int64_t h, std::int64_t w) {
    return x[static_cast<std::size_t>(((n * c.C + ch) * c.IH + h) * c.IW + w)];
  };
  std::vector<T> src(x.size()), dst(static_cast<std::size_t>(c.N * c.C * OH * OW));
  for (std::int64_t n = 0; n < c.N; ++n)
    for (std::int64_t ch = 0; ch < c.C; ++ch)
      for (std::int64_t h = 0; h < c.IH; ++h)
        for (std::int64_t w = 0; w < c.IW; ++w)
          src[offset(a, n, ch, h, w)] = from_double<T>(xat(n, ch, h, w));
  std::vector<std::uint8_t> where(dst.size(), 255);
  max_pool_forward(shape, src.data(), dst.data(), where.data(), c.isa);
  std::vector<T> inference(dst.size());  // no indices: the same maxima
  max_pool_forward(shape, src.data(), inference.data(), nullptr, c.isa);
  for (std::size_t i = 0; i < dst.size(); ++i)
    ASSERT_EQ(std::memcmp(&dst[i], &inference[i], sizeof(T)), 0) << "inference, element " << i;
  // Output gradients: distinct values, so a misrouted one is seen.
  std::vector<T> diff_dst(dst.size());
  for (std::size_t i = 0; i < diff_dst.size(); ++i)
    diff_dst[i] = from_double<T>(1.0 + static_cast<double>(i % 97));
  std::vector<T> diff_src(src.size(), from_double<T>(std::nan("")));  // every element written
  max_pool_backward(shape, where.data(), diff_dst.data(), diff_src.data(), c.isa);

  std::vector<double> expect_ds(x.size(), 0.0);
  for (std::int64_t n = 0; n < c.N; ++n)
    for (std::int64_t ch = 0; ch < c.C; ++ch)
      for (std::int64_t oh = 0; oh < OH; ++oh)
        for (std::int64_t ow = 0; ow < OW; ++ow) {
          // Reference: the first maximal element in row-major window order; a NaN is maximal.
          double best = -std::numeric_limits<double>::infinity();
          std::int64_t first = 0;
          bool nan = false;
          for (std::int64_t k = 0; k < c.K * c.K && !nan; ++k) {
            const double v = xat(n, ch, oh * c.K + k / c.K, ow * c.K + k % c.K);
            if (std::isnan(v) || v > best) {
              best = v;
              first = k;
              nan = std::isnan(v);
            }
          }
          const std::int64_t o = offset(b, n, ch, oh, ow);
          const std::string at = "n " + std::to_string(n) + " c " + std::to_string(ch) + " oh " +
                                 std::to_string(oh) + " ow " + std::to_string(ow);
          const double got = to_double(dst[o]);
          const bool zeroed = c.relu && !nan && !(best > 0);  // ReLU's output 0, no gradient
          if (nan) {
            ASSERT_TRUE(std::isnan(got)) << at;
          } else if (zeroed) {
            ASSERT_EQ(got, 0.0) << at;
            ASSERT_FALSE(std::signbit(got)) << at << ": +0, not -0";
          } else {
            ASSERT_EQ(got, best) << at;
          }
          ASSERT_EQ(where[o], first | (zeroed ? 0x80 : 0)) << at;
          if (zeroed) continue;
          expect_ds[static_cast<std::size_t>(
              ((n * c.C + ch) * c.IH + oh * c.K + first / c.K) * c.IW + ow * c.K + first % c.K)] =
              to_double(diff_dst[o]);
        }
  for (std::int64_t n = 0; n < c.N; ++n)
    for (std::int64_t ch = 0; ch < c.C; ++ch)
      for (std::int64_t h = 0; h < c.IH; ++h)
        for (std::int64_t w = 0; w < c.IW; ++w)
          ASSERT_EQ(to_double(diff_src[offset(a, n, ch, h, w)]),
                    expect_ds[static_cast<std::size_t>(((n * c.C + ch) * c.IH + h) * c.IW + w)])
              << "diff_src n " << n << " c " << ch << " h " << h << " w " << w;
}

class MaxPoolVsReference : public ::testing::TestWithParam<Case> {};

TEST_P(MaxPoolVsReference, MaximaIndicesAndRoutedGradients) {
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  if (!max_pool_isa_available(GetParam().isa)) GTEST_SKIP() << "no AVX-512 on this CPU";
  if (GetParam().bf16)
    check_case<bf16>(GetParam());
  else
    check_case<float>(GetParam());
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (bool b16 : {false, true}) {
    out.push_back({"nhwc", 3, 32, 24, 24, 2, b16});  // cnn's first pooling, in small
    out.push_back({"nhwc", 2, 24, 7, 9, 2, b16});    // 16 + 8 lanes; a row and a column uncovered
    out.push_back({"nhwc", 2, 3, 10, 11, 3, b16});   // lanes below 16, K 3
    out.push_back({"blocked16", 2, 64, 8, 8, 2, b16});  // cnn's second pooling (f32: nChw16c)
    out.push_back({"blocked16", 1, 32, 13, 13, 4, b16});
    out.push_back({"blocked8", 2, 16, 6, 5, 2, b16});
    // A ReLU fused: the cnn's two poolings, lanes below 16, and K 11 (the largest window whose
    // index leaves bit 7 free).
    out.push_back({"nhwc", 3, 32, 24, 24, 2, b16, true});
    out.push_back({"blocked16", 2, 64, 8, 8, 2, b16, true});
    out.push_back({"nhwc", 2, 3, 10, 11, 3, b16, true});
    out.push_back({"blocked16", 1, 16, 23, 22, 11, b16, true});
  }
  const std::size_t n = out.size();
  for (std::size_t i = 0; i < n; ++i) {
    out[i].isa = PoolIsa::kPortable;
    out.push_back(out[i]);
    out.back().isa = PoolIsa::kAvx512;
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Layouts, MaxPoolVsReference, ::testing::ValuesIn(cases()), case_name);

TEST(MaxPool, SupportsOnlyWholeLaneGroupsAndByteIndices) {
  const PoolLayout nhwc{32, 32 * 8 * 8, 0, 8 * 32, 32}, blocked{16, 48 * 64, 64 * 16, 8 * 16, 16};
  EXPECT_TRUE(max_pool_supported({2, 32, 8, 8, 2, nhwc, nhwc}));
  EXPECT_FALSE(max_pool_supported({2, 48, 8, 8, 2, nhwc, nhwc}));           // C not the lanes
  EXPECT_TRUE(max_pool_supported({2, 48, 8, 8, 2, blocked, blocked}));      // 3 groups of 16
  EXPECT_FALSE(max_pool_supported({2, 40, 8, 8, 2, blocked, blocked}));     // a padded group
  EXPECT_FALSE(max_pool_supported({2, 32, 8, 8, 2, nhwc, blocked}));        // lanes differ
  EXPECT_FALSE(max_pool_supported({2, 32, 16, 16, 16, nhwc, nhwc}));        // K * K > 255
  EXPECT_TRUE(max_pool_supported({2, 32, 24, 24, 12, nhwc, nhwc}));         // K * K 144: a byte
  EXPECT_FALSE(max_pool_supported({2, 32, 24, 24, 12, nhwc, nhwc, true}));  // bit 7 taken
  EXPECT_TRUE(max_pool_supported({2, 32, 22, 22, 11, nhwc, nhwc, true}));   // K * K 121
  EXPECT_FALSE(max_pool_supported({2, 32, 3, 8, 4, nhwc, nhwc}));           // no whole window
}

}  // namespace max_pool_test
}  // namespace cohort::nn
