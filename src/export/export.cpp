// The export module's shared parts: format and naming, the PyTorch names of the tensors, the
// metadata, and writing a checkpoint's export atomically. The encoders are safetensors.cpp and
// onnx.cpp.
#include "cohort/export/export.hpp"

#include "cohort/config/job_config.hpp"
#include "cohort/core/atomic_file.hpp"
#include "cohort/core/error.hpp"
#include "cohort/version.hpp"

namespace cohort::exporting {

namespace fs = std::filesystem;

Format parse_format(const std::string& name) { return parse_name(kFormatNames, name, "--format"); }

const char* to_string(Format f) { return name_of(kFormatNames, f).data(); }

Naming naming_for(const std::string& spec) {
  return spec == "cnn" || spec.rfind("mlp:", 0) == 0 ? Naming::kPeer : Naming::kSequential;
}

const char* to_string(Naming n) { return n == Naming::kPeer ? "peer" : "sequential"; }

std::size_t Tensor::numel() const {
  std::size_t n = 1;
  for (auto d : shape) n *= static_cast<std::size_t>(d);
  return n;
}

std::vector<Tensor> torch_tensors(const nn::Model& model) {
  const Naming naming = naming_for(model.spec());
  std::vector<Tensor> out;
  const auto& layers = model.layers();
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const nn::LayerSpec& l = layers[i];
    if (!l.has_params()) continue;
    std::string module;
    if (naming == Naming::kSequential)
      module = std::to_string(i);
    else if (l.kind == nn::LayerSpec::Kind::kConv)
      module = "c" + l.name.substr(4);  // the peer's cnn: conv1 -> c1
    else
      module = l.name;                                  // fc1, fc2, ...: the peer's names already
    std::vector<std::int64_t> weight{l.out.C, l.in.C};  // (OC, IC): canonical order
    if (l.kind == nn::LayerSpec::Kind::kConv)
      weight = {l.out.C, l.in.C, l.kernel, l.kernel};  // (OC, IC, KH, KW)
    out.push_back({module + ".weight", weight, l.weight});
    out.push_back({module + ".bias", {l.out.C}, l.bias});
  }
  return out;
}

const char* cohort_version() { return COHORT_VERSION; }

std::map<std::string, std::string> metadata_strings(const Metadata& m) {
  return {{"format", "cohort"},
          {"model", m.model},
          {"naming", to_string(naming_for(m.model))},
          {"input", std::to_string(m.input.C) + "," + std::to_string(m.input.H) + "," +
                        std::to_string(m.input.W)},
          {"step", std::to_string(m.step)},
          {"cohort_version", cohort_version()}};
}

namespace {

// The output's folder must exist and be writable before anything is encoded.
void check_output(const fs::path& out) {
  if (out.empty()) throw InputError("-o/--output: expected a file name, found ''");
  if (const std::string problem = config::path_problem(config::Type::kFileOut, out.string());
      !problem.empty())
    throw InputError("-o/--output: " + problem);
}

}  // namespace

void export_checkpoint(const fs::path& checkpoint, Format format, const fs::path& out) {
  check_output(out);
  const checkpoint::Checkpoint ck = checkpoint::load_checkpoint(checkpoint);
  const nn::SampleShape input{static_cast<std::int64_t>(ck.input[0]),
                              static_cast<std::int64_t>(ck.input[1]),
                              static_cast<std::int64_t>(ck.input[2])};
  const nn::Model model = nn::Model::parse(ck.model, input);
  if (ck.weights.size() != model.layout().total())
    throw InputError(
        checkpoint.string() + ": the model '" + ck.model + "' on samples " + input.str() + " has " +
        std::to_string(model.layout().total()) + " parameter floats, the checkpoint holds " +
        std::to_string(ck.weights.size()) + " (was it trained on samples of another shape?)");
  // Not yet: bn needs its running statistics exported, res and gap a graph beyond a Sequential.
  for (const nn::LayerSpec& l : model.layers())
    if (l.kind == nn::LayerSpec::Kind::kBatchNorm || l.kind == nn::LayerSpec::Kind::kGap ||
        l.kind == nn::LayerSpec::Kind::kResidual)
      throw InputError(checkpoint.string() + ": the model '" + ck.model + "' has a " + l.name +
                       " layer: export supports linear, conv, relu, pooling, flatten and dropout "
                       "layers, not yet bn, gap or res");
  const Metadata meta{.model = ck.model, .step = ck.step, .input = model.input()};
  if (format == Format::kSafetensors) {
    const std::vector<std::uint8_t> bytes = encode_safetensors(model, ck.weights.data(), meta);
    write_file_atomically(out, {reinterpret_cast<const char*>(bytes.data()), bytes.size()});
  } else {
    write_file_atomically(out, encode_onnx(model, ck.weights.data(), meta));
  }
}

}  // namespace cohort::exporting
