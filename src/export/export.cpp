// The export module's shared parts: format and naming, the PyTorch names of the modules and
// tensors, num_batches_tracked, the metadata, and writing a checkpoint's export atomically. The
// encoders are safetensors.cpp and onnx.cpp (onnx_gpt.cpp: the language model's graph).
#include "cohort/export/export.hpp"

#include <algorithm>
#include <string_view>
#include <utility>

#include "cohort/config/job_config.hpp"
#include "cohort/core/atomic_file.hpp"
#include "cohort/core/error.hpp"
#include "cohort/data/text.hpp"
#include "cohort/nn/gpt.hpp"
#include "cohort/version.hpp"

namespace cohort::exporting {

namespace fs = std::filesystem;
using Kind = nn::LayerSpec::Kind;

Format parse_format(const std::string& name) { return parse_name(kFormatNames, name, "--format"); }

const char* to_string(Format f) { return name_of(kFormatNames, f).data(); }

Naming naming_for(const std::string& spec) {
  return spec == "cnn" || spec == "resnet20" || spec.rfind("mlp:", 0) == 0 ||
                 nn::GptModel::is_gpt(spec)
             ? Naming::kPeer
             : Naming::kSequential;
}

const char* to_string(Naming n) { return n == Naming::kPeer ? "peer" : "sequential"; }

std::size_t Tensor::numel() const {
  std::size_t n = 1;
  for (auto d : shape) n *= static_cast<std::size_t>(d);
  return n;
}

std::size_t Tensor::bytes() const {
  return numel() * (source == Source::kBatchesTracked ? sizeof(std::int64_t) : sizeof(float));
}

namespace {

// The number in a layer's name: "res4" -> 4, "conv1" -> 1.
std::size_t ordinal(const std::string& name) {
  const auto digits = name.find_first_of("0123456789");
  COHORT_CHECK(digits != std::string::npos, name);
  return std::stoul(name.substr(digits));
}

// A top-level layer's module under the peer's names (torch_peer.py's MLP, CNN and ResNet20).
std::string peer_module(const std::string& spec, const nn::LayerSpec& l) {
  if (spec == "resnet20") {
    // stem = Sequential(conv3x3, BatchNorm2d, ReLU), blocks = Sequential(9 BasicBlocks), fc.
    if (l.kind == Kind::kConv) return "stem.0";
    if (l.kind == Kind::kBatchNorm) return "stem.1";
    if (l.kind == Kind::kResidual) return "blocks." + std::to_string(ordinal(l.name) - 1);
    COHORT_CHECK(l.kind == Kind::kLinear, l.name + " in the resnet20 preset");
    return "fc";
  }
  if (l.kind == Kind::kConv) return "c" + std::to_string(ordinal(l.name));  // the cnn's c1, c2
  return l.name;  // fc1, fc2, ...: the peer's names already
}

// A residual block's member under BasicBlock's names; cohort names it "<res>.<member>".
std::string block_member(const nn::LayerSpec& l) {
  static constexpr std::pair<std::string_view, std::string_view> kMembers[] = {
      {"conv1", "c1"},           {"bn1", "b1"},          {"conv2", "c2"}, {"bn2", "b2"},
      {"short.conv", "short.0"}, {"short.bn", "short.1"}};
  const std::string_view member = std::string_view(l.name).substr(l.name.find('.') + 1);
  for (const auto& [cohort_name, torch_name] : kMembers)
    if (member == cohort_name) return std::string(torch_name);
  COHORT_CHECK(false, "a residual block's member " + l.name);
  return {};
}

}  // namespace

std::vector<Module> torch_modules(const nn::Model& model) {
  const Naming naming = naming_for(model.spec());
  std::vector<Module> out;
  const auto& layers = model.layers();
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const nn::LayerSpec& l = layers[i];
    if (!l.has_params()) continue;
    const std::string module =
        naming == Naming::kSequential ? std::to_string(i) : peer_module(model.spec(), l);
    if (l.kind != Kind::kResidual) {
      out.push_back({&l, module});
      continue;
    }
    for (const auto* members : {&l.body, &l.shortcut})
      for (const nn::LayerSpec& s : *members)
        if (s.has_params()) out.push_back({&s, module + "." + block_member(s)});
  }
  return out;
}

std::vector<Tensor> torch_tensors(const nn::Model& model) {
  using Source = Tensor::Source;
  std::vector<Tensor> out;
  if (const nn::GptModel* gpt = model.gpt()) {
    // nanoGPT's state_dict: its parameters under their names, then lm_head.weight, the token
    // embedding again (tied: PyTorch lists a tied parameter under both names).
    for (const ParamLayout::Entry& e : gpt->layout().entries())
      out.push_back({e.name, e.shape.dims, Source::kParams, e.offset});
    out.push_back({"lm_head.weight", gpt->layout().entries().front().shape.dims, Source::kParams,
                   gpt->wte()});
    return out;
  }
  for (const auto& [layer, module] : torch_modules(model)) {
    const nn::LayerSpec& l = *layer;
    if (l.kind == Kind::kBatchNorm) {
      // BatchNorm1d/2d's state_dict: its parameters, then its buffers.
      const std::vector<std::int64_t> c{l.in.C};
      out.push_back({module + ".weight", c, Source::kParams, l.weight});
      out.push_back({module + ".bias", c, Source::kParams, l.bias});
      out.push_back({module + ".running_mean", c, Source::kStats, l.running_mean});
      out.push_back({module + ".running_var", c, Source::kStats, l.running_var});
      out.push_back({module + ".num_batches_tracked", {}, Source::kBatchesTracked, 0});
      continue;
    }
    std::vector<std::int64_t> weight{l.out.C, l.in.C};  // (OC, IC): canonical order
    if (l.kind == Kind::kConv) weight = {l.out.C, l.in.C, l.kernel, l.kernel};  // (OC, IC, KH, KW)
    out.push_back({module + ".weight", weight, Source::kParams, l.weight});
    if (l.has_bias) out.push_back({module + ".bias", {l.out.C}, Source::kParams, l.bias});
  }
  return out;
}

std::int64_t batches_tracked(const checkpoint::Checkpoint& c) {
  const auto updates = static_cast<std::int64_t>(c.updates);
  const std::uint64_t B = c.batch, N = c.train_count;
  if (B == 0 || N == 0) return updates;
  const std::uint64_t M = c.micro_batch != 0 ? std::min(c.micro_batch, B) : B;
  const auto leaves = [M](std::uint64_t rows) { return (rows + M - 1) / M; };
  const std::uint64_t per_epoch = c.drop_last ? N / B : (N + B - 1) / B;  // steps
  if (per_epoch == 0) return updates;
  // Every step has a full batch but an epoch's last one without drop_last, of N % B rows.
  const std::uint64_t last = !c.drop_last && N % B != 0 ? leaves(N % B) : leaves(B);
  // The steps of the unfinished epoch are its first `rest`, none of them its last.
  const std::uint64_t epochs = c.step / per_epoch, rest = c.step % per_epoch;
  const std::uint64_t folded = epochs * ((per_epoch - 1) * leaves(B) + last) + rest * leaves(B);
  return static_cast<std::int64_t>(folded - std::min(folded, c.skipped * leaves(B)));
}

const char* cohort_version() { return COHORT_VERSION; }

std::map<std::string, std::string> metadata_strings(const Metadata& m) {
  std::map<std::string, std::string> out{
      {"format", "cohort"},
      {"model", m.model},
      {"naming", to_string(naming_for(m.model))},
      {"input", std::to_string(m.input.C) + "," + std::to_string(m.input.H) + "," +
                    std::to_string(m.input.W)},
      {"step", std::to_string(m.step)},
      {"cohort_version", cohort_version()}};
  if (m.vocab != 0) out["vocab"] = std::to_string(m.vocab);
  if (!m.characters.empty()) out["characters"] = m.characters;
  return out;
}

namespace {

// The output's folder must be writable or creatable before anything is encoded.
void check_output(const fs::path& out) {
  if (out.empty()) throw InputError("-o/--output: expected a file name, found ''");
  for (const std::string& problem : {config::path_problem(config::Type::kFileOut, out.string()),
                                     config::replace_problem(out.string())})
    if (!problem.empty()) throw InputError("-o/--output: " + problem);
}

}  // namespace

void export_checkpoint(const fs::path& checkpoint, Format format, const fs::path& out) {
  check_output(out);
  if (config::same_file(out.string(), checkpoint.string()))
    throw InputError("-o/--output: expected a file of its own, found '" + out.string() +
                     "', which is --checkpoint's file ('" + checkpoint.string() +
                     "') (writing it would replace that)");
  const checkpoint::Checkpoint ck = checkpoint::load_checkpoint(checkpoint);
  const nn::SampleShape input{static_cast<std::int64_t>(ck.input[0]),
                              static_cast<std::int64_t>(ck.input[1]),
                              static_cast<std::int64_t>(ck.input[2])};
  const nn::Model model = nn::Model::parse(ck.model, input, static_cast<std::int64_t>(ck.vocab));
  if (ck.weights.size() != model.layout().total())
    throw InputError(
        checkpoint.string() + ": the model '" + ck.model + "' on samples " + input.str() + " has " +
        std::to_string(model.layout().total()) + " parameter floats, the checkpoint holds " +
        std::to_string(ck.weights.size()) + " (was it trained on samples of another shape?)");
  if (ck.running_stats.size() != model.stats_layout().total())
    throw InputError(checkpoint.string() + ": the model '" + ck.model + "' on samples " +
                     input.str() + " has " + std::to_string(model.stats_layout().total()) +
                     " running-statistics floats (its bn layers), the checkpoint holds " +
                     std::to_string(ck.running_stats.size()));
  const Weights w{.params = ck.weights.data(),
                  .stats = ck.running_stats.empty() ? nullptr : ck.running_stats.data(),
                  .batches_tracked = batches_tracked(ck)};
  std::string characters;
  for (const std::uint32_t c : ck.characters) characters += data::encode_utf8(c);
  const Metadata meta{.model = ck.model,
                      .step = ck.step,
                      .input = model.input(),
                      .vocab = static_cast<std::int64_t>(ck.vocab),
                      .characters = characters};
  create_output_folders(out);
  if (format == Format::kSafetensors) {
    const std::vector<std::uint8_t> bytes = encode_safetensors(model, w, meta);
    write_file_atomically(out, {reinterpret_cast<const char*>(bytes.data()), bytes.size()});
  } else {
    write_file_atomically(out, encode_onnx(model, w, meta));
  }
}

}  // namespace cohort::exporting
