// Private to src/nn: what a GptNet's plan is built for, and the function that builds one
// (plan_gpt.cpp) as a detail::Plan, which gpt_net.cpp binds and runs.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <cstdint>
#include <memory>
#include <vector>

#include "../plan.hpp"
#include "cohort/nn/gpt/gpt.hpp"

namespace cohort::nn::detail {

// `key` and `windows` are read when the plan runs: the current call's dropout streams and token
// windows (N x (block + 1)).
struct GptPlanRequest {
  const GptModel* model;
  const dnnl::engine* engine;
  const StreamKey* key;
  const std::int32_t* const* windows;
  std::int64_t N;
  bool training;
  Precision precision;
  GptPaths paths;
  WeightCopies* weight_copies;  // the net's, which outlive the plan
  dnnl::stream* stream;         // the net's: the prepare steps' reorders run on it
};

// The plan: forward ends with the logits (Plan::logits, (N x block, vocab) f32); training's
// backward starts from Plan::diff_logits, written by the caller. Its parameter and gradient
// views are Plan::params and Plan::grads; its custom steps read Plan::bound_params and
// Plan::bound_grad. oneDNN errors are rethrown as InternalError naming the model, N and the
// tensor being built.
std::unique_ptr<Plan> build_gpt_plan(const GptPlanRequest& request);

}  // namespace cohort::nn::detail
