// nn::onednn_version: what dnnl_version() reports about the loaded oneDNN.
#include "cohort/nn/version.hpp"

#include <oneapi/dnnl/dnnl.h>

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

}  // namespace cohort::nn
