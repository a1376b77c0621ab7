// The best of repeated timed runs, for floors measured on a shared machine (the roofline's parts):
// a floor is a minimum, and one noisy stretch must not raise it.
#pragma once

#include <algorithm>
#include <chrono>
#include <limits>

namespace cohort {

// The least of the seconds f() reports over repeated runs after one warm-up: at least 5 runs,
// more (up to 20) while they take under 0.2 s in all.
template <class F>
double best_of(F f) {
  f();
  double best = std::numeric_limits<double>::infinity();
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  for (int r = 0; r < 20 && (r < 5 || elapsed() < 0.2); ++r) best = std::min(best, f());
  return best;
}

}  // namespace cohort
