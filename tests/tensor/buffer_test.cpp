// AlignedBuffer's allocation: a small array on a cache line, zeroed unless asked not to be; an
// array of kHugePageArrayBytes or more on a 2 MiB boundary, its mapping eligible for transparent
// huge pages wherever the kernel's mode is not "never" (/proc/self/smaps' THPeligible).
#include "cohort/tensor/buffer.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>

namespace cohort {
namespace {

std::uintptr_t address(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

// The THPeligible field of the mapping that holds `p`, or -1 where smaps does not give one.
int thp_eligible(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    std::uintptr_t lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(':') > line.find(' ')) {
      inside = lo <= address(p) && address(p) < hi;
      continue;
    }
    if (inside && line.rfind("THPeligible:", 0) == 0) return std::stoi(line.substr(12));
  }
  return -1;
}

std::string thp_mode() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string s;
  std::getline(f, s);
  const auto open = s.find('['), close = s.find(']');
  return open == std::string::npos ? "" : s.substr(open + 1, close - open - 1);
}

TEST(AlignedBuffer, ASmallArrayIsOnACacheLineAndZeroed) {
  AlignedBuffer<float> small(1000);
  EXPECT_EQ(address(small.data()) % kCacheLine, 0u);
  for (std::size_t i = 0; i < small.size(); ++i) ASSERT_EQ(small[i], 0.0f) << i;
  AlignedBuffer<float> moved(std::move(small));
  EXPECT_EQ(moved.size(), 1000u);
  EXPECT_EQ(small.data(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from is empty
}

TEST(AlignedBuffer, ALargeArrayIsOnA2MiBBoundaryAndAsksForHugePages) {
  const std::size_t n = kHugePageArrayBytes / sizeof(float) + 3;  // not a whole huge page
  AlignedBuffer<float> large(n);
  EXPECT_EQ(address(large.data()) % (std::size_t{2} << 20), 0u);
  EXPECT_EQ(large[n - 1], 0.0f);
  large[n - 1] = 1.0f;
  AlignedBuffer<float> unset(n, AlignedBuffer<float>::Uninitialized{});
  EXPECT_EQ(address(unset.data()) % (std::size_t{2} << 20), 0u);
  const std::string mode = thp_mode();
  const int eligible = thp_eligible(large.data());
  std::printf("transparent huge pages: mode \"%s\", THPeligible %d\n", mode.c_str(), eligible);
  if (mode.empty() || mode == "never" || eligible < 0)
    GTEST_SKIP() << "this kernel gives no transparent huge pages to check";
  EXPECT_EQ(eligible, 1);
  EXPECT_EQ(thp_eligible(unset.data()), 1);
}

}  // namespace
}  // namespace cohort
