// Private to src/nn: a Plan — what oneDNN needs to run one Net at one batch size — and the
// function that builds one (plan_builder.cpp). net.cpp binds the caller's arrays and runs it.
// Not a public header: it includes oneDNN, which only src/nn may.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "cohort/nn/dropout.hpp"
#include "cohort/nn/executor.hpp"
#include "cohort/nn/model.hpp"
#include "cohort/nn/net.hpp"
#include "cohort/tensor/buffer.hpp"
#include "weight_pairs.hpp"

namespace cohort::nn::detail {

enum class Phase { kMatmul, kAttention, kEltwise, kOther };

// A memory object bound to a caller-owned array at a fixed element offset; rebound when the
// caller's base pointer changes.
struct External {
  dnnl::memory mem;
  std::size_t offset;  // in elements of the array (bf16 or float)
};

// The weights in the primitives' layouts: one copy per (weight, layout), which every plan of a
// net shares (its training plans and its inference plans: an evaluation's plan would otherwise
// hold a second copy of every weight), and the nets that share them (share_weight_copies: the
// trainer's replicas, which run on the same weights at the same time). A plan's prepare steps write
// each copy it reads through write(), while the net holds lock() for the whole prepare (one
// hand-off between replicas a step, not one a copy), and only if the copy does not already hold the
// weights of this version (changed()'s count) and this parameter array, so that the nets sharing it
// reorder each weight once a step.
// A caller that reports every write to one parameter array (keep(): the trainer's root, which
// writes the bf16 weights chunk by chunk) has the copies it can write a range of (pair-blocked,
// weight_pairs.hpp) kept current by refresh() instead, while the values it just wrote are in its
// cache: the plans then never reorder those.
class WeightCopies {
 public:
  struct Copy {
    std::size_t offset;
    dnnl::memory memory;
    std::uint64_t version = 0;  // of the weights it holds (0: none)
    const void* params = nullptr;
    std::optional<PairBlocks> blocks;  // where refresh can write a range of it
    bool kept = false;  // holds the kept array's values, written whole since and refreshed
  };
  // The copy of the weight at `offset` in layout `md`, made (uninitialised) on first use, with
  // `blocks` where refresh can write it from the parameters (fixed from then on: other nets'
  // prepare steps read it). Called while plans are built, one at a time.
  Copy& get(std::size_t offset, const dnnl::memory::desc& md, const dnnl::engine& eng,
            const std::optional<PairBlocks>& blocks) {
    for (const auto& c : copies_)
      if (c->offset == offset && c->memory.get_desc() == md) return *c;
    storage_.emplace_back((md.get_size() + sizeof(float) - 1) / sizeof(float));
    bytes_ += md.get_size();
    auto& c = copies_.emplace_back(std::make_unique<Copy>());
    c->offset = offset;
    c->memory = dnnl::memory(md, eng, storage_.back().data());
    c->blocks = blocks;
    return *c;
  }
  // The weights may have changed (each sharing net's weights_changed).
  void changed() { version_.fetch_add(1, std::memory_order_relaxed); }
  // Held by a net while it runs a plan's prepare steps.
  std::mutex& lock() { return lock_; }
  // Runs `reorder` into `copy` unless it holds this version of `params` already, or is kept
  // current (refresh); the caller holds lock(). Before the first changed(), every call writes.
  template <class F>
  void write(Copy& copy, const void* params, F&& reorder) {
    if (copy.kept && params == kept_) return;
    const std::uint64_t v = version_.load(std::memory_order_relaxed);
    if (v != 0 && copy.version == v && copy.params == params) return;
    reorder();
    copy.version = v;
    copy.params = params;
    copy.kept = copy.blocks && params == kept_;
  }
  // From now on the caller reports every write to the bf16 array `params` through refresh (a
  // null array: none). Before any plan runs on it.
  void keep(const bf16* params) { kept_ = params; }
  // Elements [begin, end) of the kept array were written: the kept copies take them. No plan runs
  // meanwhile; calls on disjoint ranges may run at once.
  void refresh(std::size_t begin, std::size_t end) {
    for (const auto& c : copies_) {
      if (!c->kept) continue;
      const std::size_t numel = static_cast<std::size_t>(c->blocks->O * c->blocks->I);
      const std::size_t lo = std::max(begin, c->offset), hi = std::min(end, c->offset + numel);
      if (lo < hi)
        to_pair_blocks(*c->blocks, kept_ + c->offset,
                       static_cast<bf16*>(c->memory.get_data_handle()), lo - c->offset,
                       hi - c->offset);
    }
  }
  std::size_t bytes() const { return bytes_; }

 private:
  std::vector<std::unique_ptr<Copy>> copies_;
  std::vector<AlignedBuffer<float>> storage_;
  std::size_t bytes_ = 0;
  std::atomic<std::uint64_t> version_{0};
  std::mutex lock_;
  const bf16* kept_ = nullptr;
};

// One step of a plan: a primitive with its arguments, or a plain function (dropout, rows).
struct Exec {
  dnnl::primitive prim;
  std::unordered_map<int, dnnl::memory> args;
  Phase phase;
  dnnl::memory::desc scratchpad_md;  // bound to the plan's scratchpad once its size is known
  std::function<void()> custom;
  std::string where;  // "conv1 forward": named in an error at execute time
};

// What oneDNN needs to run one batch size: steps in execution order and their buffers.
// In a bf16 Net the input, parameters and activations are bf16; gradients (grads), the logits
// and their gradient are f32.
struct Plan {
  ArrayArena arrays;                       // activations, gradients, reordered weights, masks
  AlignedBuffer<std::uint8_t> scratchpad;  // shared by all primitives: they run in sequence
  // Of the arrays' bytes: the logits and their gradient's copies (a language model's builder
  // counts them; nn::PlanMemory).
  std::size_t logits_bytes = 0;
  std::vector<Exec> forward, backward;
  // Steps that read only the parameters (the weights reordered into the primitives' layouts,
  // WeightCopies), run before forward where the parameters may have changed
  // (Net::weights_changed): `prepared` is the weights generation they last ran for, at
  // `prepared_params`.
  std::vector<Exec> prepare;
  std::uint64_t prepared = 0;
  const void* prepared_params = nullptr;
  dnnl::memory x;                       // the caller's input
  std::vector<External> params, grads;  // views into caller's arrays
  // bn layers' statistics (f32 in both precisions): training writes the batch mean and biased
  // variance into the caller's batch_stats, inference reads its running statistics.
  std::vector<External> stats;
  const void* bound_params = nullptr;
  float* bound_grad = nullptr;
  const float* bound_stats = nullptr;
  float* logits = nullptr;       // (N, C)
  float* diff_logits = nullptr;  // (N, C); a language model's is its logits (written over)
  // A language model's head in chunks of rows (GptPlanBuilder::head_rows): rows [first, first +
  // rows) of the positions, whose logits `forward` writes to `logits` (rows, padded vocabulary)
  // and, in training, whose backward from their gradient (written over them) `backward` runs,
  // before the plan's own backward steps. Empty where the head is one chunk, which `forward`
  // and `backward` run.
  struct HeadChunk {
    std::int64_t first = 0, rows = 0;
    std::vector<Exec> forward, backward;
  };
  std::vector<HeadChunk> head_chunks;
  PlanMemory memory() const { return {scratchpad.size() + arrays.bytes(), logits_bytes, 0}; }
};

// Runs the plan's prepare steps with `run`, under the copies' lock, unless they already ran for
// this weights generation (weights_changed's count; 0: before the first, every run prepares) and
// this parameter array.
template <class Run>
void prepare_plan(Plan& p, const void* params, std::uint64_t generation, WeightCopies& copies,
                  Run&& run) {
  if (p.prepare.empty()) return;
  if (generation != 0 && p.prepared == generation && p.prepared_params == params) return;
  const std::lock_guard hold(copies.lock());
  run(p.prepare);
  p.prepared = generation;
  p.prepared_params = params;
}

// Points the plan's parameter and gradient views at the caller's arrays, where they moved:
// `params` holds elements of `param_bytes` each (a float, or a bf16 for a bf16 net); `grad` may
// be null (inference). Shared by Net and GptNet.
void bind_arrays(Plan& p, const void* params, std::size_t param_bytes, float* grad);

// Runs `steps` in order on `stream` and waits for it, adding each step's seconds to its phase of
// `times`; a oneDNN error becomes an InternalError naming `what` (the model) and the step.
void run_steps(std::vector<Exec>& steps, dnnl::stream& stream, PhaseTimes& times,
               const std::string& what);

// What a plan is built for. `key` and `linear_rows` are read when the plan runs: the current
// step's dropout streams, and where linear layers' rows go (batch_linear: instead of their
// weight gradients).
struct PlanRequest {
  const Model* model;
  const dnnl::engine* engine;
  const StreamKey* key;
  const std::span<const LinearRows>* linear_rows;
  std::int64_t N;
  bool training, blocked, batch_linear;
  Precision precision;
  WeightCopies* weight_copies;  // the executor's, which outlive the plan
  dnnl::stream* stream;         // the executor's: the prepare steps' reorders run on it
};

// Builds the plan; oneDNN errors are rethrown as InternalError naming the model, N and layer.
std::unique_ptr<Plan> build_plan(const PlanRequest& request);

}  // namespace cohort::nn::detail
