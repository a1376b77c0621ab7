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

// The weights in the primitives' layouts, which every plan of one GptNet shares (its training
// plans and its inference plans: an evaluation's plan would otherwise hold a second copy of
// every weight): one copy per (weight, layout). Each plan that reads a copy reorders the weights
// into it in its own prepare steps; a GptNet runs one plan at a time, and they all write the same
// values for the same weights.
class WeightCopies {
 public:
  // The copy of the weight at `offset` in layout `md`, made (uninitialised) on first use.
  dnnl::memory get(std::size_t offset, const dnnl::memory::desc& md, const dnnl::engine& eng) {
    for (const Copy& c : copies_)
      if (c.offset == offset && c.memory.get_desc() == md) return c.memory;
    storage_.emplace_back((md.get_size() + sizeof(float) - 1) / sizeof(float));
    bytes_ += md.get_size();
    copies_.push_back({offset, dnnl::memory(md, eng, storage_.back().data())});
    return copies_.back().memory;
  }
  std::size_t bytes() const { return bytes_; }

 private:
  struct Copy {
    std::size_t offset;
    dnnl::memory memory;
  };
  std::vector<Copy> copies_;
  std::vector<AlignedBuffer<float>> storage_;
  std::size_t bytes_ = 0;
};

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
};

// The plan: forward ends with the logits (Plan::logits, (N x block, vocab) f32); training's
// backward starts from Plan::diff_logits, written by the caller. Its parameter and gradient
// views are Plan::params and Plan::grads; its custom steps read Plan::bound_params and
// Plan::bound_grad. oneDNN errors are rethrown as InternalError naming the model, N and the
// tensor being built.
std::unique_ptr<Plan> build_gpt_plan(const GptPlanRequest& request);

}  // namespace cohort::nn::detail
