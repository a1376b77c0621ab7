// A decoder-only transformer: nanoGPT's GPT (token and learned position embeddings, pre-LayerNorm
// blocks of causal multi-head self-attention and a GELU MLP, a final LayerNorm, an output head
// tied to the token embedding), with bias=False and the exact GELU by default, and GPT-2's
// architecture as options (biases, the tanh GELU, a padded vocabulary).
// GptModel is its description — spec, parameter layout under nanoGPT's state_dict names, GPT-2's
// initialisation; GptNet its executor on oneDNN, one per replica, as nn::Net is for the layer
// lists of model.hpp.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cohort/nn/dropout.hpp"
#include "cohort/nn/net.hpp"
#include "cohort/tensor/bf16.hpp"
#include "cohort/tensor/param_layout.hpp"

namespace cohort::nn {

struct GptShape {
  std::int64_t layers = 4, heads = 4, embd = 128, block = 64;
  std::int64_t vocab = 65;
  float dropout = 0;       // on the embeddings, the attention weights and each block's two branches
  bool bias = false;       // biases on every linear layer but the head and on every LayerNorm
  bool tanh_gelu = false;  // GELU's tanh approximation (GPT-2's "gelu_new"), not the erf form
  // The token embedding's rows, and so the head's outputs, padded to a multiple of this (llm.c's
  // 50,257 to 50,304 with 128). The padded rows are 0 and stay 0: their logits are left out of
  // the loss, the accuracy and sampling, so their gradients are 0.
  std::int64_t vocab_multiple = 1;
  std::int64_t head_size() const { return embd / heads; }
  std::int64_t padded_vocab() const {
    return (vocab + vocab_multiple - 1) / vocab_multiple * vocab_multiple;
  }
  bool operator==(const GptShape&) const = default;
};

class GptModel {
 public:
  // LayerNorm's epsilon (PyTorch's default, as nanoGPT).
  static constexpr float kLayerNormEpsilon = 1e-5f;

  // "gpt:LAYERS-HEADS-EMBD-BLOCK[-DROPOUT][,OPTION...]" (nanoGPT's CPU recipe: gpt:4-4-128-64;
  // its full one gpt:6-6-384-256-0.2) for a vocabulary of `vocab` tokens. OPTIONs: "bias"
  // (GptShape::bias), "gelu=tanh" or "gelu=erf", "pad=MULTIPLE" (GptShape::vocab_multiple, 1 to
  // 4096); a later one replaces an earlier one. GPT-2's sizes are presets in place of the four
  // sizes: "gpt:124M" is gpt:12-12-768-1024,bias,gelu=tanh,pad=128 and "gpt:350M"
  // gpt:24-16-1024-1024,bias,gelu=tanh,pad=128 (either may go on with -DROPOUT and options).
  // Throws InputError naming --model, what was expected and what was found: HEADS must divide
  // EMBD, every size positive, DROPOUT in [0, 1), parameters at most Model::kMaxParameters.
  static GptModel parse(const std::string& spec, std::int64_t vocab);
  static bool is_gpt(const std::string& spec);  // starts with "gpt:"

  const std::string& spec() const { return spec_; }
  const GptShape& shape() const { return shape_; }
  // nanoGPT's parameters in its order, under its names (transformer.wte.weight,
  // transformer.wpe.weight, transformer.h.I.ln_1.weight, .attn.c_attn.weight,
  // .attn.c_proj.weight, .ln_2.weight, .mlp.c_fc.weight, .mlp.c_proj.weight,
  // transformer.ln_f.weight; with biases each module's .bias after its .weight), in PyTorch's
  // layout ((out, in) for a linear weight). The head's weight is the token embedding's
  // (lm_head.weight is tied: not stored twice); wte has padded_vocab() rows.
  const ParamLayout& layout() const { return layout_; }
  // Offsets of one block's tensors in the flat array; a bias's is kNoBias without biases.
  static constexpr std::size_t kNoBias = ~std::size_t{0};
  struct BlockOffsets {
    std::size_t ln_1, c_attn, attn_proj, ln_2, c_fc, mlp_proj;
    std::size_t ln_1_bias = kNoBias, c_attn_bias = kNoBias, attn_proj_bias = kNoBias,
                ln_2_bias = kNoBias, c_fc_bias = kNoBias, mlp_proj_bias = kNoBias;
  };
  const BlockOffsets& block(std::int64_t i) const { return blocks_[static_cast<std::size_t>(i)]; }
  std::size_t wte() const { return wte_; }
  std::size_t wpe() const { return wpe_; }
  std::size_t ln_f() const { return ln_f_; }
  std::size_t ln_f_bias() const { return ln_f_bias_; }

  // GPT-2's initialisation, as nanoGPT: every matrix and embedding N(0, 0.02), the residual
  // projections (c_proj) N(0, 0.02 / sqrt(2 * layers)), LayerNorm weights 1, biases 0; each
  // tensor from a stream keyed by (seed, its index in layout()). Padding (the layout's and the
  // vocabulary's rows past vocab) is zeroed.
  void init(float* params, std::uint64_t seed) const;
  // [begin, end) of the LayerNorm weights and the biases, one per tensor, sorted: what
  // --no-decay-norm-bias exempts from weight decay (nanoGPT decays the 2-D tensors only).
  std::vector<std::pair<std::size_t, std::size_t>> norm_ranges() const;
  // Floating-point operations of one training token's forward pass (2 per multiply-add: the
  // matmuls, attention over a full window counted at its causal half, and the head over the
  // padded vocabulary, as it runs).
  double forward_flops_per_token() const;

 private:
  std::string spec_;
  GptShape shape_;
  ParamLayout layout_;
  std::vector<BlockOffsets> blocks_;
  std::size_t wte_ = 0, wpe_ = 0, ln_f_ = 0, ln_f_bias_ = kNoBias;
};

// The GptModel of a language model's Model (Model::parse of a "gpt:" spec: its kind,
// gpt_kind.cpp); InternalError for another kind. For the language model's own code (its ONNX
// graph, its tests): the engine calls a model through nn::ModelKind alone.
const GptModel& gpt_model(const Model& model);

// Where a GptNet's plans compute the same thing two ways, which they take. kAuto chooses by what
// oneDNN dispatches on this CPU (the trainer's choice); the others force one way, so that tests
// run each on any CPU.
struct GptPaths {
  // Attention as cohort's kernel on qkv (bf16 plans where nn/gpt/gpt_attention.hpp's
  // attention_kernel_engine has an engine: AMX's, else AVX-512's); else on oneDNN's matmuls, on
  // dense copies of q, k and v over whole windows (where oneDNN's matmul runs AMX's kernel) or on
  // strided views of qkv by row blocks (elsewhere). kKernelAvx512Bf16 runs the kernel on
  // AVX-512's engine where AMX's is there too. kKernel and kKernelAvx512Bf16 where the kernel
  // cannot run, and in f32 plans, take kAuto's other choice.
  enum class Attention {
    kAuto,
    kDense,
    kRowBlocks,
    kKernel,
    kKernelAvx512Bf16
  } attention = Attention::kAuto;
  // A bf16 linear layer's backward as matmuls on plain operands, W = dY^T X (where it runs a
  // brgemm kernel, AMX's or AVX-512's) and dX = dY W (where it runs AMX's), or as oneDNN's inner
  // product's backward-weights and backward-data (elsewhere). f32 plans choose among their own
  // (plan_gpt.cpp).
  enum class Bf16LinearBackward {
    kAuto,
    kMatmul,
    kInnerProduct
  } bf16_linear_backward = Bf16LinearBackward::kAuto;
  // The head's rows a chunk (its logits are never whole: GptPlanBuilder::head_rows); 0 takes
  // the plans' own choice, which keeps a chunk's f32 logits within 16 MB.
  std::int64_t head_rows = 0;
};

// The executor of one GptModel on one thread at a time (the contract of nn::Net: not
// thread-safe, may move between threads, OpenMP at one thread in the caller).
class GptNet {
 public:
  explicit GptNet(const GptModel& model, Precision precision = Precision::kF32,
                  GptPaths paths = {});
  ~GptNet();
  GptNet(GptNet&&) noexcept;
  GptNet& operator=(GptNet&&) noexcept;
  Precision precision() const;

  // Forward and backward on N windows of block + 1 tokens each (windows: N x (block + 1) token
  // ids in [0, vocab), row-major): the inputs are a window's first block tokens, the targets its
  // last block. Overwrites grad (layout().total() floats; padding untouched) with the gradient
  // of the cross-entropy *summed* over the N x block positions, times `scale`, and returns that
  // sum times `scale` (its kind's executor passes 1 / block: a window's mean over its positions,
  // which the trainer's 1 / batch makes the mean over the batch's positions, as nanoGPT's loss).
  // `key` names dropout's streams. A bf16 net takes the bf16 copy of the parameters (same offsets).
  double forward_backward(const float* params, const std::int32_t* windows, std::int64_t N,
                          float* grad, const StreamKey& key = {}, double scale = 1);
  double forward_backward(const bf16* params, const std::int32_t* windows, std::int64_t N,
                          float* grad, const StreamKey& key = {}, double scale = 1);
  // N windows in inference mode (no dropout): the cross-entropy summed over their positions,
  // and the positions whose largest logit is the target (ties: the lowest token).
  struct Evaluation {
    double loss = 0;
    std::int64_t correct = 0;
  };
  Evaluation evaluate(const float* params, const std::int32_t* windows, std::int64_t N);
  Evaluation evaluate(const bf16* params, const std::int32_t* windows, std::int64_t N);

  // The parameters' values may have changed since the last call: each plan reorders the weights
  // into its primitives' layouts on its next run, then reuses that copy on the runs after it
  // until the next call (or another parameter array). Until the first call, every run reorders
  // them. The trainer calls it before each step's leaves and each evaluation, between which the
  // weights do not change.
  void weights_changed();

  // What its plans (training and inference) hold; the weights' copies in oneDNN's layouts only
  // where this net made them (not where it shares another's).
  PlanMemory memory() const;
  // Its plans read and write `owner`'s copies of the weights in oneDNN's layouts instead of
  // their own: one set for nets that run on the same weights at the same time (the trainer's
  // replicas; each copy is written once a weights_changed() and parameter array, under a lock).
  // Nets sharing them must not run on different weights at the same time. Before any plan is
  // built; the same model and precision.
  void share_weight_copies(GptNet& owner);
  // Net::keep_weight_copies and Net::weights_written.
  void keep_weight_copies(const bf16* params);
  void weights_written(std::size_t begin, std::size_t end);
  const PhaseTimes& times() const;
  // When the last forward_backward's backward pass began (after its loss).
  std::chrono::steady_clock::time_point backward_begin() const;
  void reset_times();
  // Frees the plans evaluate built (Net::release_inference_plans).
  void release_inference_plans();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Generation with a key/value cache, on f32 weights: each token pushed runs one position through
// every layer (oneDNN inner products for the linear layers; LayerNorm, GELU and the attention
// over the cached keys and values of the positions before it in plain loops, a few hundred
// values each). Learned positions end at the block: when a window is full, the cache restarts
// from its last block / 2 tokens (recomputed), so N tokens cost at most 2N one-position passes,
// O(N) where recomputing the last block tokens for every new one would be O(N x block).
// Not thread-safe; the weights must outlive it.
class GptGenerator {
 public:
  GptGenerator(const GptModel& model, const float* params);
  ~GptGenerator();
  GptGenerator(GptGenerator&&) noexcept;
  // Appends `token` (in [0, vocab)) to the context; returns the logits of the token after it
  // (vocab floats, the padded vocabulary's past them not among them; valid until the next call).
  const float* push(std::int32_t token);
  // Positions run through the layers so far (pushes and the recomputed ones).
  std::uint64_t positions_run() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cohort::nn
