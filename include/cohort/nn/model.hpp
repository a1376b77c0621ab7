// Model: a network described as a list of layers, parsed from a spec string, with the layout of
// its parameters in one flat array and PyTorch-compatible initialisation.
// Not an executor: no oneDNN, no activations, no threads (see nn/net.hpp for that).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cohort/tensor/param_layout.hpp"

namespace cohort::nn {

struct LayerSpec {
  enum class Kind { kLinear, kReLU };
  Kind kind;
  std::string name;          // "fc1", "relu1"
  std::int64_t in = 0;       // IC (Linear)
  std::int64_t out = 0;      // OC (Linear)
  std::size_t weight = 0;    // offsets into the flat parameter array (Linear)
  std::size_t bias = 0;
};

class Model {
 public:
  // Parses a spec; throws InputError naming `--model`, what was expected and what was found.
  //   "mlp:784-512-256-10"  Linear(784,512)-ReLU-Linear(512,256)-ReLU-Linear(256,10)
  static Model parse(const std::string& spec);

  const std::string& spec() const { return spec_; }
  const std::vector<LayerSpec>& layers() const { return layers_; }
  const ParamLayout& layout() const { return layout_; }
  std::int64_t input_features() const { return input_features_; }
  std::int64_t num_classes() const { return num_classes_; }
  // Floating-point operations of one forward pass per sample (2 per multiply-add).
  double forward_flops_per_sample() const;

  // PyTorch's nn.Linear default: weight and bias ~ U(-1/sqrt(IC), 1/sqrt(IC)), drawn from a
  // stream keyed by (seed, tensor index), so each tensor's values depend only on the seed.
  // params: layout().total() floats; padding is zeroed.
  void init(float* params, std::uint64_t seed) const;

 private:
  std::string spec_;
  std::vector<LayerSpec> layers_;
  ParamLayout layout_;
  std::int64_t input_features_ = 0, num_classes_ = 0;
};

}  // namespace cohort::nn
