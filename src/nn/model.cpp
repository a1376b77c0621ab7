// Model and ModelKind (the registry of kinds), and the layer lists' kind: spec parsing, shape
// inference, parameter layout and initialisation.
#include "cohort/nn/model.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <functional>
#include <iterator>

#include "cohort/core/error.hpp"
#include "cohort/core/rng.hpp"
#include "leaf_caps.hpp"
#include "model_kinds.hpp"
#include "state_dict_layers.hpp"

namespace cohort::nn {

namespace {

[[noreturn]] void bad_spec(const std::string& spec, const std::string& why) {
  throw InputError(
      "--model: expected 'mlp:IN-H1-...-OUT', 'cnn', 'resnet20' or a layer list such as "
      "'conv(32,5)-relu-maxpool(2)-flatten-linear(10)', found '" +
      spec + "': " + why);
}

template <typename T>
T number(const std::string& spec, std::string_view token, T lo, T hi) {
  T v{};
  auto [ptr, ec] = std::from_chars(token.data(), token.data() + token.size(), v);
  if (ec != std::errc() || ptr != token.data() + token.size() || token.empty())
    bad_spec(spec, "'" + std::string(token) + "' is not a number");
  if (!(v >= lo && v <= hi))
    bad_spec(spec, "'" + std::string(token) + "' is not in [" + std::to_string(lo) + ", " +
                       std::to_string(hi) + "]");
  return v;
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  while (true) {
    auto at = s.find(sep);
    out.push_back(s.substr(0, at));
    if (at == std::string_view::npos) return out;
    s = s.substr(at + 1);
  }
}

// Every layer in model (= parameter) order: a residual block, then its body, then its shortcut.
template <typename Layers, typename F>
void visit(Layers& layers, F&& f) {
  for (auto& l : layers) {
    f(l);
    visit(l.body, f);
    visit(l.shortcut, f);
  }
}

// Where element j of a linear weight in (OC, IC) order is stored, relative to l.weight: the
// layer list stores it (IC, OC), transposed from PyTorch's, so that oneDNN's inner product runs
// its forward as a plain GEMM (docs/decisions.md); checkpoints hold the canonical order.
std::size_t transposed_index(const LayerSpec& l, std::size_t j) {
  const auto OC = static_cast<std::size_t>(l.out.C), IC = static_cast<std::size_t>(l.in.C);
  const std::size_t o = j / IC, i = j % IC;  // j: (o, i) in (OC, IC) order
  return i * OC + o;
}

bool contains_conv(const std::vector<LayerSpec>& layers) {
  bool conv = false;
  visit(layers, [&](const LayerSpec& l) { conv = conv || l.kind == LayerSpec::Kind::kConv; });
  return conv;
}

// The registered kinds, the language model's first.
std::vector<ModelKindEntry>& entries() {
  static std::vector<ModelKindEntry> all{gpt_kind_entry()};
  return all;
}

const ModelKindEntry* entry_of(const std::string& spec) {
  for (const ModelKindEntry& e : entries())
    if (spec.rfind(e.prefix, 0) == 0) return &e;
  return nullptr;
}

// A list of layers (mlp:, cnn, resnet20 and layer lists): the layers own their offsets into the
// flat parameter array and the running statistics; its executor runs on oneDNN (net.cpp).
class LayerList final : public ModelKind {
 public:
  LayerList(std::string spec, ParamLayout layout, SampleShape input, std::int64_t classes,
            std::vector<LayerSpec> layers, ParamLayout stats)
      : ModelKind(std::move(spec), std::move(layout), input, classes),
        layers_(std::move(layers)),
        stats_(std::move(stats)) {}
  std::string_view name() const override { return "layers"; }
  const std::vector<LayerSpec>& layers() const override { return layers_; }
  const ParamLayout& stats_layout() const override { return stats_; }
  bool has_dropout() const override;
  void init(float* params, std::uint64_t seed) const override;
  std::vector<std::pair<std::size_t, std::size_t>> norm_and_bias_ranges() const override;
  double forward_flops_per_sample() const override;
  void to_canonical(const float* stored, float* canonical) const override;
  void from_canonical(const float* canonical, float* stored) const override;
  std::vector<StateTensor> state_dict() const override;
  std::unique_ptr<Executor> executor(const Model& model, bool blocked_layouts,
                                     Precision precision) const override;
  LeafRule leaf_rule(Precision precision) const override;
  bool batch_weight_grads() const override { return true; }

 private:
  std::vector<LayerSpec> layers_;
  ParamLayout stats_;
};

}  // namespace

std::string SampleShape::str() const {
  if (flat()) return "(" + std::to_string(C) + ")";
  return "(" + std::to_string(C) + ", " + std::to_string(H) + ", " + std::to_string(W) + ")";
}

ModelKind::ModelKind(std::string spec, ParamLayout layout, SampleShape input, std::int64_t classes)
    : spec_(std::move(spec)), layout_(std::move(layout)), input_(input), num_classes_(classes) {}

const std::vector<LayerSpec>& ModelKind::layers() const {
  static const std::vector<LayerSpec> none;
  return none;
}

const ParamLayout& ModelKind::stats_layout() const {
  static const ParamLayout none;
  return none;
}

void ModelKind::to_canonical(const float* stored, float* canonical) const {
  std::copy(stored, stored + layout_.total(), canonical);
}

void ModelKind::from_canonical(const float* canonical, float* stored) const {
  std::copy(canonical, canonical + layout_.total(), stored);
}

double ModelKind::own_kernel_floor_seconds(std::int64_t, Precision) const { return 0; }
double ModelKind::leaf_plan_bytes(std::size_t, Precision) const { return 0; }

void register_model_kind(ModelKindEntry entry) {
  for (ModelKindEntry& e : entries())
    if (e.prefix == entry.prefix) {
      e = std::move(entry);
      return;
    }
  entries().push_back(std::move(entry));
}

std::int64_t spec_window(const std::string& spec) {
  const ModelKindEntry* entry = entry_of(spec);
  return entry ? entry->window(spec) : 0;
}

Model::Model(std::shared_ptr<const ModelKind> kind) : kind_(std::move(kind)) {
  COHORT_CHECK(kind_ != nullptr, "a model has a kind");
}

Model Model::parse(const std::string& spec_in, SampleShape input, std::int64_t vocab) {
  if (const ModelKindEntry* entry = entry_of(spec_in))
    return Model(entry->parse(spec_in, input, vocab));
  const std::string spec = spec_in == "cnn"        ? kCnnPreset
                           : spec_in == "resnet20" ? kResnet20Preset
                                                   : spec_in;
  ParamLayout layout, stats;
  constexpr std::string_view kMlp = "mlp:";
  std::vector<LayerSpec> list;
  if (spec.rfind(kMlp, 0) == 0) {
    std::vector<std::int64_t> sizes;
    for (auto token : split(std::string_view(spec).substr(kMlp.size()), '-'))
      sizes.push_back(number<std::int64_t>(spec, token, 1, 1 << 20));
    if (sizes.size() < 2) bad_spec(spec, "only one size");
    input = {sizes[0], 1, 1};
    for (std::size_t i = 1; i < sizes.size(); ++i) {
      LayerSpec fc{};
      fc.kind = LayerSpec::Kind::kLinear;
      fc.out = {sizes[i], 1, 1};
      list.push_back(fc);
      if (i + 1 < sizes.size()) {
        LayerSpec relu{};
        relu.kind = LayerSpec::Kind::kReLU;
        list.push_back(relu);
      }
    }
  } else {
    for (auto token : split(spec, '-')) {
      auto open = token.find('(');
      std::string_view name = token.substr(0, open);
      std::vector<std::string_view> args;
      if (open != std::string_view::npos) {
        if (token.back() != ')') bad_spec(spec, "'" + std::string(token) + "' lacks ')'");
        args = split(token.substr(open + 1, token.size() - open - 2), ',');
      }
      auto need = [&](std::size_t lo, std::size_t hi) {
        if (args.size() < lo || args.size() > hi)
          bad_spec(spec, "'" + std::string(name) + "' takes " + std::to_string(lo) + " to " +
                             std::to_string(hi) + " arguments, found " +
                             std::to_string(args.size()));
      };
      auto arg = [&](std::size_t i, std::int64_t fallback, std::int64_t lo, std::int64_t hi) {
        return i < args.size() ? number<std::int64_t>(spec, args[i], lo, hi) : fallback;
      };
      LayerSpec l{};
      if (name == "conv") {
        need(2, 5);
        l.kind = LayerSpec::Kind::kConv;
        l.out.C = arg(0, 0, 1, 1 << 14);
        l.kernel = arg(1, 0, 1, 64);
        l.stride = arg(2, 1, 1, 64);
        l.pad = arg(3, 0, 0, 64);
        if (args.size() == 5) {
          if (args[4] != "nobias")
            bad_spec(spec, "conv's fifth argument may only be 'nobias', found '" +
                               std::string(args[4]) + "'");
          l.has_bias = false;
        }
      } else if (name == "res") {
        need(1, 2);
        l.kind = LayerSpec::Kind::kResidual;
        l.out.C = arg(0, 0, 1, 1 << 14);
        l.stride = arg(1, 1, 1, 64);
      } else if (name == "maxpool" || name == "avgpool") {
        need(1, 2);
        l.kind = name == "maxpool" ? LayerSpec::Kind::kMaxPool : LayerSpec::Kind::kAvgPool;
        l.kernel = arg(0, 0, 1, 64);
        l.stride = arg(1, l.kernel, 1, 64);
      } else if (name == "linear") {
        need(1, 1);
        l.kind = LayerSpec::Kind::kLinear;
        l.out = {arg(0, 0, 1, 1 << 20), 1, 1};
      } else if (name == "dropout") {
        need(1, 1);
        l.kind = LayerSpec::Kind::kDropout;
        l.p = number<float>(spec, args[0], 0.0f, 0.99f);
      } else if (name == "relu" || name == "flatten" || name == "bn" || name == "gap") {
        need(0, 0);
        l.kind = name == "relu"      ? LayerSpec::Kind::kReLU
                 : name == "flatten" ? LayerSpec::Kind::kFlatten
                 : name == "bn"      ? LayerSpec::Kind::kBatchNorm
                                     : LayerSpec::Kind::kGap;
      } else {
        bad_spec(spec, "unknown layer '" + std::string(name) + "'");
      }
      list.push_back(l);
    }
  }

  // Shapes, names and parameters, layer by layer. `place` gives one layer (named already) its
  // output shape, its parameters (appended to the layout) and its running statistics.
  double parameters = 0;
  std::function<void(LayerSpec&, SampleShape)> place = [&](LayerSpec& l, SampleShape cur) {
    l.in = cur;
    auto count_parameters = [&](double n) {
      parameters += n;
      if (parameters > double(kMaxParameters))
        bad_spec(spec,
                 "more than " + std::to_string(kMaxParameters) + " parameters up to " + l.name);
    };
    switch (l.kind) {
      case LayerSpec::Kind::kLinear:
        if (!cur.flat())
          bad_spec(spec, l.name + " needs a flat input, found " + cur.str() + " (add flatten)");
        count_parameters(double(l.out.C) * double(cur.C) + double(l.out.C));
        // Stored (IC, OC), i.e. transposed from PyTorch's (OC, IC): oneDNN's inner product then
        // runs its forward as a plain GEMM, the faster one (docs/decisions.md, "Linear weights
        // stored (IC, OC)", and its command). Checkpoints hold the canonical order.
        l.weight = layout.add(l.name + ".weight", Shape{{cur.C, l.out.C}});
        l.bias = layout.add(l.name + ".bias", Shape{{l.out.C}});  // (OC)
        break;
      case LayerSpec::Kind::kConv: {
        if (cur.H == 1 && cur.W == 1 && l.kernel > 1)
          bad_spec(spec, l.name + " needs an image input (C, H, W), found " + cur.str());
        if (cur.H + 2 * l.pad < l.kernel || cur.W + 2 * l.pad < l.kernel)
          bad_spec(spec, l.name + " kernel " + std::to_string(l.kernel) +
                             " is larger than its input " + cur.str());
        l.out = {l.out.C, (cur.H + 2 * l.pad - l.kernel) / l.stride + 1,
                 (cur.W + 2 * l.pad - l.kernel) / l.stride + 1};
        count_parameters(double(l.out.C) * double(cur.C) * double(l.kernel) * double(l.kernel) +
                         (l.has_bias ? double(l.out.C) : 0.0));
        l.weight = layout.add(l.name + ".weight",
                              Shape{{l.out.C, cur.C, l.kernel, l.kernel}});  // (OC, IC, KH, KW)
        if (l.has_bias) l.bias = layout.add(l.name + ".bias", Shape{{l.out.C}});
        break;
      }
      case LayerSpec::Kind::kBatchNorm:
        // Per channel of an image, per feature of a flat input: either way C of (C, H, W).
        l.out = cur;
        count_parameters(2.0 * double(cur.C));
        l.weight = layout.add(l.name + ".weight", Shape{{cur.C}});  // scale (gamma), (C)
        l.bias = layout.add(l.name + ".bias", Shape{{cur.C}});      // shift (beta), (C)
        l.running_mean = stats.add(l.name + ".running_mean", Shape{{cur.C}});
        l.running_var = stats.add(l.name + ".running_var", Shape{{cur.C}});
        break;
      case LayerSpec::Kind::kGap:
        if (cur.flat())
          bad_spec(spec, l.name + " needs an image input (C, H, W), found " + cur.str());
        l.out = {cur.C, 1, 1};
        break;
      case LayerSpec::Kind::kResidual: {
        if (cur.flat())
          bad_spec(spec, l.name + " needs an image input (C, H, W), found " + cur.str());
        // PyTorch's BasicBlock (torch_peer.py's Block): c1, b1, c2, b2 and short.0, short.1 are
        // here <res>.conv1, <res>.bn1, <res>.relu1, <res>.conv2, <res>.bn2 and <res>.short.conv,
        // <res>.short.bn.
        auto sub = [&](LayerSpec::Kind kind, std::string name, std::int64_t OC, std::int64_t k,
                       std::int64_t stride, std::int64_t pad) {
          LayerSpec s{};
          s.kind = kind;
          s.name = l.name + "." + name;
          s.out.C = OC;
          s.kernel = k;
          s.stride = stride;
          s.pad = pad;
          s.has_bias = kind != LayerSpec::Kind::kConv;
          return s;
        };
        using K = LayerSpec::Kind;
        const std::int64_t OC = l.out.C;
        l.body = {sub(K::kConv, "conv1", OC, 3, l.stride, 1), sub(K::kBatchNorm, "bn1", 0, 0, 1, 0),
                  sub(K::kReLU, "relu1", 0, 0, 1, 0), sub(K::kConv, "conv2", OC, 3, 1, 1),
                  sub(K::kBatchNorm, "bn2", 0, 0, 1, 0)};
        if (l.stride != 1 || cur.C != OC)
          l.shortcut = {sub(K::kConv, "short.conv", OC, 1, l.stride, 0),
                        sub(K::kBatchNorm, "short.bn", 0, 0, 1, 0)};
        SampleShape at = cur;
        for (auto& s : l.body) {
          place(s, at);
          at = s.out;
        }
        l.out = at;
        at = cur;
        for (auto& s : l.shortcut) {
          place(s, at);
          at = s.out;
        }
        COHORT_CHECK(at == l.out, "a residual block's shortcut matches its body");
        break;
      }
      case LayerSpec::Kind::kMaxPool:
      case LayerSpec::Kind::kAvgPool:
        if (cur.H < l.kernel || cur.W < l.kernel)
          bad_spec(spec, l.name + " kernel " + std::to_string(l.kernel) +
                             " is larger than its input " + cur.str());
        l.out = {cur.C, (cur.H - l.kernel) / l.stride + 1, (cur.W - l.kernel) / l.stride + 1};
        break;
      case LayerSpec::Kind::kFlatten:
        l.out = {cur.numel(), 1, 1};
        break;
      case LayerSpec::Kind::kReLU:
      case LayerSpec::Kind::kDropout:
        l.out = cur;
        break;
    }
    // Sizes in double, so that a spec cannot wrap them around: every layer's output per sample
    // and the parameters so far must stay allocatable.
    const double activation = double(l.out.C) * double(l.out.H) * double(l.out.W);
    if (activation > double(kMaxActivation))
      bad_spec(spec, l.name + " outputs " + std::to_string(static_cast<long long>(activation)) +
                         " values per sample, more than " + std::to_string(kMaxActivation));
  };
  SampleShape cur = input;
  int counts[10] = {};
  for (auto& l : list) {
    const int kind = static_cast<int>(l.kind);
    static const char* kNames[] = {"fc",      "relu",    "conv", "maxpool", "avgpool",
                                   "flatten", "dropout", "bn",   "gap",     "res"};
    static_assert(std::size(kNames) == std::size(counts));
    l.name = kNames[kind] + std::to_string(++counts[kind]);
    place(l, cur);
    cur = l.out;
  }
  if (list.empty() || list.back().kind != LayerSpec::Kind::kLinear)
    bad_spec(spec, "the last layer must be linear(CLASSES)");
  return Model(std::make_shared<LayerList>(spec_in, std::move(layout), input, cur.C,
                                           std::move(list), std::move(stats)));
}

bool Model::has_batchnorm() const { return !batchnorm_layers().empty(); }

std::vector<const LayerSpec*> Model::batchnorm_layers() const {
  std::vector<const LayerSpec*> out;
  visit(layers(), [&](const LayerSpec& l) {
    if (l.kind == LayerSpec::Kind::kBatchNorm) out.push_back(&l);
  });
  return out;
}

void Model::init_stats(float* stats) const {
  std::fill(stats, stats + stats_layout().total(), 0.0f);
  for (const LayerSpec* l : batchnorm_layers())
    std::fill(stats + l->running_var, stats + l->running_var + l->in.C, 1.0f);
}

bool LayerList::has_dropout() const {
  for (const auto& l : layers_)
    if (l.kind == LayerSpec::Kind::kDropout) return true;
  return false;
}

LeafRule LayerList::leaf_rule(Precision precision) const {
  bool bn = false;
  visit(layers_, [&](const LayerSpec& l) { bn = bn || l.kind == LayerSpec::Kind::kBatchNorm; });
  // The leaf's rows are the statistics' sample.
  if (bn) return {kBatchNormMicroBatch, /*exact=*/true};
  if (!contains_conv(layers_)) return {kLinearMicroBatch, false};
  if (precision != Precision::kBf16) return {kConvMicroBatch, false};
  std::int64_t largest = input().numel();  // values a row, of any layer's output
  for (const LayerSpec& l : layers_) largest = std::max(largest, l.out.numel());
  const auto bytes = static_cast<std::size_t>(largest) * sizeof(std::uint16_t) * kConvMicroBatch;
  return {bytes > kConvLeafBytes ? kConvMicroBatch / 2 : kConvMicroBatch, false};
}

std::vector<StateTensor> LayerList::state_dict() const { return layer_state_dict(spec(), layers_); }

std::unique_ptr<Executor> LayerList::executor(const Model& model, bool blocked_layouts,
                                              Precision precision) const {
  return layer_executor(model, blocked_layouts, precision);
}

std::vector<std::pair<std::size_t, std::size_t>> LayerList::norm_and_bias_ranges() const {
  std::vector<std::pair<std::size_t, std::size_t>> out;
  visit(layers_, [&](const LayerSpec& l) {
    const auto C = static_cast<std::size_t>(l.out.C);
    if (l.kind == LayerSpec::Kind::kBatchNorm) out.push_back({l.weight, l.weight + C});
    if (l.kind == LayerSpec::Kind::kBatchNorm || l.kind == LayerSpec::Kind::kLinear ||
        (l.kind == LayerSpec::Kind::kConv && l.has_bias))
      out.push_back({l.bias, l.bias + C});
  });
  std::sort(out.begin(), out.end());
  return out;
}

double LayerList::forward_flops_per_sample() const {
  double f = 0;
  visit(layers_, [&](const LayerSpec& l) {
    if (l.kind == LayerSpec::Kind::kLinear) f += 2.0 * double(l.in.C) * double(l.out.C);
    if (l.kind == LayerSpec::Kind::kConv)
      f += 2.0 * double(l.out.numel()) * double(l.in.C * l.kernel * l.kernel);
  });
  return f;
}

void LayerList::init(float* params, std::uint64_t seed) const {
  for (std::size_t i = 0; i < layout().total(); ++i) params[i] = 0.0f;
  // The stream of a tensor is keyed by its index in the layout (bn's constant tensors take an
  // index too), so a tensor's values depend only on the seed and its index, and a model without
  // nobias convs and bn layers draws each tensor as PyTorch's order numbers it.
  std::uint64_t tensor = 0;
  visit(layers_, [&](const LayerSpec& l) {
    if (l.kind == LayerSpec::Kind::kBatchNorm) {
      std::fill(params + l.weight, params + l.weight + l.out.C, 1.0f);  // scale 1, shift 0
      tensor += 2;
      return;
    }
    if (l.kind != LayerSpec::Kind::kLinear && l.kind != LayerSpec::Kind::kConv) return;
    const std::int64_t fan_in =
        l.kind == LayerSpec::Kind::kConv ? l.in.C * l.kernel * l.kernel : l.in.C;
    const float bound = 1.0f / std::sqrt(static_cast<float>(fan_in));
    const std::size_t weights = static_cast<std::size_t>(l.out.C * fan_in);
    // Drawn in PyTorch's order (OC, then IC, KH, KW) and stored where the layout keeps them.
    for (const bool is_weight : {true, false}) {
      if (!is_weight && !l.has_bias) continue;  // a nobias conv: no tensor, no stream
      const std::size_t offset = is_weight ? l.weight : l.bias;
      const std::size_t count = is_weight ? weights : std::size_t(l.out.C);
      Rng rng({seed, 0x1417ull /* purpose: init */, tensor++});
      const bool transposed = is_weight && l.kind == LayerSpec::Kind::kLinear;
      for (std::size_t j = 0; j < count; ++j)
        params[offset + (transposed ? transposed_index(l, j) : j)] = rng.uniform(-bound, bound);
    }
  });
}

void LayerList::to_canonical(const float* stored, float* canonical) const {
  std::copy(stored, stored + layout().total(), canonical);
  visit(layers_, [&](const LayerSpec& l) {
    if (l.kind == LayerSpec::Kind::kLinear)
      for (std::size_t j = 0; j < static_cast<std::size_t>(l.out.C * l.in.C); ++j)
        canonical[l.weight + j] = stored[l.weight + transposed_index(l, j)];
  });
}

void LayerList::from_canonical(const float* canonical, float* stored) const {
  std::copy(canonical, canonical + layout().total(), stored);
  visit(layers_, [&](const LayerSpec& l) {
    if (l.kind == LayerSpec::Kind::kLinear)
      for (std::size_t j = 0; j < static_cast<std::size_t>(l.out.C * l.in.C); ++j)
        stored[l.weight + transposed_index(l, j)] = canonical[l.weight + j];
  });
}

}  // namespace cohort::nn
