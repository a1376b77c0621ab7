// cpu_features() against the kernel's own reading of the CPU: the flags line of /proc/cpuinfo
// (Linux lists an extension there only when the CPU has it and the kernel enabled its state).
#include "cohort/core/cpu.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

namespace cohort {
namespace cpu_test {

std::set<std::string> proc_cpuinfo_flags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    std::set<std::string> flags;
    for (std::string w; words >> w;) flags.insert(w);
    return flags;
  }
  return {};
}

TEST(CpuFeatures, AgreeWithProcCpuinfo) {
#if !defined(__x86_64__)
  GTEST_SKIP() << "x86-64 only";
#endif
  const std::set<std::string> flags = proc_cpuinfo_flags();
  if (flags.empty()) GTEST_SKIP() << "no flags line in /proc/cpuinfo";
  const CpuFeatures& f = cpu_features();
  const auto has = [&](const char* name) { return flags.count(name) == 1; };
  EXPECT_EQ(f.avx2, has("avx2"));
  EXPECT_EQ(f.fma, has("fma"));
  EXPECT_EQ(f.bmi2, has("bmi2"));
  EXPECT_EQ(f.avx512f, has("avx512f"));
  EXPECT_EQ(f.avx512bw, has("avx512bw"));
  EXPECT_EQ(f.avx512vl, has("avx512vl"));
  EXPECT_EQ(f.avx512dq, has("avx512dq"));
  EXPECT_EQ(f.avx512_bf16, has("avx512_bf16"));
  EXPECT_EQ(f.amx_bf16, has("amx_bf16") && has("amx_tile"));
}

TEST(CpuFeatures, KernelsIsaFollowsTheFeatures) {
  const CpuFeatures& f = cpu_features();
  const std::string isa = cohort_kernels_isa();
#if defined(COHORT_X86_DISPATCH)
  EXPECT_EQ(isa, f.avx512_bf16_kernels() ? "avx512_bf16" : f.avx512() ? "avx512" : "portable");
#else
  EXPECT_EQ(isa, "portable");
#endif
  // This process is running: a default build's baseline must hold.
#if defined(__x86_64__) && defined(__AVX2__)
  EXPECT_TRUE(f.x86_64_v3());
#endif
}

}  // namespace cpu_test
}  // namespace cohort
