// Export of a checkpoint's weights for other frameworks: safetensors (what PyTorch loads with
// `load_state_dict`) and ONNX (opset 13, the inference graph). Both take the canonical
// (PyTorch-order) weights a checkpoint stores; neither runs the model nor needs oneDNN or TBB.
// Not a checkpoint: the optimizer's state, the step counters and the config are not exported
// (the step and the model spec are recorded as metadata).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "cohort/checkpoint/checkpoint.hpp"
#include "cohort/core/names.hpp"
#include "cohort/nn/model.hpp"

// `export` is a C++ keyword, so the module's namespace is `exporting`.
namespace cohort::exporting {

enum class Format { kSafetensors, kOnnx };
inline constexpr Named<Format> kFormatNames[] = {{Format::kSafetensors, "safetensors"},
                                                 {Format::kOnnx, "onnx"}};
// kFormatNames; anything else throws InputError naming --format and the choices.
Format parse_format(const std::string& name);
const char* to_string(Format f);

// How the tensors are named, chosen from the model spec:
//   kPeer        "cnn" and "mlp:..." specs: the modules of the PyTorch peer (torch_peer.py):
//                the mlp's fc1, fc2, ... (Linear), the cnn's c1, c2 (Conv2d) and fc1, fc2.
//   kSequential  any other layer list: layer i of the list is module i of a PyTorch
//                nn.Sequential built from it (conv -> Conv2d, relu -> ReLU, maxpool -> MaxPool2d,
//                avgpool -> AvgPool2d, flatten -> Flatten, dropout -> Dropout,
//                linear -> Linear), so its tensors are "0.weight", "0.bias", "3.weight", ...
enum class Naming { kPeer, kSequential };
Naming naming_for(const std::string& spec);
const char* to_string(Naming n);

// One exported tensor: its PyTorch name and shape, and where it sits in the flat array.
struct Tensor {
  std::string name;                 // "fc1.weight", "c1.bias", "0.weight"
  std::vector<std::int64_t> shape;  // PyTorch's: (OC, IC) or (OC, IC, KH, KW) or (OC)
  std::size_t offset = 0;           // in floats, into the canonical flat array
  std::size_t numel() const;
};
// Every parameter tensor of `model` in layer order, weight before bias.
std::vector<Tensor> torch_tensors(const nn::Model& model);

// What the export records besides the weights.
struct Metadata {
  std::string model;  // the spec as given to --model ("cnn", "mlp:784-512-10", a layer list)
  std::uint64_t step = 0;
  nn::SampleShape input{1, 28, 28};
};
// The safetensors header's "__metadata__" (string to string): format, model, naming, input
// ("1,28,28"), step and cohort_version.
std::map<std::string, std::string> metadata_strings(const Metadata& m);

// The safetensors file: 8-byte little-endian header length, the JSON header
// {name: {dtype: "F32", shape, data_offsets: [begin, end)}, "__metadata__": {...}} padded with
// spaces to a multiple of 8 bytes, then the tensors' bytes (little-endian float32) in header
// order, back to back. `canonical`: model.layout().total() floats in canonical order.
std::vector<std::uint8_t> encode_safetensors(const nn::Model& model, const float* canonical,
                                             const Metadata& m);

// The ONNX model (opset 13) as serialized protobuf bytes: input "input" (N, C, H, W) for image
// models or (N, F) for flat ones, with a symbolic batch dimension "N"; output "logits"
// (N, classes). Linear layers are Gemm with transB = 1 (PyTorch's (OC, IC) weight as is), conv
// is Conv with its pads and strides, pooling MaxPool / AveragePool, relu Relu, flatten
// Flatten(axis 1); dropout is omitted (the identity at inference). The weights are initializers
// under the same names as in the safetensors file.
std::string encode_onnx(const nn::Model& model, const float* canonical, const Metadata& m);

// Reads and validates a checkpoint, checks its weights against its model spec (parsed for
// samples of the checkpoint's input shape), encodes it and writes `out` through a temporary file in
// the same folder and a rename. InputError naming the file or flag: a bad checkpoint, weights that
// do not match the spec, an output folder that does not exist or cannot be written.
void export_checkpoint(const std::filesystem::path& checkpoint, Format format,
                       const std::filesystem::path& out);

// The version recorded in exported files ("0.1.0", the CMake project's).
const char* cohort_version();

}  // namespace cohort::exporting
