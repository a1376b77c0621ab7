// Model spec parsing, parameter layout and initialisation.
#include "cohort/nn/model.hpp"

#include <charconv>
#include <cmath>

#include "cohort/core/error.hpp"
#include "cohort/core/rng.hpp"

namespace cohort::nn {

namespace {
[[noreturn]] void bad_spec(const std::string& spec, const std::string& why) {
  throw InputError("--model: expected 'mlp:IN-H1-...-OUT' (positive integers, at least two), "
                   "found '" + spec + "': " + why);
}
}  // namespace

Model Model::parse(const std::string& spec) {
  constexpr std::string_view kMlp = "mlp:";
  if (spec.rfind(kMlp, 0) != 0) bad_spec(spec, "unknown model family");
  std::vector<std::int64_t> sizes;
  std::string_view rest = std::string_view(spec).substr(kMlp.size());
  while (true) {
    auto dash = rest.find('-');
    std::string_view token = rest.substr(0, dash);
    std::int64_t v = 0;
    auto [ptr, ec] = std::from_chars(token.data(), token.data() + token.size(), v);
    if (ec != std::errc() || ptr != token.data() + token.size() || token.empty())
      bad_spec(spec, "'" + std::string(token) + "' is not an integer");
    if (v < 1 || v > (1 << 20)) bad_spec(spec, "size " + std::to_string(v) + " not in [1, 2^20]");
    sizes.push_back(v);
    if (dash == std::string_view::npos) break;
    rest = rest.substr(dash + 1);
  }
  if (sizes.size() < 2) bad_spec(spec, "only one size");

  Model m;
  m.spec_ = spec;
  m.input_features_ = sizes.front();
  m.num_classes_ = sizes.back();
  for (std::size_t i = 0; i + 1 < sizes.size(); ++i) {
    LayerSpec fc{.kind = LayerSpec::Kind::kLinear, .name = "fc" + std::to_string(i + 1),
                 .in = sizes[i], .out = sizes[i + 1]};
    fc.weight = m.layout_.add(fc.name + ".weight", Shape{{fc.out, fc.in}});  // (OC, IC)
    fc.bias = m.layout_.add(fc.name + ".bias", Shape{{fc.out}});             // (OC)
    m.layers_.push_back(fc);
    if (i + 2 < sizes.size())
      m.layers_.push_back({.kind = LayerSpec::Kind::kReLU, .name = "relu" + std::to_string(i + 1)});
  }
  return m;
}

double Model::forward_flops_per_sample() const {
  double f = 0;
  for (const auto& l : layers_)
    if (l.kind == LayerSpec::Kind::kLinear) f += 2.0 * static_cast<double>(l.in * l.out);
  return f;
}

void Model::init(float* params, std::uint64_t seed) const {
  for (std::size_t i = 0; i < layout_.total(); ++i) params[i] = 0.0f;
  std::uint64_t tensor = 0;
  for (const auto& l : layers_) {
    if (l.kind != LayerSpec::Kind::kLinear) continue;
    const float bound = 1.0f / std::sqrt(static_cast<float>(l.in));
    for (auto [offset, count] : {std::pair{l.weight, std::size_t(l.out * l.in)},
                                 std::pair{l.bias, std::size_t(l.out)}}) {
      Rng rng({seed, 0x1417ull /* purpose: init */, tensor++});
      for (std::size_t j = 0; j < count; ++j) params[offset + j] = rng.uniform(-bound, bound);
    }
  }
}

}  // namespace cohort::nn
