// Private to src/nn: a Plan — what oneDNN needs to run one Net at one batch size — and the
// function that builds one (plan_builder.cpp). net.cpp binds the caller's arrays and runs it.
// Not a public header: it includes oneDNN, which only src/nn may.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "cohort/nn/dropout.hpp"
#include "cohort/nn/executor.hpp"
#include "cohort/nn/model.hpp"
#include "cohort/nn/net.hpp"
#include "cohort/tensor/buffer.hpp"

namespace cohort::nn::detail {

enum class Phase { kMatmul, kAttention, kEltwise, kOther };

// A memory object bound to a caller-owned array at a fixed element offset; rebound when the
// caller's base pointer changes.
struct External {
  dnnl::memory mem;
  std::size_t offset;  // in elements of the array (bf16 or float)
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
  // Steps that read only the parameters (a language model's weights reordered into its
  // primitives' layouts), run before forward where the parameters may have changed
  // (GptNet::weights_changed): `prepared` is the weights generation they last ran for, at
  // `prepared_params`. Net's plans keep theirs in forward.
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
};

// Builds the plan; oneDNN errors are rethrown as InternalError naming the model, N and layer.
std::unique_ptr<Plan> build_plan(const PlanRequest& request);

}  // namespace cohort::nn::detail
