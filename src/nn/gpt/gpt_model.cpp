// GptModel: the spec, nanoGPT's parameter layout and names, GPT-2's initialisation.
#include <charconv>
#include <cmath>
#include <iterator>
#include <numbers>

#include "cohort/core/error.hpp"
#include "cohort/core/rng.hpp"
#include "cohort/nn/gpt/gpt.hpp"
#include "cohort/nn/model.hpp"

namespace cohort::nn {

namespace {

constexpr const char* kPrefix = "gpt:";

[[noreturn]] void refuse(const std::string& spec, const std::string& what) {
  throw InputError("--model '" + spec + "': " + what);
}

// A standard normal draw (Box-Muller on two of the stream's uniforms), in double and rounded
// once: the same values on every machine with an IEEE libm.
float normal(Rng& rng, double stddev) {
  const double u1 = 1.0 - static_cast<double>(rng.next_unit());  // (0, 1]
  const double u2 = static_cast<double>(rng.next_unit());
  return static_cast<float>(stddev * std::sqrt(-2.0 * std::log(u1)) *
                            std::cos(2.0 * std::numbers::pi * u2));
}

}  // namespace

bool GptModel::is_gpt(const std::string& spec) { return spec.rfind(kPrefix, 0) == 0; }

namespace {

// GPT-2's sizes and architecture by name: what "gpt:NAME" stands for.
struct Preset {
  const char* name;
  const char* sizes;
};
constexpr Preset kPresets[] = {{"124M", "12-12-768-1024"}, {"350M", "24-16-1024-1024"}};
constexpr const char* kPresetOptions[] = {"bias", "gelu=tanh", "pad=128"};

std::vector<std::string> split(const std::string& text, char by) {
  std::vector<std::string> out;
  for (std::size_t at = 0;;) {
    const std::size_t next = text.find(by, at);
    out.push_back(text.substr(at, next == std::string::npos ? next : next - at));
    if (next == std::string::npos) return out;
    at = next + 1;
  }
}

}  // namespace

GptModel GptModel::parse(const std::string& spec, std::int64_t vocab) {
  constexpr const char* kForm = "gpt:LAYERS-HEADS-EMBD-BLOCK[-DROPOUT][,OPTION...] or gpt:124M";
  if (!is_gpt(spec)) refuse(spec, std::string("expected ") + kForm);
  std::vector<std::string> options = split(spec.substr(4), ',');
  std::vector<std::string> fields = split(options.front(), '-');
  options.erase(options.begin());
  for (const Preset& p : kPresets)
    if (fields.front() == p.name) {
      fields.erase(fields.begin());
      const std::vector<std::string> sizes = split(p.sizes, '-');
      fields.insert(fields.begin(), sizes.begin(), sizes.end());
      options.insert(options.begin(), std::begin(kPresetOptions), std::end(kPresetOptions));
    }
  if (fields.size() != 4 && fields.size() != 5)
    refuse(spec, std::string("expected ") + kForm + ", found " + std::to_string(fields.size()) +
                     " sizes");
  const char* names[] = {"LAYERS", "HEADS", "EMBD", "BLOCK"};
  std::int64_t v[4];
  for (int i = 0; i < 4; ++i) {
    const std::string& f = fields[static_cast<std::size_t>(i)];
    const auto [end, ec] = std::from_chars(f.data(), f.data() + f.size(), v[i]);
    if (ec != std::errc() || end != f.data() + f.size() || v[i] < 1 || v[i] > (1 << 20))
      refuse(spec,
             std::string(names[i]) + ": expected an integer from 1 to 1048576, found '" + f + "'");
  }
  GptModel m;
  m.spec_ = spec;
  GptShape& s = m.shape_;
  s.layers = v[0];
  s.heads = v[1];
  s.embd = v[2];
  s.block = v[3];
  s.vocab = vocab;
  if (s.embd % s.heads != 0)
    refuse(spec, "HEADS: expected a divisor of EMBD " + std::to_string(s.embd) + ", found " +
                     std::to_string(s.heads));
  if (fields.size() == 5) {
    const std::string& f = fields[4];
    double p = -1;
    const auto [end, ec] = std::from_chars(f.data(), f.data() + f.size(), p);
    if (ec != std::errc() || end != f.data() + f.size() || !(p >= 0 && p < 1))
      refuse(spec, "DROPOUT: expected a probability in [0, 1), found '" + f + "'");
    s.dropout = static_cast<float>(p);
  }
  for (const std::string& o : options) {
    if (o == "bias") {
      s.bias = true;
    } else if (o == "gelu=tanh" || o == "gelu=erf") {
      s.tanh_gelu = o == "gelu=tanh";
    } else if (o.starts_with("pad=")) {
      std::int64_t k = 0;
      const char* first = o.data() + 4;
      const auto [end, ec] = std::from_chars(first, o.data() + o.size(), k);
      if (ec != std::errc() || end != o.data() + o.size() || k < 1 || k > 4096)
        refuse(spec, "pad: expected a multiple from 1 to 4096, found '" + o.substr(4) + "'");
      s.vocab_multiple = k;
    } else {
      refuse(spec,
             "an option: expected bias, gelu=tanh, gelu=erf or pad=MULTIPLE, found '" + o + "'");
    }
  }
  if (vocab < 1 || vocab > (std::int64_t{1} << 20))
    refuse(spec, "the vocabulary: expected 1 to 1048576 tokens, found " + std::to_string(vocab));
  const double C = double(s.embd);
  const double biases = s.bias ? double(s.layers) * 11 * C + C : 0;
  const double params =
      double(s.padded_vocab() + s.block) * C + double(s.layers) * (12 * C * C + 2 * C) + C + biases;
  if (params > double(Model::kMaxParameters))
    refuse(spec, "expected at most " + std::to_string(Model::kMaxParameters) +
                     " parameters, found " + std::to_string(static_cast<std::int64_t>(params)));

  ParamLayout& L = m.layout_;
  const std::int64_t E = s.embd;
  // A module's weight, then its bias where the model has them.
  auto module = [&](const std::string& name, Shape weight, std::int64_t outputs,
                    std::size_t& bias) {
    const std::size_t at = L.add(name + ".weight", std::move(weight));
    if (s.bias) bias = L.add(name + ".bias", Shape{{outputs}});
    return at;
  };
  m.wte_ = L.add("transformer.wte.weight", Shape{{s.padded_vocab(), E}});
  m.wpe_ = L.add("transformer.wpe.weight", Shape{{s.block, E}});
  for (std::int64_t i = 0; i < s.layers; ++i) {
    const std::string h = "transformer.h." + std::to_string(i) + ".";
    BlockOffsets b{};
    b.ln_1 = module(h + "ln_1", Shape{{E}}, E, b.ln_1_bias);
    b.c_attn = module(h + "attn.c_attn", Shape{{3 * E, E}}, 3 * E, b.c_attn_bias);
    b.attn_proj = module(h + "attn.c_proj", Shape{{E, E}}, E, b.attn_proj_bias);
    b.ln_2 = module(h + "ln_2", Shape{{E}}, E, b.ln_2_bias);
    b.c_fc = module(h + "mlp.c_fc", Shape{{4 * E, E}}, 4 * E, b.c_fc_bias);
    b.mlp_proj = module(h + "mlp.c_proj", Shape{{E, 4 * E}}, E, b.mlp_proj_bias);
    m.blocks_.push_back(b);
  }
  m.ln_f_ = module("transformer.ln_f", Shape{{E}}, E, m.ln_f_bias_);
  return m;
}

void GptModel::init(float* params, std::uint64_t seed) const {
  std::fill(params, params + layout_.total(), 0.0f);
  const double residual = 0.02 / std::sqrt(2.0 * double(shape_.layers));
  std::uint64_t index = 0;
  for (const ParamLayout::Entry& e : layout_.entries()) {
    Rng rng({seed, 0x1417ull /* purpose: init */, index++});
    float* p = params + e.offset;
    std::size_t n = e.shape.numel();
    if (e.name.ends_with(".bias")) continue;  // 0
    if (e.shape.dims.size() == 1) {           // a LayerNorm weight
      std::fill(p, p + n, 1.0f);
      continue;
    }
    if (e.offset == wte_) n = static_cast<std::size_t>(shape_.vocab * shape_.embd);  // not padding
    const bool proj = e.name.ends_with("c_proj.weight");
    for (std::size_t j = 0; j < n; ++j) p[j] = normal(rng, proj ? residual : 0.02);
  }
}

std::vector<std::pair<std::size_t, std::size_t>> GptModel::norm_ranges() const {
  std::vector<std::pair<std::size_t, std::size_t>> ranges;
  for (const ParamLayout::Entry& e : layout_.entries())
    if (e.shape.dims.size() == 1) ranges.emplace_back(e.offset, e.offset + e.shape.numel());
  return ranges;
}

double GptModel::forward_flops_per_token() const {
  const double C = double(shape_.embd), T = double(shape_.block), V = double(shape_.padded_vocab());
  // Per layer: QKV 6C^2, attention scores and values 2 x 2 C T / 2 (the causal half), output
  // projection 2C^2, MLP 16C^2; then the head 2CV.
  return double(shape_.layers) * (24 * C * C + 2 * C * T) + 2 * C * V;
}

}  // namespace cohort::nn
