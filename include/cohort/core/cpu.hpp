// What the CPU running this process can execute, from cpuid and the OS's saved register state,
// and the build's target regions for cohort's own kernels.
//
// The default build targets x86-64-v3 (AVX2, FMA, BMI2; CMakeLists.txt). The few kernels of
// cohort's own that need AVX-512 or AVX512_BF16 (the bf16 row-pair weight gradients in
// src/nn/row_pairs.cpp, max pooling in src/nn/max_pool.cpp) are compiled for those ISAs inside
// COHORT_TARGET_* regions and chosen at run time from cpu_features(), so every build contains them
// and runs them wherever the CPU has them, and no instruction past the baseline runs elsewhere.
#pragma once

#include <string>

namespace cohort {

struct CpuFeatures {
  bool avx2 = false, fma = false, bmi2 = false;  // x86-64-v3, the default build's baseline
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512_bf16 = false;  // VDPBF16PS / VCVTNE2PS2BF16
  bool amx_bf16 = false;     // AMX tiles with bf16 (oneDNN's avx512_core_amx)

  // AVX-512 F/BW/VL/DQ with the OS saving the zmm and mask registers: cohort's AVX-512 kernels.
  bool avx512() const { return avx512f && avx512bw && avx512vl && avx512dq; }
  // avx512() and AVX512_BF16: the row-pair kernel.
  bool avx512_bf16_kernels() const { return avx512() && avx512_bf16; }
  // The x86-64-v3 baseline the default build is compiled for.
  bool x86_64_v3() const { return avx2 && fma && bmi2; }
};

// This CPU's features (read once; an instruction set the OS does not enable counts as absent),
// capped by the environment variable COHORT_MAX_CPU_ISA where it is set, so that one machine runs
// the lower paths of cohort's own kernels too (as ONEDNN_MAX_CPU_ISA caps oneDNN's): avx2 (the
// x86-64-v3 baseline: no AVX-512, no AMX), avx512 (no AVX512_BF16, no AMX), avx512_bf16 (no AMX),
// amx or all (no cap; any case). A cap never adds what the CPU lacks. The loader's choice of the
// root's elementwise clones (COHORT_CLONES_AVX512, the same bits at either width) follows the
// CPU, not the cap. Another value: InputError naming the variable (the CLI checks it before any
// work, exit 2).
const CpuFeatures& cpu_features();

// The kernels cohort dispatches to on this CPU, for --version and the run header:
// "avx512_bf16", "avx512" or "portable".
std::string cohort_kernels_isa();

}  // namespace cohort

// COHORT_TARGET_AVX512_BEGIN ... COHORT_TARGET_END: the functions defined between them (lambdas
// and templates included) are compiled for AVX-512 F/BW/VL/DQ (_BF16: and AVX512_BF16), whatever
// the build's target; callers reach them only where cpu_features() says the CPU has them.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define COHORT_X86_DISPATCH 1
#define COHORT_PRAGMA(x) _Pragma(#x)
#if defined(__clang__)
#define COHORT_TARGET_BEGIN(isa) \
  COHORT_PRAGMA(clang attribute push(__attribute__((target(isa))), apply_to = function))
#define COHORT_TARGET_END COHORT_PRAGMA(clang attribute pop)
#else
#define COHORT_TARGET_BEGIN(isa) COHORT_PRAGMA(GCC push_options) COHORT_PRAGMA(GCC target(isa))
#define COHORT_TARGET_END COHORT_PRAGMA(GCC pop_options)
#endif
#define COHORT_TARGET_AVX512_BEGIN COHORT_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq")
#define COHORT_TARGET_AVX512_BF16_BEGIN \
  COHORT_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")
// A function compiled twice, for the baseline and for x86-64-v4 (AVX-512 F/BW/CD/DQ/VL), the
// loader choosing one by cpuid (an ifunc): for the root's elementwise sweeps, where 16 lanes
// beat 8 once the data is in cache. Elementwise float code gives the same bits at either width.
// GCC only: clang 14 leaves the clones' dispatcher of a function defined in one file undefined
// for callers in another (the sanitizer and fuzzer presets build with clang: baseline code there).
#if defined(__clang__)
#define COHORT_CLONES_AVX512
#else
#define COHORT_CLONES_AVX512 __attribute__((target_clones("arch=x86-64-v4", "default")))
#endif
#else
#define COHORT_CLONES_AVX512
#endif
