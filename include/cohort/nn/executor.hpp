// Executor: what one replica runs for one model kind (nn/model.hpp's ModelKind), behind the one
// interface the trainer, evaluation and the roofline call: a leaf's forward and backward, an
// evaluation, the logits. nn::Net is its typed front; each kind makes its own (the layer lists'
// on oneDNN's primitives, net.cpp; the language model's, gpt_kind.cpp).
//
// Thread-safety: not thread-safe; one thread at a time may call it, but it may move between
// threads. The calling thread runs OpenMP with one thread (nn/net.hpp).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>

#include "cohort/core/names.hpp"
#include "cohort/nn/dropout.hpp"
#include "cohort/tensor/bf16.hpp"

namespace cohort::nn {

// The arithmetic of a Net's primitives. kBf16: activations, weights and the input in bf16
// (AVX512_BF16 dot products accumulating in f32); forward and backward-data in bf16; weight and
// bias gradients, logits and the loss in f32.
enum class Precision { kF32, kBf16 };
inline constexpr Named<Precision> kPrecisionNames[] = {{Precision::kF32, "f32"},
                                                       {Precision::kBf16, "bf16"}};

// Seconds spent, accumulated over calls, by kind of work.
struct PhaseTimes {
  double matmul = 0;     // inner products and convolutions: forward, backward-data, -weights
  double attention = 0;  // attention as cohort's kernel (nn/gpt/gpt_attention.hpp): its six
                         // products and the softmax between them, one pass
  double eltwise = 0;    // ReLU (and residual adds), GELU, attention's softmax where oneDNN's
                         // matmuls compute its products
  double loss = 0;       // softmax cross-entropy
  double other = 0;      // bn, LayerNorm, pooling, dropout, reorders, cohort's own loops
  double total() const { return matmul + attention + eltwise + loss + other; }
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

// Loss and correct predictions summed over the samples of one evaluation call.
struct Evaluation {
  double loss = 0;
  double correct = 0;
};

// The bytes an executor's plans hold (their buffers and scratchpads): all of it, and of that the
// logits and their gradient (a language model's (rows, padded vocabulary) arrays) and the copies
// of the weights in the primitives' layouts that its plans share (a language model's, a layer
// list's bf16 inner products'; a layer list's convolutions' are its plans' own, counted in the
// total only).
struct PlanMemory {
  std::size_t total = 0, logits = 0, weight_copies = 0;
};

class Executor {
 public:
  virtual ~Executor() = default;

  // One leaf of N samples. params: the flat parameter array in the executor's precision (float
  // or bf16, same offsets); x: the rows, (N, input features), floats, or bf16 in a bf16 run of a
  // kind whose rows are bf16 (ModelKind::bf16_rows); labels: N classes (a kind whose targets are
  // in its rows does not read them). Overwrites grad (padding untouched) with the gradient of
  // the loss summed over the N samples and returns that sum. `key` names the leaf's random
  // streams. linear_rows and batch_stats as nn::Net::forward_backward (a kind without linear
  // layers or bn layers receives none).
  virtual double forward_backward(const void* params, const void* x, const std::int32_t* labels,
                                  std::int64_t N, float* grad, const StreamKey& key,
                                  std::span<const LinearRows> linear_rows, float* batch_stats) = 0;
  // N samples in inference mode: the loss and the correct predictions, each summed over them
  // (a language model's per sample: its window's means over its positions).
  virtual Evaluation evaluate(const void* params, const void* x, const std::int32_t* labels,
                              std::int64_t N, const float* running_stats) = 0;
  // N samples' logits, (N, classes), valid until the next call; a kind without one row of
  // logits a sample throws InputError.
  virtual const float* logits(const void* params, const void* x, std::int64_t N,
                              const float* running_stats) = 0;

  // The parameters may have changed since the last call (nn/net.hpp).
  virtual void weights_changed() {}
  // Frees what evaluation built (nn/net.hpp).
  virtual void release_inference_plans() {}

  // What its plans hold now (a kind that does not count says 0).
  virtual PlanMemory memory() const { return {}; }
  // Share `owner`'s copies of the weights in the primitives' layouts (an executor of the same
  // model and precision, made the same way; before either has run): for executors that run on
  // the same weights at the same time, as the trainer's replicas do. A kind without such
  // copies ignores it.
  virtual void share_weight_copies(Executor& owner) { (void)owner; }
  // The caller reports every later write to the bf16 parameter array `params` through
  // weights_written (nn/net.hpp: keep_weight_copies). A kind without such copies ignores both.
  virtual void keep_weight_copies(const bf16* params) { (void)params; }
  virtual void weights_written(std::size_t begin, std::size_t end) {
    (void)begin;
    (void)end;
  }

  virtual const PhaseTimes& times() const = 0;
  // When the last forward_backward finished the loss and began backward.
  virtual std::chrono::steady_clock::time_point backward_begin() const = 0;
  virtual void reset_times() = 0;
};

}  // namespace cohort::nn
