// Net: the executor of one Model on one thread at a time, on oneDNN primitives. One per replica.
// It owns what differs per worker: the oneDNN engine and stream, primitives for each batch size
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
#include <cstdint>
#include <memory>
#include <span>
#include <utility>

#include "cohort/core/names.hpp"
#include "cohort/nn/dropout.hpp"
#include "cohort/nn/model.hpp"
#include "cohort/tensor/bf16.hpp"

namespace cohort::nn {

// Seconds spent, accumulated over calls, by kind of work.
struct PhaseTimes {
  double matmul = 0;   // inner products and convolutions: forward, backward-data, -weights
  double eltwise = 0;  // ReLU (and residual adds), GELU, attention's softmax; attention as
                       // cohort's kernel (nn/gpt_attention.hpp), its products included
  double loss = 0;     // softmax cross-entropy
  double other = 0;    // bn, LayerNorm, pooling, dropout, reorders, cohort's own loops
  double total() const { return matmul + eltwise + loss + other; }
};

// Batch weight gradients (nn/batch_grad.hpp): where one leaf's rows of a linear layer go, instead
// of the layer's weight and bias gradients. x: (N, IC), the layer's input rows; null when the
// caller already holds them (the Net's own input of a first linear layer). dy: (N, OC), the
// gradient of the summed loss with respect to the layer's output.
// Elements are floats, or bf16 for a bf16 Net. dy_pairs (bf16 only): dy is written in row pairs
// (nn/batch_grad.hpp), for cohort's own weight-gradient kernel; the leaf's first row must then be
// even.
struct LinearRows {
  void* x = nullptr;
  void* dy = nullptr;
  bool dy_pairs = false;
};

// The arithmetic of a Net's primitives. kBf16: activations, weights and the input in bf16
// (AVX512_BF16 dot products accumulating in f32); forward and backward-data in bf16; weight and
// bias gradients, logits and the loss in f32.
enum class Precision { kF32, kBf16 };
inline constexpr Named<Precision> kPrecisionNames[] = {{Precision::kF32, "f32"},
                                                       {Precision::kBf16, "bf16"}};

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

  // A language model (Model::gpt, nn/gpt.hpp): N windows x of block + 1 token ids as floats,
  // (N, block + 1), in f32 for both precisions (ids past 256 do not survive bf16); labels are
  // not read (a window's targets are its own tokens). forward_backward's loss and gradient are
  // each window's mean cross-entropy over its positions, summed over the windows (the f32 entry
  // above takes f32 parameters; this one a bf16 Net's). evaluate_windows: the same loss in
  // inference mode, and each window's fraction of positions whose largest logit is the target,
  // summed over the windows.
  double forward_backward(const bf16* params, const float* x, std::int64_t N, float* grad,
                          const StreamKey& key = {});
  std::pair<double, double> evaluate_windows(const float* params, const float* x, std::int64_t N);
  std::pair<double, double> evaluate_windows(const bf16* params, const float* x, std::int64_t N);

  // A language model: GptNet::weights_changed (its plans reorder the weights once after each
  // call, where other nets reorder them on every run). Other nets: nothing.
  void weights_changed();

  const PhaseTimes& times() const;
  // When the last forward_backward finished the loss and began backward (for traces).
  std::chrono::steady_clock::time_point backward_begin() const;
  void reset_times();
  // Frees what evaluation built (a language model's inference plans: their activations and
  // blocked weights, tens of megabytes), so that it does not stay beside the training plans; the
  // next evaluation builds it again. Other nets keep theirs (a few megabytes at most).
  void release_inference_plans();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cohort::nn
