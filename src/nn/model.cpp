// Model spec parsing, shape inference, parameter layout and initialisation.
#include "cohort/nn/model.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "cohort/core/error.hpp"
#include "cohort/core/rng.hpp"

namespace cohort::nn {

namespace {

[[noreturn]] void bad_spec(const std::string& spec, const std::string& why) {
  throw InputError(
      "--model: expected 'mlp:IN-H1-...-OUT', 'cnn' or a layer list such as "
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

}  // namespace

std::string SampleShape::str() const {
  if (flat()) return "(" + std::to_string(C) + ")";
  return "(" + std::to_string(C) + ", " + std::to_string(H) + ", " + std::to_string(W) + ")";
}

Model Model::parse(const std::string& spec_in, SampleShape input) {
  const std::string spec = spec_in == "cnn" ? kCnnPreset : spec_in;
  Model m;
  m.spec_ = spec_in;
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
        need(2, 4);
        l.kind = LayerSpec::Kind::kConv;
        l.out.C = arg(0, 0, 1, 1 << 14);
        l.kernel = arg(1, 0, 1, 64);
        l.stride = arg(2, 1, 1, 64);
        l.pad = arg(3, 0, 0, 64);
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
      } else if (name == "relu" || name == "flatten") {
        need(0, 0);
        l.kind = name == "relu" ? LayerSpec::Kind::kReLU : LayerSpec::Kind::kFlatten;
      } else {
        bad_spec(spec, "unknown layer '" + std::string(name) + "'");
      }
      list.push_back(l);
    }
  }

  // Shapes, names and parameters, layer by layer.
  m.input_ = input;
  SampleShape cur = input;
  int counts[7] = {};
  double parameters = 0;
  for (auto& l : list) {
    l.in = cur;
    const int kind = static_cast<int>(l.kind);
    static const char* kNames[] = {"fc",      "relu",    "conv",   "maxpool",
                                   "avgpool", "flatten", "dropout"};
    l.name = kNames[kind] + std::to_string(++counts[kind]);
    switch (l.kind) {
      case LayerSpec::Kind::kLinear:
        if (!cur.flat())
          bad_spec(spec, l.name + " needs a flat input, found " + cur.str() + " (add flatten)");
        // Stored (IC, OC), i.e. transposed from PyTorch's (OC, IC): oneDNN's inner product then
        // runs its forward as a plain GEMM (measured 113 against 86 GFLOP/s at 128 rows, see
        // docs/architecture.md). Checkpoints hold the canonical order (to_canonical).
        l.weight = m.layout_.add(l.name + ".weight", Shape{{cur.C, l.out.C}});
        l.bias = m.layout_.add(l.name + ".bias", Shape{{l.out.C}});  // (OC)
        break;
      case LayerSpec::Kind::kConv: {
        if (cur.H == 1 && cur.W == 1 && l.kernel > 1)
          bad_spec(spec, l.name + " needs an image input (C, H, W), found " + cur.str());
        if (cur.H + 2 * l.pad < l.kernel || cur.W + 2 * l.pad < l.kernel)
          bad_spec(spec, l.name + " kernel " + std::to_string(l.kernel) +
                             " is larger than its input " + cur.str());
        l.out = {l.out.C, (cur.H + 2 * l.pad - l.kernel) / l.stride + 1,
                 (cur.W + 2 * l.pad - l.kernel) / l.stride + 1};
        l.weight = m.layout_.add(l.name + ".weight",
                                 Shape{{l.out.C, cur.C, l.kernel, l.kernel}});  // (OC, IC, KH, KW)
        l.bias = m.layout_.add(l.name + ".bias", Shape{{l.out.C}});
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
    if (l.kind == LayerSpec::Kind::kLinear || l.kind == LayerSpec::Kind::kConv) {
      parameters += double(l.out.C) * double(l.in.C) * double(l.kernel ? l.kernel : 1) *
                        double(l.kernel ? l.kernel : 1) +
                    double(l.out.C);
      if (parameters > double(kMaxParameters))
        bad_spec(spec,
                 "more than " + std::to_string(kMaxParameters) + " parameters up to " + l.name);
    }
    cur = l.out;
  }
  if (list.empty() || list.back().kind != LayerSpec::Kind::kLinear)
    bad_spec(spec, "the last layer must be linear(CLASSES)");
  m.num_classes_ = cur.C;
  m.layers_ = std::move(list);
  return m;
}

bool Model::has_dropout() const {
  for (const auto& l : layers_)
    if (l.kind == LayerSpec::Kind::kDropout) return true;
  return false;
}

double Model::forward_flops_per_sample() const {
  double f = 0;
  for (const auto& l : layers_) {
    if (l.kind == LayerSpec::Kind::kLinear) f += 2.0 * double(l.in.C) * double(l.out.C);
    if (l.kind == LayerSpec::Kind::kConv)
      f += 2.0 * double(l.out.numel()) * double(l.in.C * l.kernel * l.kernel);
  }
  return f;
}

void Model::init(float* params, std::uint64_t seed) const {
  for (std::size_t i = 0; i < layout_.total(); ++i) params[i] = 0.0f;
  std::uint64_t tensor = 0;
  for (const auto& l : layers_) {
    if (!l.has_params()) continue;
    const std::int64_t fan_in =
        l.kind == LayerSpec::Kind::kConv ? l.in.C * l.kernel * l.kernel : l.in.C;
    const float bound = 1.0f / std::sqrt(static_cast<float>(fan_in));
    const std::size_t weights = static_cast<std::size_t>(l.out.C * fan_in);
    // Drawn in PyTorch's order (OC, then IC, KH, KW) and stored where the layout keeps them.
    for (auto [offset, count] :
         {std::pair{l.weight, weights}, std::pair{l.bias, std::size_t(l.out.C)}}) {
      Rng rng({seed, 0x1417ull /* purpose: init */, tensor++});
      const bool transposed = offset == l.weight && l.kind == LayerSpec::Kind::kLinear;
      for (std::size_t j = 0; j < count; ++j)
        params[offset + (transposed ? transposed_index(l, j) : j)] = rng.uniform(-bound, bound);
    }
  }
}

std::size_t Model::transposed_index(const LayerSpec& l, std::size_t j) {
  const auto OC = static_cast<std::size_t>(l.out.C), IC = static_cast<std::size_t>(l.in.C);
  const std::size_t o = j / IC, i = j % IC;  // j: (o, i) in (OC, IC) order
  return i * OC + o;
}

void Model::to_canonical(const float* stored, float* canonical) const {
  std::copy(stored, stored + layout_.total(), canonical);
  for (const auto& l : layers_)
    if (l.kind == LayerSpec::Kind::kLinear)
      for (std::size_t j = 0; j < static_cast<std::size_t>(l.out.C * l.in.C); ++j)
        canonical[l.weight + j] = stored[l.weight + transposed_index(l, j)];
}

void Model::from_canonical(const float* canonical, float* stored) const {
  std::copy(canonical, canonical + layout_.total(), stored);
  for (const auto& l : layers_)
    if (l.kind == LayerSpec::Kind::kLinear)
      for (std::size_t j = 0; j < static_cast<std::size_t>(l.out.C * l.in.C); ++j)
        stored[l.weight + transposed_index(l, j)] = canonical[l.weight + j];
}

}  // namespace cohort::nn
