// cpu_features(): cpuid leaves 1 and 7 (subleaves 0 and 1) and XCR0, the register state the OS
// saves: an ISA whose registers the OS does not save (AVX-512's zmm and masks, AMX's tiles) is
// reported absent even where cpuid lists it; then COHORT_MAX_CPU_ISA's cap.
#include "cohort/core/cpu.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "cohort/core/error.hpp"

namespace cohort {

namespace {

CpuFeatures detect() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  const unsigned max_leaf = __get_cpuid_max(0, nullptr);
  if (max_leaf < 1) return f;
  __cpuid(1, a, b, c, d);
  const bool osxsave = (c >> 27) & 1u, avx = (c >> 28) & 1u, fma = (c >> 12) & 1u;
  if (!osxsave || !avx) return f;
  unsigned xcr0_lo = 0, xcr0_hi = 0;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  const bool ymm_saved = (xcr0_lo & 0x6u) == 0x6u;                 // SSE and AVX state
  const bool zmm_saved = ymm_saved && (xcr0_lo & 0xe0u) == 0xe0u;  // opmask, ZMM_Hi256, Hi16_ZMM
  const bool tiles_saved = ((xcr0_lo >> 17) & 0x3u) == 0x3u;       // XTILECFG, XTILEDATA
  if (!ymm_saved || max_leaf < 7) return f;
  __cpuid_count(7, 0, a, b, c, d);
  f.avx2 = (b >> 5) & 1u;
  f.bmi2 = (b >> 8) & 1u;
  f.fma = fma;
  if (zmm_saved) {
    f.avx512f = (b >> 16) & 1u;
    f.avx512dq = (b >> 17) & 1u;
    f.avx512bw = (b >> 30) & 1u;
    f.avx512vl = (b >> 31) & 1u;
  }
  f.amx_bf16 = tiles_saved && ((d >> 22) & 1u) && ((d >> 24) & 1u);  // AMX-BF16 and AMX-TILE
  const unsigned subleaves = a;
  if (zmm_saved && subleaves >= 1) {
    __cpuid_count(7, 1, a, b, c, d);
    f.avx512_bf16 = f.avx512f && ((a >> 5) & 1u);
  }
#endif
  return f;
}

// f with what COHORT_MAX_CPU_ISA leaves out removed (cpu.hpp).
CpuFeatures capped(CpuFeatures f) {
  const char* value = std::getenv("COHORT_MAX_CPU_ISA");
  if (value == nullptr) return f;
  std::string cap = value;
  std::transform(cap.begin(), cap.end(), cap.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (cap == "all" || cap == "amx") return f;
  if (cap != "avx512_bf16" && cap != "avx512" && cap != "avx2")
    throw InputError(
        "environment variable COHORT_MAX_CPU_ISA: expected avx2, avx512, avx512_bf16, "
        "amx or all, found \"" +
        std::string(value) + "\"");
  f.amx_bf16 = false;
  if (cap == "avx512_bf16") return f;
  f.avx512_bf16 = false;
  if (cap == "avx512") return f;
  f.avx512f = f.avx512bw = f.avx512vl = f.avx512dq = false;
  return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = capped(detect());
  return features;
}

std::string cohort_kernels_isa() {
#if defined(COHORT_X86_DISPATCH)
  const CpuFeatures& f = cpu_features();
  if (f.avx512_bf16_kernels()) return "avx512_bf16";
  if (f.avx512()) return "avx512";
#endif
  return "portable";
}

}  // namespace cohort
