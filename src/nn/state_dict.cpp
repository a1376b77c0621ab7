// The PyTorch names of a model's tensors: nn/state_dict.hpp; the layer lists' state_dict.
#include "cohort/nn/state_dict.hpp"

#include <string_view>
#include <utility>

#include "cohort/core/error.hpp"
#include "cohort/nn/model.hpp"
#include "state_dict_layers.hpp"

namespace cohort::nn {

using Kind = LayerSpec::Kind;

Naming naming_for(const std::string& spec) {
  // A kind of its own names its tensors itself (a language model: nanoGPT's names).
  return spec == "cnn" || spec == "resnet20" || spec.rfind("mlp:", 0) == 0 || spec_window(spec) > 0
             ? Naming::kPeer
             : Naming::kSequential;
}

const char* to_string(Naming n) { return n == Naming::kPeer ? "peer" : "sequential"; }

std::size_t StateTensor::numel() const {
  std::size_t n = 1;
  for (auto d : shape) n *= static_cast<std::size_t>(d);
  return n;
}

std::size_t StateTensor::bytes() const {
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
std::string peer_module(const std::string& spec, const LayerSpec& l) {
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
std::string block_member(const LayerSpec& l) {
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

std::vector<Module> layer_modules(const std::string& spec, const std::vector<LayerSpec>& layers) {
  const Naming naming = naming_for(spec);
  std::vector<Module> out;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const LayerSpec& l = layers[i];
    if (!l.has_params()) continue;
    const std::string module =
        naming == Naming::kSequential ? std::to_string(i) : peer_module(spec, l);
    if (l.kind != Kind::kResidual) {
      out.push_back({&l, module});
      continue;
    }
    for (const auto* members : {&l.body, &l.shortcut})
      for (const LayerSpec& s : *members)
        if (s.has_params()) out.push_back({&s, module + "." + block_member(s)});
  }
  return out;
}

std::vector<Module> torch_modules(const Model& model) {
  return layer_modules(model.spec(), model.layers());
}

std::vector<StateTensor> layer_state_dict(const std::string& spec,
                                          const std::vector<LayerSpec>& layers) {
  using Source = StateTensor::Source;
  std::vector<StateTensor> out;
  for (const auto& [layer, module] : layer_modules(spec, layers)) {
    const LayerSpec& l = *layer;
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

}  // namespace cohort::nn
