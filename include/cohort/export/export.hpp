// Export of a checkpoint's weights for other frameworks: safetensors (what PyTorch loads with
// `load_state_dict(strict=True)`) and ONNX (opset 13, the inference graph). Both take the
// canonical (PyTorch-order) weights and the bn layers' running statistics a checkpoint stores;
// neither runs the model nor needs oneDNN or TBB. Every model cohort trains exports: linear,
// conv (with or without bias), bn, relu, maxpool, avgpool, gap, flatten, dropout and res layers,
// and the language models (gpt:...).
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

// A language model's safetensors layout: nanoGPT's names (transformer.*, (out, in) weights,
// lm_head.weight beside the tied token embedding) or Hugging Face's GPT-2 folder
// (model.safetensors without "transformer.", Conv1D weights (in, out), no lm_head, and its
// config.json).
enum class Layout { kNanoGpt, kHuggingFace };
inline constexpr Named<Layout> kLayoutNames[] = {{Layout::kNanoGpt, "nanogpt"},
                                                 {Layout::kHuggingFace, "hf"}};

// A Hugging Face folder's config.json (n_layer, n_head, n_embd, n_positions, vocab_size,
// activation_function, and "bias" as nanoGPT's architecture and the shared peer write it) as
// cohort's model: its spec "gpt:L-H-C-T" with ",bias" unless "bias" is false (GPT-2's configs
// have biases and no such key), ",gelu=tanh" for "gelu_new", and ",pad=128" for a vocabulary of
// more than 1,024 tokens that is not a multiple of 128 (GPT-2's 50,257: 50,304, as llm.c); and
// its vocabulary. InputError naming the file and field for a value cohort's model cannot be:
// another activation, a missing field.
struct FolderModel {
  std::string spec;
  std::int64_t vocab = 0;
  std::string source;  // what gave it, for messages: "DIR/config.json", "FILE's header"
};
FolderModel read_folder_model(const std::filesystem::path& dir);

// llm.c's GPT-2 checkpoint (its train_gpt2.py's gpt2_124M.bin: a header of 256 int32, magic
// 20240326 and version 3, then float32 tensors in llm.c's order and padded vocabulary;
// llmc_read.cpp). is_llmc_checkpoint: a regular file starting with that magic.
// read_llmc_model: the model its header describes, "gpt:L-NH-C-maxT,bias,gelu=tanh" with
// ",pad=128" (or 64) where that gives its padded vocabulary, and V. InputError naming the file
// and the header's field for a damaged header.
bool is_llmc_checkpoint(const std::filesystem::path& path);
FolderModel read_llmc_model(const std::filesystem::path& path);

// Whether nanoGPT's tensor `name` is one Hugging Face's GPT-2 stores as Conv1D, (in, out): the
// attention's and the MLP's weights.
bool hugging_face_conv1d(const std::string& name);

// The weights file of an --init-from path: the path itself, or a folder's model.safetensors.
std::filesystem::path weights_file(const std::filesystem::path& init_from);

// The tensors' names (nn/state_dict.hpp, from the model's kind).
using nn::Module;
using nn::Naming;
using nn::naming_for;
using nn::torch_modules;
using Tensor = nn::StateTensor;
// Every tensor of `model`'s PyTorch state_dict, in its order (nn::Model::state_dict).
inline std::vector<Tensor> torch_tensors(const nn::Model& model) { return model.state_dict(); }

// The values an export writes.
struct Weights {
  const float* params = nullptr;     // model.layout().total() floats in canonical order
  const float* stats = nullptr;      // model.stats_layout().total() floats (null without bn)
  std::int64_t batches_tracked = 0;  // every bn layer's num_batches_tracked
};

// The value cohort writes as num_batches_tracked: how many times the checkpoint's running
// statistics were updated. PyTorch adds 1 per forward pass of a BatchNorm in training mode; cohort
// folds each leaf's batch statistics into the running ones, in leaf order, after every applied
// step (one update per leaf, as if each leaf were a forward pass of micro-batch rows). So it is
// the sum over the applied steps of ceil(rows / micro_batch), counted from the checkpoint's step,
// batch, micro-batch, training-set size and partial-batch rule (a short last batch of an epoch has
// fewer leaves); a skipped step (no fold) is taken off as a full batch's leaves. A checkpoint
// without a batch size counts one per update. The same for every bn layer. PyTorch reads it only
// when a BatchNorm's momentum is None (a cumulative average): inference never uses it.
std::int64_t batches_tracked(const checkpoint::Checkpoint& c);

// What the export records besides the weights.
struct Metadata {
  std::string model;  // the spec as given to --model ("cnn", "mlp:784-512-10", a layer list)
  std::uint64_t step = 0;
  nn::SampleShape input{1, 28, 28};
  // A language model's vocabulary: its size (0: not a language model) and, for text read from
  // input.txt, its characters in token order as UTF-8 (empty for token arrays).
  std::int64_t vocab = 0;
  std::string characters{};
};
// The safetensors header's "__metadata__" and the ONNX model's metadata_props (string to
// string): format, model, naming, input ("1,28,28"), step and cohort_version; a language model's
// also vocab ("65") and, where the checkpoint has them, characters (token i is the string's
// character i: what maps text to the model's input ids and its logits back to text).
std::map<std::string, std::string> metadata_strings(const Metadata& m);

// The safetensors file: 8-byte little-endian header length, the JSON header
// {name: {dtype: "F32" or "I64", shape, data_offsets: [begin, end)}, "__metadata__": {...}}
// padded with spaces to a multiple of 8 bytes, then the tensors' bytes (little-endian float32,
// int64 for num_batches_tracked) in header order (torch_tensors'), back to back.
std::vector<std::uint8_t> encode_safetensors(const nn::Model& model, const Weights& w,
                                             const Metadata& m);

// The ONNX model (opset 13) as serialized protobuf bytes. A layer list: input "input"
// (N, C, H, W) for image models or (N, F) for flat ones, with a symbolic batch dimension "N";
// output "logits" (N, classes). Linear layers are Gemm with transB = 1 (PyTorch's (OC, IC)
// weight as is), conv is Conv with its pads and strides (inputs X, W, B; X and W only for a
// nobias conv), bn BatchNormalization (inference: the running statistics, epsilon 1e-5), pooling
// MaxPool / AveragePool, gap GlobalAveragePool then Flatten(axis 1), relu Relu, flatten
// Flatten(axis 1); a residual block is its body's and its shortcut's nodes, Add and Relu; dropout
// is omitted (the identity at inference). The initializers are the F32 tensors of torch_tensors
// under the same names as in the safetensors file (num_batches_tracked, no operator's input, is
// left out); a node's output is named after its layer ("conv1", "res4.bn2", "res4.add",
// "gap1.pool").
// A language model: input "input" (N, T) int64 token ids, T at most the block; output "logits"
// (N, T, vocab); N and T symbolic. nanoGPT's inference forward pass: Gather of the token
// embedding plus the position table's first T rows (Shape, Slice, Add), per block LayerNorm
// (opset 13 has no LayerNormalization: ReduceMean, Sub, Mul, ReduceMean, Add, Sqrt, Div, Mul),
// Gemm (transB = 1) for c_attn, c_proj, c_fc and the MLP's c_proj on the (N T, C) rows, heads by
// Reshape, Transpose and Gather, MatMul, the scale, the causal mask (an initializer for the
// block, sliced to T by T: 0 or minus infinity, added), Softmax, MatMul back, the exact GELU
// (Mul, Erf, Add, Mul, Mul); the final LayerNorm and the tied head, a Gemm on
// transformer.wte.weight. Initializers: nanoGPT's tensors under their names (no lm_head.weight:
// the head reads the token embedding), then constants named "const.*"; node outputs are named
// after nanoGPT's modules ("transformer.h.0.attn.c_attn", "transformer.h.0.ln_1.var").
std::string encode_onnx(const nn::Model& model, const Weights& w, const Metadata& m);

// The model of checkpoint `ck` (its spec parsed for samples of its input shape), its weights and
// running statistics checked against it. InputError naming `name` (the file) where they differ.
nn::Model checkpoint_model(const checkpoint::Checkpoint& ck, const std::string& name);

// Reads and validates a checkpoint, checks its weights and running statistics against its model
// spec (parsed for samples of the checkpoint's input shape), encodes it and writes `out` through
// a temporary file in the same folder and a rename. InputError naming the file or flag: a bad
// checkpoint, weights or statistics that do not match the spec, an output folder that does not
// exist or cannot be written, an `out` that is the checkpoint's file (through links too) or a
// FIFO or device the rename would replace.
// Layout::kHuggingFace (a language model, safetensors): `out` is a folder, created if need be,
// receiving model.safetensors and config.json.
void export_checkpoint(const std::filesystem::path& checkpoint, Format format,
                       const std::filesystem::path& out, Layout layout = Layout::kNanoGpt);

// Weights for `model` from a safetensors file (`cohort train --init-from`, `cohort eval
// --init-from`): every tensor of the model's state_dict by its name and shape (F32, BF16 or F16;
// num_batches_tracked and other I64 counters skipped), in its canonical order (`params`,
// `stats`: the bn layers' running statistics). What `cohort export` writes reads back, and for a
// language model nanoGPT's names or Hugging Face's GPT-2 layout: names with or without
// "transformer.", Conv1D weights stored (in, out) and transposed here (told by the file's names),
// the attn.bias and attn.masked_bias buffers ignored, lm_head.weight absent or equal to the token
// embedding. Throws InputError naming the file and the tensor: a tensor missing, one the model
// does not have, another shape, a value that is not finite, a damaged header.
struct InitialWeights {
  std::vector<float> params, stats;
};
// An llm.c checkpoint (is_llmc_checkpoint) is read as such: --model must have its sizes and GPT-2's
// architecture, the data its vocabulary; the file exactly the header's model's size.
InitialWeights read_weights(const std::filesystem::path& path, const nn::Model& model);

// The version recorded in exported files: the CMake project's (project(VERSION)).
const char* cohort_version();

}  // namespace cohort::exporting
