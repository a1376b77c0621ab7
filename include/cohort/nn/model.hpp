// Model: a network parsed from a spec string — a list of layers, or a kind of its own (the
// language model, nn/gpt/gpt.hpp; kinds a caller registers) — with the layout of its parameters in
// one flat array and PyTorch-compatible initialisation, behind one interface (ModelKind).
// Not an executor: no oneDNN, no activations, no threads (see nn/net.hpp for that).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cohort/nn/executor.hpp"
#include "cohort/nn/state_dict.hpp"
#include "cohort/tensor/param_layout.hpp"

namespace cohort::nn {

class Executor;
class Model;

// The shape of one sample's activation: (C, H, W); a flat vector is (F, 1, 1).
struct SampleShape {
  std::int64_t C = 1, H = 1, W = 1;
  std::int64_t numel() const { return C * H * W; }
  bool flat() const { return H == 1 && W == 1; }
  std::string str() const;  // "(32, 24, 24)" or "(1024)"
  bool operator==(const SampleShape&) const = default;
};

struct LayerSpec {
  enum class Kind {
    kLinear,
    kReLU,
    kConv,
    kMaxPool,
    kAvgPool,
    kFlatten,
    kDropout,
    kBatchNorm,  // `bn`: per channel of an image, per feature of a flat input
    kGap,        // `gap`: global average pooling, (C, H, W) -> (C)
    kResidual,   // `res(OC[,stride])`: a basic residual block (body + shortcut, then ReLU)
  };
  Kind kind;
  // "conv1", "relu2", "fc1", "bn1", "gap1", "res1", ...: the kind and its count among the
  // model's top-level layers. Inside a residual block: "<res>.conv1", "<res>.bn1",
  // "<res>.relu1", "<res>.conv2", "<res>.bn2" (the body), "<res>.short.conv",
  // "<res>.short.bn" (the shortcut), e.g. "res4.short.bn" (PyTorch's blocks.3.short.1).
  std::string name;
  SampleShape in, out;                           // per-sample shapes before and after the layer
  std::int64_t kernel = 0, stride = 1, pad = 0;  // conv and pooling (square)
  float p = 0;                                   // dropout probability
  bool has_bias = true;  // conv(..., nobias): no bias tensor (PyTorch's bias=False)
  // Offsets into the flat parameter array: linear and conv weight and bias; bn scale (gamma) in
  // `weight` and shift (beta) in `bias`.
  std::size_t weight = 0;
  std::size_t bias = 0;
  // bn: offsets into the running-statistics array (Model::stats_layout()) of the running mean
  // and the running (unbiased) variance, C floats each.
  std::size_t running_mean = 0, running_var = 0;
  // res: the body conv3x3(stride)-bn-relu-conv3x3-bn, and the shortcut: empty for the identity,
  // else conv1x1(stride, nobias)-bn (when the stride or the channel count changes). Their
  // parameters sit in the flat array in PyTorch's order: body, then shortcut.
  std::vector<LayerSpec> body, shortcut;
  bool has_params() const {
    return kind == Kind::kLinear || kind == Kind::kConv || kind == Kind::kBatchNorm ||
           kind == Kind::kResidual;
  }
};

// What a model kind tells the engine about one leaf's default size (train/defaults.hpp): its
// largest leaf in samples, and whether the leaf is exactly that (a statistic over the leaf's rows
// is part of the model) or the batch cut into as few leaves of at most `cap` as even as whole rows
// allow, and into at least `min_leaves` where the batch has that many samples (a step of one leaf
// runs on one core, whatever the machine).
struct LeafRule {
  std::size_t cap = 1;
  bool exact = false;
  std::size_t min_leaves = 1;
};

// A model kind: its description (spec, parameter layout, input, classes), its parameters' values
// (initialisation, canonical order, the names of its PyTorch state_dict) and what the engine
// runs for it (an Executor a replica, its default leaf, its floor). The trainer, validation, the
// roofline and export call a model through this interface alone and never ask which kind it is.
// Kinds: the layer lists (model.cpp), the language model (gpt_kind.cpp), and whatever
// register_model_kind adds. Immutable once built; shared by the copies of a Model.
class ModelKind {
 public:
  virtual ~ModelKind() = default;
  ModelKind(const ModelKind&) = delete;
  ModelKind& operator=(const ModelKind&) = delete;

  const std::string& spec() const { return spec_; }
  const ParamLayout& layout() const { return layout_; }
  SampleShape input() const { return input_; }
  std::int64_t num_classes() const { return num_classes_; }

  // A short name: "layers", "gpt". Export's ONNX graphs are found by it.
  virtual std::string_view name() const = 0;
  // The layer list (nn::LayerSpec), empty for a kind that is not one.
  virtual const std::vector<LayerSpec>& layers() const;
  // Running statistics (Model::stats_layout), empty for a kind without any.
  virtual const ParamLayout& stats_layout() const;
  virtual bool has_dropout() const = 0;

  // A language model's samples are windows of window() + 1 token ids (the input is its first
  // window() tokens, the targets its last window()), its classes the vocabulary, its data text;
  // 0: a sample is a row of features with a class label.
  virtual std::int64_t window() const { return 0; }
  // Whether a bf16 run assembles the rows in bf16 (false: the rows stay f32, e.g. token ids).
  virtual bool bf16_rows() const { return true; }

  // Model::init, norm_and_bias_ranges, forward_flops_per_sample, to_canonical and
  // from_canonical.
  virtual void init(float* params, std::uint64_t seed) const = 0;
  virtual std::vector<std::pair<std::size_t, std::size_t>> norm_and_bias_ranges() const = 0;
  virtual double forward_flops_per_sample() const = 0;
  virtual void to_canonical(const float* stored, float* canonical) const;    // a copy
  virtual void from_canonical(const float* canonical, float* stored) const;  // a copy
  // Every tensor of the model's PyTorch state_dict, in its order (nn/state_dict.hpp).
  virtual std::vector<StateTensor> state_dict() const = 0;

  // One replica's executor (nn/executor.hpp) for `model`, whose kind this is; `model` outlives
  // it.
  virtual std::unique_ptr<Executor> executor(const Model& model, bool blocked_layouts,
                                             Precision precision) const = 0;
  // The default leaf in `precision` (never from the machine: the leaves decide the weights).
  virtual LeafRule leaf_rule(Precision precision) const = 0;
  // Whether the root may compute the linear layers' weight gradients over the whole batch
  // (nn/batch_grad.hpp) from rows the leaves keep; false: every leaf computes its own.
  virtual bool batch_weight_grads() const { return false; }
  // Bytes a replica's plan for a leaf of `rows` samples takes in `precision`, where they can
  // grow past memory (validation refuses a leaf whose plans, one a worker, cannot fit in half of
  // it); 0: no such bound.
  virtual double leaf_plan_bytes(std::size_t rows, Precision precision) const;
  // The most samples one evaluation call takes, where evaluation's memory grows with them.
  virtual std::size_t max_eval_rows() const { return SIZE_MAX; }
  // Seconds oneDNN would take, on this thread, for the products a leaf of `rows` samples
  // computes on cohort's own kernels instead (the roofline counts them at oneDNN's rate).
  virtual double own_kernel_floor_seconds(std::int64_t rows, Precision precision) const;

 protected:
  ModelKind(std::string spec, ParamLayout layout, SampleShape input, std::int64_t classes);

 private:
  std::string spec_;
  ParamLayout layout_;
  SampleShape input_;
  std::int64_t num_classes_ = 0;
};

// How a kind's specs are recognised and parsed. `prefix` starts its specs ("gpt:"); `parse`
// builds its kind for samples of shape `input` and a vocabulary of `vocab` tokens (throwing
// InputError naming --model); `window` gives ModelKind::window from the spec alone (the CLI reads
// a language model's data for it before the model is built), 0 for row models.
struct ModelKindEntry {
  std::string prefix;
  std::function<std::shared_ptr<const ModelKind>(const std::string& spec, SampleShape input,
                                                 std::int64_t vocab)>
      parse;
  std::function<std::int64_t(const std::string& spec)> window;
};
// Adds a kind (or replaces the one of the same prefix); specs no kind's prefix starts are layer
// lists. Not thread-safe: before any Model::parse on another thread.
void register_model_kind(ModelKindEntry entry);
// ModelKind::window of `spec`'s kind, from the spec alone (0 for a layer list).
std::int64_t spec_window(const std::string& spec);

// A model: a handle on its kind (shared, immutable), cheap to copy.
class Model {
 public:
  // Bounds on what a spec may ask for, checked while parsing (before anything is sized from it):
  // values per sample out of any layer (64 Mi floats) and parameters in all (1 Gi floats).
  static constexpr std::int64_t kMaxActivation = std::int64_t{1} << 26;
  static constexpr std::int64_t kMaxParameters = std::int64_t{1} << 30;

  // Parses a spec for samples of shape `input`; throws InputError naming `--model`, what was
  // expected and what was found. Forms:
  //   "mlp:784-512-256-10"   Linear(784,512)-ReLU-Linear(512,256)-ReLU-Linear(256,10); its first
  //                          size is the input (checked against the data by the trainer)
  //   "cnn"                  the PyTorch peer's CNN (below), 317,066 parameters on 1x28x28
  //   "resnet20"             the PyTorch peer's ResNet-20 (below), 272,186 parameters
  //   a layer list joined by '-':  conv(OC,K[,stride[,pad[,nobias]]])  relu  maxpool(K[,stride])
  //                          avgpool(K[,stride])  flatten  dropout(P)  linear(OC)  bn  gap
  //                          res(OC[,stride])
  //   e.g.
  //   conv(32,5)-relu-maxpool(2)-conv(64,5)-relu-maxpool(2)-flatten-linear(256)-relu-linear(10)
  //   "gpt:LAYERS-HEADS-EMBD-BLOCK[-DROPOUT]"   a language model (nn/gpt/gpt.hpp) over `vocab`
  //                          tokens: its samples are windows of BLOCK + 1 tokens, its input
  //                          (1, 1, BLOCK + 1) and its classes the vocabulary; no layer list
  //   a registered kind's spec (register_model_kind)
  static Model parse(const std::string& spec, SampleShape input = {1, 28, 28},
                     std::int64_t vocab = 0);
  explicit Model(std::shared_ptr<const ModelKind> kind);

  const ModelKind& kind() const { return *kind_; }
  const std::string& spec() const { return kind_->spec(); }
  const std::vector<LayerSpec>& layers() const { return kind_->layers(); }
  const ParamLayout& layout() const { return kind_->layout(); }
  SampleShape input() const { return kind_->input(); }
  std::int64_t input_features() const { return input().numel(); }
  std::int64_t num_classes() const { return kind_->num_classes(); }
  bool has_dropout() const { return kind_->has_dropout(); }
  bool has_batchnorm() const;

  // Running statistics of the bn layers (not parameters: no gradient, no optimizer): for each,
  // "<name>.running_mean" and "<name>.running_var" (C floats each), in model order. Evaluation
  // normalizes with them; training updates them from the leaves' batch statistics.
  const ParamLayout& stats_layout() const { return kind_->stats_layout(); }
  // PyTorch's initial running statistics: mean 0, variance 1 (padding zeroed).
  void init_stats(float* stats) const;
  // Every bn layer, also those inside residual blocks, in model (= parameter) order; the
  // pointers point into this Model's kind (valid while a copy of the Model lives).
  std::vector<const LayerSpec*> batchnorm_layers() const;
  // [begin, end) ranges of the flat parameter array holding bn scales and shifts and every bias
  // (a language model's: its LayerNorm weights): what --no-decay-norm-bias exempts from weight
  // decay. One range per tensor (padding excluded), sorted, disjoint.
  std::vector<std::pair<std::size_t, std::size_t>> norm_and_bias_ranges() const {
    return kind_->norm_and_bias_ranges();
  }
  // Floating-point operations of one forward pass per sample (2 per multiply-add).
  double forward_flops_per_sample() const { return kind_->forward_flops_per_sample(); }

  // A layer list's: PyTorch's nn.Linear / nn.Conv2d default: weight and bias ~
  // U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with fan_in = IC * KH * KW, each tensor from a stream
  // keyed by (seed, tensor index), the index of the tensor in layout() (bn tensors take an index
  // too, a nobias conv's missing bias none); bn scale 1 and shift 0. (A language model: GPT-2's,
  // nn/gpt/gpt.hpp.) params: layout().total() floats; padding is zeroed. The values are PyTorch's
  // draw order, whatever the storage order.
  void init(float* params, std::uint64_t seed) const { kind_->init(params, seed); }

  // The flat array in canonical order — PyTorch's: linear weights (OC, IC) — and back. A layer
  // list stores linear weights (IC, OC) (faster forward GEMM); checkpoints and anything meant
  // to outlive this build use the canonical order. Both arrays hold layout().total() floats.
  void to_canonical(const float* stored, float* canonical) const {
    kind_->to_canonical(stored, canonical);
  }
  void from_canonical(const float* canonical, float* stored) const {
    kind_->from_canonical(canonical, stored);
  }
  // ModelKind::state_dict.
  std::vector<StateTensor> state_dict() const { return kind_->state_dict(); }

 private:
  std::shared_ptr<const ModelKind> kind_;
};

// The preset `cnn`: the network of bench/peers/torch_peer.py.
inline constexpr const char* kCnnPreset =
    "conv(32,5)-relu-maxpool(2)-conv(64,5)-relu-maxpool(2)-flatten-linear(256)-relu-linear(10)";
// The preset `resnet20`: the peer's ResNet-20 (He et al. 2016, CIFAR variant, projection
// shortcuts) for 1x28x28: 272,186 parameters.
inline constexpr const char* kResnet20Preset =
    "conv(16,3,1,1,nobias)-bn-relu-res(16)-res(16)-res(16)-res(32,2)-res(32)-res(32)-"
    "res(64,2)-res(64)-res(64)-gap-linear(10)";

}  // namespace cohort::nn
