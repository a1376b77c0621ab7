// Private to src/nn: what a GptNet's plan is built for, and the function that builds one
// (plan_gpt.cpp) as a detail::Plan, which gpt_net.cpp binds and runs.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "../plan.hpp"
#include "cohort/nn/gpt/gpt.hpp"

namespace cohort::nn::detail {

// The weights in the primitives' layouts: one copy per (weight, layout), which every plan of a
// GptNet shares (its training plans and its inference plans: an evaluation's plan would
// otherwise hold a second copy of every weight), and the GptNets that share them
// (GptNet::share_weight_copies: the trainer's replicas, which run on the same weights at the same
// time). A plan's prepare steps write each copy it reads through write(), while the net holds
// lock() for the whole prepare (one hand-off between replicas a step, not one a copy), and only
// if the copy does not already hold the weights of this version (changed()'s count) and this
// parameter array, so that the nets sharing it reorder each weight once a step.
class WeightCopies {
 public:
  struct Copy {
    std::size_t offset;
    dnnl::memory memory;
    std::uint64_t version = 0;  // of the weights it holds (0: none)
    const void* params = nullptr;
  };
  // The copy of the weight at `offset` in layout `md`, made (uninitialised) on first use. Called
  // while plans are built, one at a time (build_gpt_plan).
  Copy& get(std::size_t offset, const dnnl::memory::desc& md, const dnnl::engine& eng) {
    for (const auto& c : copies_)
      if (c->offset == offset && c->memory.get_desc() == md) return *c;
    storage_.emplace_back((md.get_size() + sizeof(float) - 1) / sizeof(float));
    bytes_ += md.get_size();
    auto& c = copies_.emplace_back(std::make_unique<Copy>());
    c->offset = offset;
    c->memory = dnnl::memory(md, eng, storage_.back().data());
    return *c;
  }
  // The weights may have changed (each sharing net's weights_changed).
  void changed() { version_.fetch_add(1, std::memory_order_relaxed); }
  // Held by a net while it runs a plan's prepare steps.
  std::mutex& lock() { return lock_; }
  // Runs `reorder` into `copy` unless it holds this version of `params` already; the caller
  // holds lock(). Before the first changed(), every call writes.
  template <class F>
  void write(Copy& copy, const void* params, F&& reorder) {
    const std::uint64_t v = version_.load(std::memory_order_relaxed);
    if (v != 0 && copy.version == v && copy.params == params) return;
    reorder();
    copy.version = v;
    copy.params = params;
  }
  std::size_t bytes() const { return bytes_; }

 private:
  std::vector<std::unique_ptr<Copy>> copies_;
  std::vector<AlignedBuffer<float>> storage_;
  std::size_t bytes_ = 0;
  std::atomic<std::uint64_t> version_{0};
  std::mutex lock_;
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
  dnnl::stream* stream;         // the net's: the prepare steps' reorders run on it
};

// The plan: forward ends with the logits (Plan::logits, (N x block, vocab) f32); training's
// backward starts from Plan::diff_logits, written by the caller. Its parameter and gradient
// views are Plan::params and Plan::grads; its custom steps read Plan::bound_params and
// Plan::bound_grad. oneDNN errors are rethrown as InternalError naming the model, N and the
// tensor being built.
std::unique_ptr<Plan> build_gpt_plan(const GptPlanRequest& request);

}  // namespace cohort::nn::detail
