// The names of a model's tensors in PyTorch: StateTensor (one entry of a state_dict, what
// ModelKind::state_dict lists and export writes) and, for layer lists, the modules' names.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace cohort::nn {

struct LayerSpec;
class Model;

// How the tensors are named, chosen from the model spec:
//   kPeer        "cnn", "resnet20" and "mlp:..." specs: the modules of the PyTorch peer
//                (bench/peers/torch_peer.py): the mlp's fc1, fc2, ... (Linear); the cnn's c1, c2
//                (Conv2d) and fc1, fc2; ResNet20's stem.0 (Conv2d), stem.1 (BatchNorm2d),
//                blocks.0 ... blocks.8 (BasicBlock) and fc (Linear); and a kind's own names
//                (ModelKind::window > 0: a language model's, nanoGPT's).
//   kSequential  any other layer list: layer i of the list is module i of a PyTorch
//                nn.Sequential built from it (conv -> Conv2d, bias=False for nobias; bn ->
//                BatchNorm2d after an image, BatchNorm1d after a flat input; relu -> ReLU;
//                maxpool -> MaxPool2d; avgpool -> AvgPool2d; gap -> any parameter-free module
//                taking (N, C, H, W) to the mean over H and W, (N, C); flatten -> Flatten;
//                dropout -> Dropout; linear -> Linear; res -> torch_peer.py's BasicBlock), so its
//                tensors are "0.weight", "0.bias", "3.c1.weight", ...
// Inside a residual block, under either naming, the members are BasicBlock's: c1, b1, c2, b2 (the
// body's conv3x3, bn, conv3x3, bn) and, for a projection shortcut, short.0 (conv1x1, no bias) and
// short.1 (bn): "blocks.3.short.1.running_var", "4.c1.weight".
enum class Naming { kPeer, kSequential };
Naming naming_for(const std::string& spec);
const char* to_string(Naming n);

// A layer with tensors (linear, conv or bn; at the top level or inside a residual block) and
// the name of its PyTorch module: "fc1", "stem.1", "blocks.3.short.0", "0", "4.b2".
struct Module {
  const LayerSpec* layer = nullptr;  // points into the model
  std::string name;
};
// Every such layer of `model` in model order (a residual block's body, then its shortcut).
std::vector<Module> torch_modules(const Model& model);

// One tensor of a model's PyTorch state_dict (ModelKind::state_dict, what export writes): its
// name and shape, and where its values come from. A layer list's, in its order: module by module,
// a linear or conv layer's weight then bias (a conv(..., nobias) has its weight only, as
// Conv2d(..., bias=False)), a bn layer's weight (scale), bias (shift), running_mean, running_var
// and num_batches_tracked; a language model's: nanoGPT's (nn/gpt/gpt.hpp).
struct StateTensor {
  enum class Source {
    kParams,          // F32: the canonical parameter array (weights, biases, bn scale and shift)
    kStats,           // F32: the running-statistics array (bn running_mean, running_var)
    kBatchesTracked,  // I64 scalar: bn's num_batches_tracked (export's Weights::batches_tracked)
  };
  std::string name;                 // "fc1.weight", "c1.bias", "0.weight", "stem.1.running_var"
  std::vector<std::int64_t> shape;  // PyTorch's: (OC, IC), (OC, IC, KH, KW), (C); [] a scalar
  Source source = Source::kParams;
  std::size_t offset = 0;  // in floats, into the array of its source (kParams, kStats)
  std::size_t numel() const;
  std::size_t bytes() const;  // numel() times 4 (F32) or 8 (I64)
};

}  // namespace cohort::nn
