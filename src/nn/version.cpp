// nn::onednn_version, onednn_isa: what the loaded oneDNN reports; cpu_has_bf16 from cpuid;
// bf16_support: whether oneDNN creates a bf16 primitive here at all; openblas_version and
// openblas_usable: what the loaded OpenBLAS reports.
#include "cohort/nn/version.hpp"

#include <cblas.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cctype>
#include <iterator>
#include <string>
#include <string_view>

#include "cohort/core/cpu.hpp"

namespace cohort::nn {

std::string onednn_version() {
  const dnnl_version_t* v = dnnl_version();
  const std::string runtime = v->cpu_runtime == DNNL_RUNTIME_OMP   ? "OMP"
                              : v->cpu_runtime == DNNL_RUNTIME_TBB ? "TBB"
                              : v->cpu_runtime == DNNL_RUNTIME_SEQ ? "sequential"
                                                                   : "other";
  // Distribution builds (Debian's) report the hash as "N/A".
  const std::string hash = v->hash ? v->hash : "";
  const std::string commit =
      hash.empty() || hash == "N/A" ? "" : "commit " + hash.substr(0, 7) + ", ";
  return std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
         std::to_string(v->patch) + " (" + commit + "cpu runtime " + runtime + ")";
}

std::string onednn_isa() {
  using dnnl::cpu_isa;
  switch (dnnl::get_effective_cpu_isa()) {
    case cpu_isa::all:
      return "all";
    case cpu_isa::sse41:
      return "sse41";
    case cpu_isa::avx:
      return "avx";
    case cpu_isa::avx2:
      return "avx2";
    case cpu_isa::avx512_mic:
      return "avx512_mic";
    case cpu_isa::avx512_mic_4ops:
      return "avx512_mic_4ops";
    case cpu_isa::avx512_core:
      return "avx512_core";
    case cpu_isa::avx512_core_vnni:
      return "avx512_core_vnni";
    case cpu_isa::avx512_core_bf16:
      return "avx512_core_bf16";
    case cpu_isa::avx512_core_amx:
      return "avx512_core_amx";
    case cpu_isa::avx2_vnni:
      return "avx2_vnni";
  }
  return "unknown (" + std::to_string(static_cast<int>(dnnl::get_effective_cpu_isa())) + ")";
}

bool cpu_has_bf16() { return cpu_features().avx512_bf16; }

Bf16Support bf16_support() {
  // The smallest bf16 inner product the Net builds (bf16 source and weights, f32 destination):
  // oneDNN 2.6 refuses its descriptor (status unimplemented) on a CPU without AVX-512.
  static const Bf16Support support = [] {
    try {
      using dt = dnnl::memory::data_type;
      using tag = dnnl::memory::format_tag;
      const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
      const dnnl::memory::desc src({16, 16}, dt::bf16, tag::ab), wei({16, 16}, dt::bf16, tag::any),
          dst({16, 16}, dt::f32, tag::ab);
      const dnnl::inner_product_forward::desc d(dnnl::prop_kind::forward_training, src, wei, dst);
      const dnnl::inner_product_forward::primitive_desc pd(d, engine);
    } catch (const dnnl::error&) {
      return Bf16Support::kNone;
    }
    return cpu_has_bf16() ? Bf16Support::kNative : Bf16Support::kEmulated;
  }();
  return support;
}

std::string openblas_version() {
  // openblas_get_config(): "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH NO_AFFINITY Zen MAX_THREADS=64"
  std::string_view config = openblas_get_config();
  std::string version = "unknown";
  if (config.starts_with("OpenBLAS ")) {
    config.remove_prefix(9);
    version = std::string(config.substr(0, config.find(' ')));
  }
  const int parallel = openblas_get_parallel();  // 0 serial, 1 pthreads, 2 OpenMP
  const char* build = parallel == 2 ? "OpenMP" : parallel == 1 ? "pthreads" : "serial";
  return version + " (" + build + " build, kernels " + openblas_get_corename() + ")";
}

std::string openblas_core() { return openblas_get_corename(); }

std::string kernel_set() {
  return "onednn:" + onednn_isa() + ",cohort:" + cohort_kernels_isa() +
         ",openblas:" + openblas_get_corename();
}

bool openblas_core_fits(std::string_view core, bool avx2) {
  if (!avx2) return true;
  // OpenBLAS 0.3's x86-64 kernels with AVX2 (DYNAMIC_ARCH's core names).
  static constexpr std::string_view kAvx2Cores[] = {
      "haswell", "zen", "skylakex", "cooperlake", "sapphirerapids", "excavator"};
  std::string lower(core);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return std::find(std::begin(kAvx2Cores), std::end(kAvx2Cores), lower) != std::end(kAvx2Cores);
}

bool openblas_usable() {
  static const bool usable = [] {
    if (openblas_get_parallel() != 2) return false;
    if (!openblas_core_fits(openblas_get_corename(), cpu_features().x86_64_v3())) return false;
    // OpenBLAS's OpenMP build starts at the core count and, when a call comes from a thread whose
    // OpenMP limit differs, resizes its shared thread buffers, unlocked. Set to 1 before any
    // replica calls it, every call from a replica (limit 1) takes the one-thread path untouched.
    // It also sets this thread's OpenMP limit to 1, as every replica's is.
    openblas_set_num_threads(1);
    return true;
  }();
  return usable;
}

}  // namespace cohort::nn
