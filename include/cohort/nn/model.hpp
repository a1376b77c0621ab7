// Model: a network described as a list of layers, parsed from a spec string, with the layout of
// its parameters in one flat array and PyTorch-compatible initialisation.
// Not an executor: no oneDNN, no activations, no threads (see nn/net.hpp for that).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cohort/tensor/param_layout.hpp"

namespace cohort::nn {

class GptModel;

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
  //   "gpt:LAYERS-HEADS-EMBD-BLOCK[-DROPOUT]"   a language model (nn/gpt.hpp) over `vocab`
  //                          tokens: its samples are windows of BLOCK + 1 tokens, its input
  //                          (1, 1, BLOCK + 1) and its classes the vocabulary; no layer list
  static Model parse(const std::string& spec, SampleShape input = {1, 28, 28},
                     std::int64_t vocab = 0);
  // The language model of a gpt: spec (its layout is this model's), or null.
  const GptModel* gpt() const { return gpt_.get(); }

  const std::string& spec() const { return spec_; }
  const std::vector<LayerSpec>& layers() const { return layers_; }
  const ParamLayout& layout() const { return layout_; }
  SampleShape input() const { return input_; }
  std::int64_t input_features() const { return input_.numel(); }
  std::int64_t num_classes() const { return num_classes_; }
  bool has_dropout() const;
  bool has_batchnorm() const;
  bool has_conv() const;  // a conv layer, at the top level or inside a residual block

  // Running statistics of the bn layers (not parameters: no gradient, no optimizer): for each,
  // "<name>.running_mean" and "<name>.running_var" (C floats each), in model order. Evaluation
  // normalizes with them; training updates them from the leaves' batch statistics.
  const ParamLayout& stats_layout() const { return stats_layout_; }
  // PyTorch's initial running statistics: mean 0, variance 1 (padding zeroed).
  void init_stats(float* stats) const;
  // Every bn layer, also those inside residual blocks, in model (= parameter) order; the
  // pointers point into this Model (valid while it lives, not into a copy).
  std::vector<const LayerSpec*> batchnorm_layers() const;
  // [begin, end) ranges of the flat parameter array holding bn scales and shifts and every bias:
  // what --no-decay-norm-bias exempts from weight decay. One range per tensor (padding
  // excluded), sorted, disjoint.
  std::vector<std::pair<std::size_t, std::size_t>> norm_and_bias_ranges() const;
  // Floating-point operations of one forward pass per sample (2 per multiply-add).
  double forward_flops_per_sample() const;

  // PyTorch's nn.Linear / nn.Conv2d default: weight and bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in))
  // with fan_in = IC * KH * KW, each tensor from a stream keyed by (seed, tensor index), the
  // index of the tensor in layout() (bn tensors take an index too, a nobias conv's missing bias
  // none); bn scale 1 and shift 0.
  // params: layout().total() floats; padding is zeroed. The values are PyTorch's draw order,
  // whatever the storage order.
  void init(float* params, std::uint64_t seed) const;

  // The flat array in canonical order — PyTorch's: linear weights (OC, IC) — and back. The
  // layout stores linear weights (IC, OC) (faster forward GEMM); checkpoints and anything meant
  // to outlive this build use the canonical order. Both arrays hold layout().total() floats.
  void to_canonical(const float* stored, float* canonical) const;
  void from_canonical(const float* canonical, float* stored) const;

 private:
  // Where element j of a linear weight in (OC, IC) order is stored, relative to l.weight.
  static std::size_t transposed_index(const LayerSpec& l, std::size_t j);

  std::string spec_;
  std::vector<LayerSpec> layers_;
  ParamLayout layout_;
  ParamLayout stats_layout_;
  SampleShape input_;
  std::int64_t num_classes_ = 0;
  std::shared_ptr<const GptModel> gpt_;
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
