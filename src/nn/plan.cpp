// The steps of a plan bound to the caller's arrays and run (plan.hpp); Net and GptNet share them.
#include "plan.hpp"

#include <chrono>

#include "cohort/core/error.hpp"

namespace cohort::nn::detail {

void bind_arrays(Plan& p, const void* params, std::size_t param_bytes, float* grad) {
  if (p.bound_params != params) {
    auto* base = static_cast<char*>(const_cast<void*>(params));
    for (auto& e : p.params) e.mem.set_data_handle(base + e.offset * param_bytes);
    p.bound_params = params;
  }
  if (grad && p.bound_grad != grad) {
    for (auto& e : p.grads) e.mem.set_data_handle(grad + e.offset);
    p.bound_grad = grad;
  }
}

void run_steps(std::vector<Exec>& steps, dnnl::stream& stream, PhaseTimes& times,
               const std::string& what) {
  using Clock = std::chrono::steady_clock;
  for (Exec& e : steps) {
    const auto t0 = Clock::now();
    if (e.custom) {
      e.custom();
    } else {
      try {
        e.prim.execute(stream, e.args);
      } catch (const dnnl::error& err) {
        throw InternalError("oneDNN: running " + what + ", " + e.where + ": " + err.what() +
                            " (status " + std::to_string(static_cast<int>(err.status)) + ")");
      }
    }
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    (e.phase == Phase::kMatmul      ? times.matmul
     : e.phase == Phase::kAttention ? times.attention
     : e.phase == Phase::kEltwise   ? times.eltwise
                                    : times.other) += dt;
  }
  stream.wait();
}

}  // namespace cohort::nn::detail
