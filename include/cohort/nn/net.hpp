// Net: the executor of one Model on one thread at a time, one per replica: the typed front of
// the Executor its kind makes (nn/executor.hpp; a layer list's on oneDNN primitives). It owns
// what differs per worker: the oneDNN engine and stream, primitives for each batch size
// (created on first use and reused), activations, gradients of activations, and a user-mode
// scratchpad. It reads parameters from a caller-owned array and writes parameter gradients to a
// caller-owned array; it never keeps either.
//
// Thread-safety: not thread-safe; one thread at a time may call it, but it may move between
// threads (user-mode scratchpad, no thread-local state). The calling thread must run OpenMP with
// one thread (omp_set_num_threads(1)) before the first call, or oneDNN will spawn a team per
// primitive; parallelism comes from replicas, not from inside a primitive.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>

#include "cohort/nn/dropout.hpp"
#include "cohort/nn/executor.hpp"
#include "cohort/nn/model.hpp"
#include "cohort/tensor/bf16.hpp"

namespace cohort::nn {

class Net {
 public:
  // blocked_layouts: let oneDNN choose (format_tag::any) the layouts of convolution and
  // pooling activations and weights; false forces plain nchw / oihw everywhere (to measure the
  // choice). The model must outlive the Net.
  explicit Net(const Model& model, bool blocked_layouts = true,
               Precision precision = Precision::kF32);
  Precision precision() const;
  ~Net();
  Net(Net&&) noexcept;
  Net& operator=(Net&&) noexcept;

  // Forward and backward on N rows: x (N, input_features) row-major (for images: (N, C, H, W)),
  // labels (N). Overwrites grad (layout().total() floats; padding untouched) with the gradient
  // of the *summed* loss over the N rows, and returns that summed loss. `key` names the random
  // streams of dropout layers (ignored by models without dropout).
  // With `linear_rows` (one entry per linear layer, in model order) the linear layers' weight and
  // bias gradients are not computed: their ranges of grad are left untouched, and each linear
  // layer's input and output-gradient rows are copied to its entry instead.
  // bn layers normalize with the statistics of these N rows (ghost batch normalization: a leaf's
  // result never depends on other leaves); a model with bn layers needs `batch_stats`
  // (model.stats_layout().total() floats), where each bn layer's batch mean goes at its
  // running_mean offset and its biased variance (divided by N) at its running_var offset.
  double forward_backward(const float* params, const float* x, const std::int32_t* labels,
                          std::int64_t N, float* grad, const StreamKey& key = {},
                          std::span<const LinearRows> linear_rows = {},
                          float* batch_stats = nullptr);

  // Forward only, in inference mode (dropout is the identity, bn layers normalize with
  // `running_stats`, required for a model with bn layers: stats_layout().total() floats);
  // returns the logits (N, num_classes), valid until the next call.
  const float* forward(const float* params, const float* x, std::int64_t N,
                       const float* running_stats = nullptr);

  // The same for a bf16 Net: params is the bf16 copy of the flat parameter array (same offsets),
  // x the input rows in bf16; grad, the loss and the logits stay f32. Calling the f32 functions
  // on a bf16 Net, or these on an f32 Net, is an InternalError.
  // Statistics (batch and running) stay f32.
  double forward_backward(const bf16* params, const bf16* x, const std::int32_t* labels,
                          std::int64_t N, float* grad, const StreamKey& key = {},
                          std::span<const LinearRows> linear_rows = {},
                          float* batch_stats = nullptr);
  const float* forward(const bf16* params, const bf16* x, std::int64_t N,
                       const float* running_stats = nullptr);

  // A bf16 Net of a kind whose rows stay floats (ModelKind::bf16_rows false: a language
  // model's windows of block + 1 token ids as floats, which bf16 would round past 256): bf16
  // parameters, f32 rows. A language model reads no labels (a window's targets are its own
  // tokens); its loss and gradient are each window's mean cross-entropy over its positions,
  // summed over the windows.
  double forward_backward(const bf16* params, const float* x, const std::int32_t* labels,
                          std::int64_t N, float* grad, const StreamKey& key = {},
                          std::span<const LinearRows> linear_rows = {},
                          float* batch_stats = nullptr);

  // N rows in inference mode (as forward): the loss and the correct predictions (largest logit
  // the label, ties to the lowest class) summed over the rows; a language model's per window:
  // its means over its positions. The three forms follow forward_backward's.
  Evaluation evaluate(const float* params, const float* x, const std::int32_t* labels,
                      std::int64_t N, const float* running_stats = nullptr);
  Evaluation evaluate(const bf16* params, const bf16* x, const std::int32_t* labels, std::int64_t N,
                      const float* running_stats = nullptr);
  Evaluation evaluate(const bf16* params, const float* x, const std::int32_t* labels,
                      std::int64_t N, const float* running_stats = nullptr);

  // The parameters' values may have changed: the plans reorder the weights into their
  // primitives' layouts once after each call (a layer list's bf16 inner products, a language
  // model's linears; a layer list's convolutions reorder theirs on every run). Until its first
  // call they reorder them on every run; after it, a caller that changes the parameters in place
  // calls it before the next run.
  void weights_changed();

  const PhaseTimes& times() const;
  // When the last forward_backward finished the loss and began backward (for traces).
  std::chrono::steady_clock::time_point backward_begin() const;
  void reset_times();
  // Frees what evaluation built (a language model's inference plans: their activations and
  // blocked weights, tens of megabytes), so that it does not stay beside the training plans; the
  // next evaluation builds it again. A layer list keeps its own (a few megabytes at most).
  void release_inference_plans();
  // What its plans hold now (nn::PlanMemory).
  PlanMemory memory() const;
  // Executor::share_weight_copies: one set of the weights' copies in oneDNN's layouts for nets
  // that run on the same weights at the same time (before either has run).
  void share_weight_copies(Net& owner);
  // The caller reports every write to the bf16 parameter array `params` from now on, while no
  // run is under way, through weights_written (the elements [begin, end) now hold new values;
  // calls on disjoint ranges may run at once). The copies in oneDNN's layouts that can take a
  // range (bf16 inner products' pair-blocked weights) are then kept current by it, written while
  // the caller's new values are in its cache, and never reordered by a run; the others still are,
  // once after each weights_changed. The trainer's root does this for its bf16 weights. Called on
  // one net of those sharing copies, it holds for all of them.
  void keep_weight_copies(const bf16* params);
  void weights_written(std::size_t begin, std::size_t end);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cohort::nn
