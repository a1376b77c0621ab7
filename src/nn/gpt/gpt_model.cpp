// GptModel: the spec, nanoGPT's parameter layout and names, GPT-2's initialisation.
#include <charconv>
#include <cmath>
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

GptModel GptModel::parse(const std::string& spec, std::int64_t vocab) {
  if (!is_gpt(spec)) refuse(spec, "expected gpt:LAYERS-HEADS-EMBD-BLOCK[-DROPOUT]");
  std::vector<std::string> fields;
  std::string rest = spec.substr(4);
  for (std::size_t at = 0;;) {
    const std::size_t dash = rest.find('-', at);
    fields.push_back(rest.substr(at, dash == std::string::npos ? dash : dash - at));
    if (dash == std::string::npos) break;
    at = dash + 1;
  }
  if (fields.size() != 4 && fields.size() != 5)
    refuse(spec, "expected gpt:LAYERS-HEADS-EMBD-BLOCK[-DROPOUT], found " +
                     std::to_string(fields.size()) + " fields");
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
  if (vocab < 1 || vocab > (std::int64_t{1} << 20))
    refuse(spec, "the vocabulary: expected 1 to 1048576 tokens, found " + std::to_string(vocab));
  const double C = double(s.embd);
  const double params = double(s.vocab + s.block) * C + double(s.layers) * (12 * C * C + 2 * C) + C;
  if (params > double(Model::kMaxParameters))
    refuse(spec, "expected at most " + std::to_string(Model::kMaxParameters) +
                     " parameters, found " + std::to_string(static_cast<std::int64_t>(params)));

  ParamLayout& L = m.layout_;
  const std::int64_t E = s.embd;
  m.wte_ = L.add("transformer.wte.weight", Shape{{s.vocab, E}});
  m.wpe_ = L.add("transformer.wpe.weight", Shape{{s.block, E}});
  for (std::int64_t i = 0; i < s.layers; ++i) {
    const std::string h = "transformer.h." + std::to_string(i) + ".";
    BlockOffsets b{};
    b.ln_1 = L.add(h + "ln_1.weight", Shape{{E}});
    b.c_attn = L.add(h + "attn.c_attn.weight", Shape{{3 * E, E}});
    b.attn_proj = L.add(h + "attn.c_proj.weight", Shape{{E, E}});
    b.ln_2 = L.add(h + "ln_2.weight", Shape{{E}});
    b.c_fc = L.add(h + "mlp.c_fc.weight", Shape{{4 * E, E}});
    b.mlp_proj = L.add(h + "mlp.c_proj.weight", Shape{{E, 4 * E}});
    m.blocks_.push_back(b);
  }
  m.ln_f_ = L.add("transformer.ln_f.weight", Shape{{E}});
  return m;
}

void GptModel::init(float* params, std::uint64_t seed) const {
  std::fill(params, params + layout_.total(), 0.0f);
  const double residual = 0.02 / std::sqrt(2.0 * double(shape_.layers));
  std::uint64_t index = 0;
  for (const ParamLayout::Entry& e : layout_.entries()) {
    Rng rng({seed, 0x1417ull /* purpose: init */, index++});
    float* p = params + e.offset;
    const std::size_t n = e.shape.numel();
    if (e.shape.dims.size() == 1) {  // a LayerNorm weight
      std::fill(p, p + n, 1.0f);
      continue;
    }
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
  const double C = double(shape_.embd), T = double(shape_.block), V = double(shape_.vocab);
  // Per layer: QKV 6C^2, attention scores and values 2 x 2 C T / 2 (the causal half), output
  // projection 2C^2, MLP 16C^2; then the head 2CV.
  return double(shape_.layers) * (24 * C * C + 2 * C * T) + 2 * C * V;
}

}  // namespace cohort::nn
