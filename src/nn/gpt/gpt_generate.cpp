// GptGenerator: one position at a time through every layer, with each layer's keys and values
// cached (see gpt.hpp).
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cmath>
#include <deque>
#include <numbers>
#include <vector>

#include "cohort/core/error.hpp"
#include "cohort/nn/gpt/gpt.hpp"
#include "cohort/nn/gpt/gpt_kernels.hpp"

namespace cohort::nn {

namespace {

// y = LayerNorm(x) * w (+ b) over C values: the plans' loop (gpt_kernels.hpp) on one row.
void layer_norm(const float* x, const float* w, const float* b, std::int64_t C, float* y) {
  float mean = 0, rstd = 0;
  layer_norm_forward(x, w, b, y, &mean, &rstd, 1, C, GptModel::kLayerNormEpsilon);
}

}  // namespace

struct GptGenerator::Impl {
  // y (O) = W (O, I) x (I) (+ b), a oneDNN inner product of one row on plain f32 memory.
  class MatVec {
   public:
    MatVec(const dnnl::engine& eng, std::int64_t in, std::int64_t out) {
      using dnnl::memory;
      const memory::desc src({1, in}, memory::data_type::f32, memory::format_tag::ab);
      const memory::desc weights({out, in}, memory::data_type::f32, memory::format_tag::ab);
      const memory::desc dst({1, out}, memory::data_type::f32, memory::format_tag::ab);
      const dnnl::inner_product_forward::primitive_desc pd(
          dnnl::inner_product_forward::desc(dnnl::prop_kind::forward_inference, src, weights, dst),
          eng);
      prim_ = dnnl::inner_product_forward(pd);
      x_ = memory(src, eng, DNNL_MEMORY_NONE);
      w_ = memory(weights, eng, DNNL_MEMORY_NONE);
      y_ = memory(dst, eng, DNNL_MEMORY_NONE);
    }
    void run(dnnl::stream& s, const float* weights, const float* src, float* dst,
             const float* bias = nullptr) {
      w_.set_data_handle(const_cast<float*>(weights));
      x_.set_data_handle(const_cast<float*>(src));
      y_.set_data_handle(dst);
      prim_.execute(s, {{DNNL_ARG_SRC, x_}, {DNNL_ARG_WEIGHTS, w_}, {DNNL_ARG_DST, y_}});
      if (!bias) return;
      s.wait();
      const auto out = static_cast<std::int64_t>(y_.get_desc().dims()[1]);
      for (std::int64_t o = 0; o < out; ++o) dst[o] += bias[o];
    }

   private:
    dnnl::inner_product_forward prim_;
    dnnl::memory x_, w_, y_;
  };

  const GptModel& model;
  const float* params;
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{eng};
  MatVec attn, attn_proj, fc, mlp_proj, head;
  std::vector<std::vector<float>> keys, values;  // per layer: (position, C)
  std::vector<float> x, h, qkv, y, a, f, logits, scores;
  std::deque<std::int32_t> context;  // the tokens at the cache's positions
  std::uint64_t run = 0;

  Impl(const GptModel& m, const float* p)
      : model(m),
        params(p),
        attn(eng, m.shape().embd, 3 * m.shape().embd),
        attn_proj(eng, m.shape().embd, m.shape().embd),
        fc(eng, m.shape().embd, 4 * m.shape().embd),
        mlp_proj(eng, 4 * m.shape().embd, m.shape().embd),
        head(eng, m.shape().embd, m.shape().padded_vocab()) {
    const auto C = static_cast<std::size_t>(m.shape().embd);
    keys.resize(static_cast<std::size_t>(m.shape().layers));
    values.resize(keys.size());
    x.resize(C);
    h.resize(C);
    qkv.resize(3 * C);
    y.resize(C);
    a.resize(C);
    f.resize(4 * C);
    logits.resize(static_cast<std::size_t>(m.shape().padded_vocab()));
    scores.resize(static_cast<std::size_t>(m.shape().block));
  }

  // Runs `token` at the next cache position; the logits after it.
  void step(std::int32_t token) {
    const GptShape& s = model.shape();
    const std::int64_t C = s.embd, H = s.heads, hs = s.head_size();
    const auto t = static_cast<std::int64_t>(keys[0].size() / static_cast<std::size_t>(C));
    const float* wte = params + model.wte() + static_cast<std::size_t>(token * C);
    const float* wpe = params + model.wpe() + static_cast<std::size_t>(t * C);
    for (std::int64_t c = 0; c < C; ++c) x[c] = wte[c] + wpe[c];
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    // A bias's weights, or none.
    auto bias = [&](std::size_t at) { return at == GptModel::kNoBias ? nullptr : params + at; };
    for (std::int64_t l = 0; l < s.layers; ++l) {
      const GptModel::BlockOffsets& o = model.block(l);
      auto& K = keys[static_cast<std::size_t>(l)];
      auto& V = values[static_cast<std::size_t>(l)];
      layer_norm(x.data(), params + o.ln_1, bias(o.ln_1_bias), C, h.data());
      attn.run(stream, params + o.c_attn, h.data(), qkv.data(), bias(o.c_attn_bias));
      K.insert(K.end(), qkv.begin() + C, qkv.begin() + 2 * C);
      V.insert(V.end(), qkv.begin() + 2 * C, qkv.end());
      for (std::int64_t hd = 0; hd < H; ++hd) {  // softmax(q k^T / sqrt(hs)) v over 0 .. t
        const float* q = qkv.data() + hd * hs;
        float mx = -INFINITY;
        for (std::int64_t j = 0; j <= t; ++j) {
          float d = 0;
          for (std::int64_t e = 0; e < hs; ++e)
            d += q[e] * K[static_cast<std::size_t>(j * C + hd * hs + e)];
          scores[static_cast<std::size_t>(j)] = d * scale;
          mx = std::max(mx, d * scale);
        }
        float sum = 0;
        for (std::int64_t j = 0; j <= t; ++j)
          sum += (scores[static_cast<std::size_t>(j)] =
                      std::exp(scores[static_cast<std::size_t>(j)] - mx));
        float* out = y.data() + hd * hs;
        std::fill(out, out + hs, 0.0f);
        for (std::int64_t j = 0; j <= t; ++j) {
          const float p = scores[static_cast<std::size_t>(j)] / sum;
          for (std::int64_t e = 0; e < hs; ++e)
            out[e] += p * V[static_cast<std::size_t>(j * C + hd * hs + e)];
        }
      }
      attn_proj.run(stream, params + o.attn_proj, y.data(), a.data(), bias(o.attn_proj_bias));
      for (std::int64_t c = 0; c < C; ++c) x[c] += a[c];
      layer_norm(x.data(), params + o.ln_2, bias(o.ln_2_bias), C, h.data());
      fc.run(stream, params + o.c_fc, h.data(), f.data(), bias(o.c_fc_bias));
      if (s.tanh_gelu) {
        constexpr float k = 0.79788456080286536f;  // sqrt(2 / pi)
        for (float& v : f) v = 0.5f * v * (1.0f + std::tanh(k * (v + 0.044715f * v * v * v)));
      } else {
        for (float& v : f) v = 0.5f * v * (1.0f + std::erf(v / std::numbers::sqrt2_v<float>));
      }
      mlp_proj.run(stream, params + o.mlp_proj, f.data(), a.data(), bias(o.mlp_proj_bias));
      for (std::int64_t c = 0; c < C; ++c) x[c] += a[c];
    }
    layer_norm(x.data(), params + model.ln_f(), bias(model.ln_f_bias()), C, h.data());
    head.run(stream, params + model.wte(), h.data(), logits.data());
    stream.wait();
    ++run;
  }
};

GptGenerator::GptGenerator(const GptModel& model, const float* params)
    : impl_(std::make_unique<Impl>(model, params)) {}
GptGenerator::~GptGenerator() = default;
GptGenerator::GptGenerator(GptGenerator&&) noexcept = default;
std::uint64_t GptGenerator::positions_run() const { return impl_->run; }

const float* GptGenerator::push(std::int32_t token) {
  Impl& g = *impl_;
  const std::int64_t T = g.model.shape().block;
  COHORT_CHECK(token >= 0 && token < g.model.shape().vocab, "a token of the vocabulary");
  if (static_cast<std::int64_t>(g.context.size()) == T) {
    // The window is full: restart the cache from its last T / 2 tokens, then add this one.
    while (static_cast<std::int64_t>(g.context.size()) > T / 2) g.context.pop_front();
    for (auto& k : g.keys) k.clear();
    for (auto& v : g.values) v.clear();
    for (const std::int32_t kept : g.context) g.step(kept);
  }
  g.context.push_back(token);
  g.step(token);
  return g.logits.data();
}

}  // namespace cohort::nn
