// The oneDNN library this process runs on, for `cohort --version` and bug reports. The nn
// module is the only one that includes oneDNN, so the question is asked here.
#pragma once

#include <string>
#include <string_view>

#include "cohort/core/names.hpp"

namespace cohort::nn {

// "2.6.3 (cpu runtime OMP)", or "2.6.3 (commit abc1234, cpu runtime OMP)": the loaded library's
// version (dnnl_version()), not the headers cohort was built with.
std::string onednn_version();

// The instruction set oneDNN dispatches to on this CPU (dnnl::get_effective_cpu_isa), e.g.
// "avx512_core_amx", for the run's header.
std::string onednn_isa();
// Whether this CPU has native bf16 dot products (AVX512_BF16: cohort::cpu_features()).
bool cpu_has_bf16();

// What oneDNN can do with bf16 here: nothing (oneDNN 2.6 has no bf16 kernels below AVX-512, so
// a bf16 primitive cannot even be created: the probe tries one), emulated (AVX-512 without
// AVX512_BF16: several times the cost of f32) or native.
enum class Bf16Support { kNone, kEmulated, kNative };
inline constexpr Named<Bf16Support> kBf16SupportNames[] = {{Bf16Support::kNone, "none"},
                                                           {Bf16Support::kEmulated, "emulated"},
                                                           {Bf16Support::kNative, "native"}};
Bf16Support bf16_support();  // probed once per process

// The loaded OpenBLAS (the small f32 weight gradients of language models on CPUs where oneDNN's
// inner product is its gemm-based one: docs/decisions.md, "Small weight gradients on OpenBLAS"),
// e.g. "0.3.21 (OpenMP build, kernels Zen)".
std::string openblas_version();
// OpenBLAS's kernels: openblas_get_corename(), e.g. "Haswell".
std::string openblas_core();
// Whether the loaded OpenBLAS is its OpenMP build, which runs a call on the calling thread when
// that thread's OpenMP limit is 1 and may be called from several threads at once (the serial
// build may not), and its kernels fit this CPU (openblas_core_fits). Otherwise those gradients
// stay on oneDNN. The first call sets OpenBLAS's thread count, and the calling thread's OpenMP
// limit, to 1 (a plan that uses OpenBLAS asks before any replica runs it).
bool openblas_usable();
// Whether OpenBLAS's kernels `core` (openblas_get_corename()) are of AVX2's class or better where
// the CPU has AVX2 (`avx2`): a CPU its build does not know gets an older core's kernels (an Intel
// Xeon of family 6 model 207 gets "Prescott", SSE3), which cohort does not call. Case-insensitive.
bool openblas_core_fits(std::string_view core, bool avx2);

// The kernels this process dispatches, which decide a run's bits beside its config:
// "onednn:<isa>,cohort:<isa>,openblas:<core>" (onednn_isa, cohort_kernels_isa, OpenBLAS's core).
// Two machines with the same set give the same weights for the same config and data; the
// effective config records it.
std::string kernel_set();

}  // namespace cohort::nn
