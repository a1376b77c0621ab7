// Rng::unit_of against the definition it implements: the draw's top 24 bits over 2^24, computed
// here in double from the 64-bit value (unit_of converts through int32 so that loops of draws
// vectorize at AVX2; the two must agree on every draw).
#include "cohort/core/rng.hpp"

#include <gtest/gtest.h>

#include <cstdint>

namespace cohort {
namespace rng_test {

float top_24_bits(std::uint64_t draw) {
  return static_cast<float>(static_cast<double>(draw >> 40) / 16777216.0);
}

TEST(Rng, UnitOfIsTheTop24BitsOverTwoToThe24) {
  for (const std::uint64_t edge :
       {std::uint64_t{0}, (std::uint64_t{1} << 40) - 1, std::uint64_t{1} << 40,
        std::uint64_t{1} << 63, ~std::uint64_t{0}})
    EXPECT_EQ(Rng::unit_of(edge), top_24_bits(edge)) << "draw " << edge;
  EXPECT_EQ(Rng::unit_of(~std::uint64_t{0}), 1.0f - 0x1.0p-24f);  // the largest: below 1
  constexpr std::uint64_t kSeed = 20261203;
  Rng rng({kSeed});
  for (int i = 0; i < 100000; ++i) {
    const std::uint64_t draw = rng.next_u64();
    ASSERT_EQ(Rng::unit_of(draw), top_24_bits(draw)) << "seed " << kSeed << " draw " << i;
  }
}

}  // namespace rng_test
}  // namespace cohort
