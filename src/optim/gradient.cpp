// Gradient checks: vectorisable loops with a fixed order of additions.
#include "cohort/optim/gradient.hpp"

#include <cstdint>
#include <cstring>

namespace cohort::optim {

std::size_t first_non_finite(const float* x, std::size_t count) {
  // A float is non-finite exactly when its exponent bits are all ones. The scan ORs whole blocks
  // (integer ops vectorise freely) and looks inside a block only when one is flagged.
  constexpr std::uint32_t kExponent = 0x7f800000u;
  constexpr std::size_t kBlock = 256;
  for (std::size_t b = 0; b < count; b += kBlock) {
    const std::size_t n = count - b < kBlock ? count - b : kBlock;
    std::uint32_t worst = 0;
    for (std::size_t i = 0; i < n; ++i) {
      std::uint32_t bits;
      std::memcpy(&bits, x + b + i, sizeof bits);
      const std::uint32_t e = bits & kExponent;
      worst = e > worst ? e : worst;
    }
    if (worst != kExponent) continue;
    for (std::size_t i = 0; i < n; ++i) {
      std::uint32_t bits;
      std::memcpy(&bits, x + b + i, sizeof bits);
      if ((bits & kExponent) == kExponent) return b + i;
    }
  }
  return count;
}

double sum_squares(const float* x, std::size_t count) {
  constexpr std::size_t kLanes = 16;
  double lane[kLanes] = {};
  std::size_t i = 0;
  for (; i + kLanes <= count; i += kLanes)
    for (std::size_t j = 0; j < kLanes; ++j) {
      const double v = x[i + j];
      lane[j] += v * v;
    }
  for (std::size_t j = 0; i + j < count; ++j) {
    const double v = x[i + j];
    lane[j] += v * v;
  }
  double total = 0;
  for (double v : lane) total += v;
  return total;
}

}  // namespace cohort::optim
