// Gradient checks: the position of the first non-finite value and the float64 sum of squares.
#include "cohort/optim/gradient.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace cohort::optim {
namespace gradient_test {

TEST(Gradient, FirstNonFiniteFindsNanAndInfinitiesAnywhere) {
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity()};
  for (std::size_t n : {1u, 15u, 255u, 256u, 257u, 1000u}) {
    std::vector<float> x(n, 1.0f);
    EXPECT_EQ(first_non_finite(x.data(), n), n);
    for (float s : specials)
      for (std::size_t at : {std::size_t{0}, n / 2, n - 1}) {
        std::vector<float> y = x;
        y[at] = s;
        if (at + 1 < n) y[n - 1] = s;  // a later one must not hide the first
        EXPECT_EQ(first_non_finite(y.data(), n), at) << "n=" << n << " at=" << at;
      }
  }
  // Extremes that are finite: the largest float, denormals, negative zero.
  std::vector<float> edge{std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::denorm_min(), -0.0f};
  EXPECT_EQ(first_non_finite(edge.data(), edge.size()), edge.size());
  EXPECT_EQ(first_non_finite(nullptr, 0), 0u);
}

TEST(Gradient, SumSquaresMatchesFloat64AndIsReproducible) {
  constexpr std::uint64_t kSeed = 3;
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  std::mt19937_64 rng(kSeed);
  std::normal_distribution<float> normal;
  for (std::size_t n : {0u, 1u, 15u, 16u, 17u, 1000u, 65537u}) {
    std::vector<float> x(n);
    for (auto& v : x) v = normal(rng);
    double naive = 0;
    for (float v : x) naive += double(v) * double(v);
    const double got = sum_squares(x.data(), n);
    EXPECT_NEAR(got, naive, 1e-12 * (1 + naive)) << n;
    EXPECT_EQ(got, sum_squares(x.data(), n));  // same input, same bits
  }
  const float big = 1e30f;  // squares overflow float but not double
  EXPECT_DOUBLE_EQ(sum_squares(&big, 1), 1e60 * (double(big) / 1e30) * (double(big) / 1e30));
}

}  // namespace gradient_test
}  // namespace cohort::optim
