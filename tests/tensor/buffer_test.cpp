// AlignedBuffer's allocation: a small array on a cache line, zeroed unless asked not to be; an
// array of kHugePageArrayBytes or more on a 2 MiB boundary, its mapping eligible for transparent
// huge pages wherever the kernel's mode is not "never" (/proc/self/smaps' THPeligible).
// ArrayArena: the same placement for arrays carved out of shared regions, every array zeroed,
// apart from the others and where it was put, every region eligible for huge pages.
#include "cohort/tensor/buffer.hpp"

#include "../common/sanitizers.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

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

constexpr std::size_t kTwoMiB = std::size_t{2} << 20;

// The first of p's n bytes that is not `value`, or n.
std::size_t first_other(const std::uint8_t* p, std::size_t n, std::uint8_t value) {
  return static_cast<std::size_t>(
      std::find_if(p, p + n, [&](std::uint8_t b) { return b != value; }) - p);
}

TEST(ArrayArena, ArraysAreZeroedAlignedApartAndStayPut) {
  // Sizes around the cache line, the huge-page threshold and a region's first reservation
  // (32 MiB), enough in all to take several regions.
  const std::vector<std::size_t> sizes = {0,
                                          1,
                                          63,
                                          64,
                                          100,
                                          4096,
                                          (1u << 20) + 3,
                                          kHugePageArrayBytes - 1,
                                          kHugePageArrayBytes,
                                          kHugePageArrayBytes + 5,
                                          3000,
                                          std::size_t{40} << 20,
                                          17,
                                          std::size_t{30} << 20,
                                          (std::size_t{3} << 20) + 1};
  ArrayArena arena;
  std::vector<std::uint8_t*> arrays;
  std::size_t asked = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const std::size_t n = sizes[i];
    auto* p = static_cast<std::uint8_t*>(arena.allocate(n));
    ASSERT_NE(p, nullptr) << n;
    EXPECT_EQ(address(p) % (n >= kHugePageArrayBytes ? kTwoMiB : kCacheLine), 0u) << n;
    EXPECT_EQ(first_other(p, n, 0), n) << "array " << i << " of " << n << " bytes not zeroed";
    std::memset(p, static_cast<int>(i + 1), n);
    arrays.push_back(p);
    asked += n;
  }
  EXPECT_EQ(arena.bytes(), asked);
  // Each array kept its own bytes through every later allocation: none overlaps another or moved.
  for (std::size_t i = 0; i < sizes.size(); ++i)
    EXPECT_EQ(first_other(arrays[i], sizes[i], static_cast<std::uint8_t>(i + 1)), sizes[i])
        << "array " << i << " of " << sizes[i] << " bytes overwritten";
  // Distinct addresses, even for the empty array.
  std::vector<std::uint8_t*> sorted = arrays;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end());

  ArrayArena moved(std::move(arena));
  EXPECT_EQ(moved.bytes(), asked);
  EXPECT_EQ(arena.bytes(), 0u);  // NOLINT(bugprone-use-after-move): moved-from is empty
  EXPECT_EQ(arrays.back()[0], static_cast<std::uint8_t>(sizes.size()));
  auto* after = moved.allocate_array<float>(10);
  EXPECT_EQ(after[9], 0.0f);
}

// Under AddressSanitizer, a write past an array's last cache line is reported (the arena poisons
// what it has not handed out); elsewhere the test says why it is skipped.
TEST(ArrayArenaDeathTest, AWritePastAnArraysEndIsReportedUnderAddressSanitizer) {
  if (!testing::kAsan) GTEST_SKIP() << "not an AddressSanitizer build";
  ArrayArena arena;
  auto* a = static_cast<volatile std::uint8_t*>(arena.allocate(100));
  arena.allocate(100);
  a[127] = 1;  // the array's last line, as AlignedBuffer's
  EXPECT_DEATH(a[128] = 1, "use-after-poison");
}

TEST(ArrayArena, SmallArraysAskForHugePages) {
  ArrayArena arena;
  float* a = arena.allocate_array<float>(1000);
  a[0] = 1.0f;  // touched, so smaps lists the mapping's pages
  const std::string mode = thp_mode();
  const int eligible = thp_eligible(a);
  std::printf("transparent huge pages: mode \"%s\", THPeligible %d\n", mode.c_str(), eligible);
  if (mode.empty() || mode == "never" || eligible < 0)
    GTEST_SKIP() << "this kernel gives no transparent huge pages to check";
  EXPECT_EQ(eligible, 1);
}

}  // namespace
}  // namespace cohort
