// Model: a network described as a list of layers, parsed from a spec string, with the layout of
// its parameters in one flat array and PyTorch-compatible initialisation.
// Not an executor: no oneDNN, no activations, no threads (see nn/net.hpp for that).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cohort/tensor/param_layout.hpp"

namespace cohort::nn {

// The shape of one sample's activation: (C, H, W); a flat vector is (F, 1, 1).
struct SampleShape {
  std::int64_t C = 1, H = 1, W = 1;
  std::int64_t numel() const { return C * H * W; }
  bool flat() const { return H == 1 && W == 1; }
  std::string str() const;  // "(32, 24, 24)" or "(1024)"
  bool operator==(const SampleShape&) const = default;
};

struct LayerSpec {
  enum class Kind { kLinear, kReLU, kConv, kMaxPool, kAvgPool, kFlatten, kDropout };
  Kind kind;
  std::string name;                              // "conv1", "relu2", "fc1", ...
  SampleShape in, out;                           // per-sample shapes before and after the layer
  std::int64_t kernel = 0, stride = 1, pad = 0;  // conv and pooling (square)
  float p = 0;                                   // dropout probability
  std::size_t weight = 0;  // offsets into the flat parameter array (linear, conv)
  std::size_t bias = 0;
  bool has_params() const { return kind == Kind::kLinear || kind == Kind::kConv; }
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
  //   a layer list joined by '-':  conv(OC,K[,stride[,pad]])  relu  maxpool(K[,stride])
  //                          avgpool(K[,stride])  flatten  dropout(P)  linear(OC)
  //   e.g.
  //   conv(32,5)-relu-maxpool(2)-conv(64,5)-relu-maxpool(2)-flatten-linear(256)-relu-linear(10)
  static Model parse(const std::string& spec, SampleShape input = {1, 28, 28});

  const std::string& spec() const { return spec_; }
  const std::vector<LayerSpec>& layers() const { return layers_; }
  const ParamLayout& layout() const { return layout_; }
  SampleShape input() const { return input_; }
  std::int64_t input_features() const { return input_.numel(); }
  std::int64_t num_classes() const { return num_classes_; }
  bool has_dropout() const;
  // Floating-point operations of one forward pass per sample (2 per multiply-add).
  double forward_flops_per_sample() const;

  // PyTorch's nn.Linear / nn.Conv2d default: weight and bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in))
  // with fan_in = IC * KH * KW, each tensor from a stream keyed by (seed, tensor index).
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
  SampleShape input_;
  std::int64_t num_classes_ = 0;
};

// The preset `cnn`: the network of ../shared/peers/torch_peer.py.
inline constexpr const char* kCnnPreset =
    "conv(32,5)-relu-maxpool(2)-conv(64,5)-relu-maxpool(2)-flatten-linear(256)-relu-linear(10)";

}  // namespace cohort::nn
