// Building a GptNet's plan for N windows: oneDNN 2.6 primitives (inner products for the linear
// layers and the tied head, batched matmuls over strided views for attention, layer
// normalization, softmax forward, the erf GELU) and cohort's loops where oneDNN 2.6 has no
// primitive (the embedding gather and its scatter-add, the causal mask, dropout, residual adds,
// the conversions between f32 and bf16) or only a reference one on AVX2 (the causal softmax's
// backward, nn/gpt_kernels.hpp), as the two step lists of a detail::Plan.
//
// Rows: the M = N x block positions, (N, T, C) row-major. The residual stream x is f32 in both
// precisions (as PyTorch's autocast keeps it); LayerNorm runs in f32 (oneDNN 2.6 gives it one
// data type for source and destination) and its output is converted for the next inner product.
// In bf16 the inner products' and matmuls' operands are bf16, their outputs bf16 where a bf16
// consumer follows (q, k, v; the GELU's input and output; attention's output) and f32 where an
// f32 one does (the residual branches, the logits, the attention scores); weight gradients are f32.
//
// Attention on views of qkv (M, 3C): q, k and v of head h are the (T, hs) blocks at columns
// h*hs, C + h*hs and 2C + h*hs of each window, so the matmuls read them through strides, k
// transposed by swapping two strides, and write the heads' outputs into y (M, C) the same way.
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <optional>

#include "cohort/core/error.hpp"
#include "cohort/nn/gpt.hpp"
#include "cohort/nn/gpt_kernels.hpp"
#include "gpt_plan.hpp"

namespace cohort::nn::detail {

namespace {

using dnnl::memory;
using Dt = memory::data_type;
using Tag = memory::format_tag;
using Dims = memory::dims;

// Which dropout stream a mask draws from (tests/reference/gpt_reference.hpp draws the same).
std::size_t dropout_layer(std::int64_t block, int which) {
  return 1 + 3 * static_cast<std::size_t>(block) + static_cast<std::size_t>(which);
}

class GptPlanBuilder {
 public:
  GptPlanBuilder(const GptPlanRequest& r, Plan& p)
      : m_(*r.model),
        s_(m_.shape()),
        key_(r.key),
        windows_(r.windows),
        p_(p),
        eng_(*r.engine),
        act_(r.precision == Precision::kBf16 ? Dt::bf16 : Dt::f32),
        N_(r.N),
        T_(s_.block),
        C_(s_.embd),
        H_(s_.heads),
        hs_(s_.head_size()),
        V_(s_.vocab),
        M_(r.N * s_.block),
        training_(r.training),
        drop_(r.training && s_.dropout > 0) {}

  // The steps, then one scratchpad for the plan, as large as the largest primitive's need.
  void build() {
    build_steps();
    p_.scratchpad = AlignedBuffer<std::uint8_t>(scratch_bytes_);
    for (auto* list : {&p_.forward, &p_.backward})
      for (Exec& e : *list)
        if (!e.custom && e.scratchpad_md.get_size() != 0)
          e.args.insert({DNNL_ARG_SCRATCHPAD, memory(e.scratchpad_md, eng_, p_.scratchpad.data())});
  }
  const std::string& where() const { return where_; }

 private:
  void build_steps();
  struct LnSaved {
    memory src, mean, var, scale;  // scale: the weight as f32
    std::size_t weight = 0;
  };
  struct BlockSaved {
    LnSaved ln1, ln2;
    memory h1, qkv, p, p_used, y, x_mid, h2, f, g;
  };

  bool half() const { return act_ == Dt::bf16; }
  std::size_t elem() const { return half() ? sizeof(bf16) : sizeof(float); }
  float* buffer(std::size_t bytes) {
    p_.buffers.emplace_back((bytes + sizeof(float) - 1) / sizeof(float));
    return p_.buffers.back().data();
  }
  memory plain(Dims dims, Dt dt) {
    memory::desc md(dims, dt, dims.size() == 1 ? Tag::a : dims.size() == 2 ? Tag::ab : Tag::abcd);
    return memory(md, eng_, buffer(md.get_size()));
  }
  memory plain_layout(const memory::desc& md) { return memory(md, eng_, buffer(md.get_size())); }
  // temp() for a buffer of a layout oneDNN chose.
  memory temp(const std::string& role, const Dims& dims, Dt dt, const memory::desc& md) {
    std::string key = role + ":layout:" + std::to_string(static_cast<int>(dt));
    for (const auto d : dims) key += "," + std::to_string(d);
    auto [it, fresh] = temps_.try_emplace(key + ":" + std::to_string(md.get_size()));
    if (fresh) it->second = plain_layout(md);
    return it->second;
  }
  // A buffer that steps of different layers reuse: what one layer's steps write and read before
  // the next layer's steps run (backward's gradients, forward's intermediate results that
  // backward does not read, and everything in an inference plan). One per role, dims and type.
  memory temp(const std::string& role, const Dims& dims, Dt dt) {
    std::string key = role + ":" + std::to_string(static_cast<int>(dt));
    for (const auto d : dims) key += "," + std::to_string(d);
    auto [it, fresh] = temps_.try_emplace(key);
    if (fresh) it->second = plain(dims, dt);
    return it->second;
  }
  // A buffer backward reads (its own per layer), or in an inference plan a reused one.
  memory kept(const std::string& role, const Dims& dims, Dt dt) {
    return training_ ? plain(dims, dt) : temp(role, dims, dt);
  }
  // A strided view of `base`'s buffer, `offset` elements in.
  memory view(const memory& base, Dims dims, Dims strides, std::int64_t offset) {
    memory::desc md(dims, base.get_desc().data_type(), strides);
    return memory(md, eng_, static_cast<char*>(base.get_data_handle()) + offset * elem());
  }
  memory param(Dims dims, std::size_t offset) {
    memory m(memory::desc(dims, act_, dims.size() == 1 ? Tag::a : Tag::ab), eng_, DNNL_MEMORY_NONE);
    p_.params.push_back({m, offset});
    return m;
  }
  memory grad(Dims dims, std::size_t offset) {
    memory m(memory::desc(dims, Dt::f32, dims.size() == 1 ? Tag::a : Tag::ab), eng_,
             DNNL_MEMORY_NONE);
    p_.grads.push_back({m, offset});
    return m;
  }
  dnnl::primitive_attr attr(float scale = 1.0f) const {
    dnnl::primitive_attr a;
    a.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (scale != 1.0f) a.set_output_scales(0, {scale});
    return a;
  }
  void add(std::vector<Exec>& list, dnnl::primitive prim, const memory::desc& scratch,
           std::unordered_map<int, memory> args, Phase phase) {
    scratch_bytes_ = std::max(scratch_bytes_, scratch.get_size());
    list.push_back({std::move(prim), std::move(args), phase, scratch, {}, where_});
  }
  void custom(std::vector<Exec>& list, std::function<void()> f) {
    list.push_back({{}, {}, Phase::kOther, {}, std::move(f), where_});
  }
  // `to` = `from` converted (f32 <-> bf16) or copied, element for element.
  void convert(std::vector<Exec>& list, const memory& from, const memory& to) {
    dnnl::reorder::primitive_desc pd(eng_, from.get_desc(), eng_, to.get_desc(), attr());
    add(list, dnnl::reorder(pd), pd.scratchpad_desc(), {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}},
        Phase::kOther);
  }
  // The plain f32 (M, C) memory `x` in the activations' type: itself in f32.
  memory as_act(std::vector<Exec>& list, const memory& x, Dims dims, const std::string& role) {
    if (!half()) return x;
    memory out = kept(role, dims, act_);
    convert(list, x, out);
    return out;
  }
  // The dropout mask of `layer` (count values), drawn by a step appended to `list` into a buffer
  // that the next mask of that size reuses: forward draws it where it applies it, backward draws
  // it again where it needs it (the keyed stream gives the same values), so no mask is kept.
  float* mask(std::vector<Exec>& list, std::size_t count, std::size_t layer) {
    float* m = static_cast<float*>(
        temp("mask", {static_cast<std::int64_t>(count)}, Dt::f32).get_data_handle());
    const StreamKey* key = key_;
    const float p = s_.dropout;
    custom(list, [=] { dropout_mask(*key, layer, p, count, m); });
    return m;
  }

  LnSaved ln_forward(const memory& x, std::size_t weight, const memory& dst);
  void ln_backward(const LnSaved& s, const memory& diff_dst, const memory& diff_src);
  dnnl::inner_product_forward::primitive_desc linear_pd(const memory::desc& src, std::int64_t O,
                                                        const memory::desc& dst);
  // dst = scale x src weights, a batched matmul on (strided) views, appended to `list`.
  void add_matmul(std::vector<Exec>& list, const memory& src, const memory& weights,
                  const memory& dst, float scale = 1.0f) {
    const dnnl::matmul::primitive_desc pd(
        dnnl::matmul::desc(src.get_desc(), weights.get_desc(), dst.get_desc()), attr(scale), eng_);
    add(list, dnnl::matmul(pd), pd.scratchpad_desc(),
        {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, weights}, {DNNL_ARG_DST, dst}}, Phase::kMatmul);
  }
  // dst (M, O) = src (M, I) W^T with W at `weight` in the parameters.
  void linear(const memory& src, std::size_t weight, std::int64_t O, const memory& dst);
  // diff_src from diff_dst; the weight's gradient (overwritten) from src and diff_dst.
  void linear_backward(const memory& src, std::size_t weight, std::int64_t O,
                       const memory& diff_dst, const memory& diff_src);
  BlockSaved block_forward(std::int64_t l, const memory& x);
  void block_backward(std::int64_t l, const BlockSaved& b, const memory& dx);

  const GptModel& m_;
  const GptShape& s_;
  const StreamKey* key_;
  const std::int32_t* const* windows_;
  Plan& p_;
  const dnnl::engine& eng_;
  const Dt act_;
  const std::int64_t N_, T_, C_, H_, hs_, V_, M_;
  const bool training_, drop_;
  std::size_t scratch_bytes_ = 0;
  std::string where_;
  std::optional<dnnl::layer_normalization_forward::primitive_desc> ln_fwd_;
  std::optional<dnnl::layer_normalization_backward::primitive_desc> ln_bwd_;
  std::map<std::string, memory> temps_;
  std::map<std::size_t, memory> blocked_weights_;  // by offset: forward's copy in its layout
};

GptPlanBuilder::LnSaved GptPlanBuilder::ln_forward(const memory& x, std::size_t weight,
                                                   const memory& dst) {
  using namespace dnnl;
  const memory::desc data({M_, C_}, Dt::f32, Tag::ab), stat({M_}, Dt::f32, Tag::a);
  if (!ln_fwd_) {
    ln_fwd_.emplace(layer_normalization_forward::desc(prop_kind::forward_training, data, stat,
                                                      GptModel::kLayerNormEpsilon,
                                                      normalization_flags::use_scale),
                    attr(), eng_);
    if (training_)
      ln_bwd_.emplace(layer_normalization_backward::desc(prop_kind::backward, data, data, stat,
                                                         GptModel::kLayerNormEpsilon,
                                                         normalization_flags::use_scale),
                      attr(), eng_, *ln_fwd_);
  }
  LnSaved s;
  s.src = x;
  s.weight = weight;
  s.mean = kept("ln.mean", {M_}, Dt::f32);
  s.var = kept("ln.var", {M_}, Dt::f32);
  if (half()) {  // the weight as f32, converted per call
    s.scale = kept("ln.scale", {C_}, Dt::f32);
    const memory w = param({C_}, weight);
    convert(p_.forward, w, s.scale);
  } else {
    s.scale = param({C_}, weight);
  }
  add(p_.forward, layer_normalization_forward(*ln_fwd_), ln_fwd_->scratchpad_desc(),
      {{DNNL_ARG_SRC, x},
       {DNNL_ARG_DST, dst},
       {DNNL_ARG_SCALE, s.scale},
       {DNNL_ARG_MEAN, s.mean},
       {DNNL_ARG_VARIANCE, s.var}},
      Phase::kOther);
  return s;
}

void GptPlanBuilder::ln_backward(const LnSaved& s, const memory& diff_dst, const memory& diff_src) {
  add(p_.backward, dnnl::layer_normalization_backward(*ln_bwd_), ln_bwd_->scratchpad_desc(),
      {{DNNL_ARG_SRC, s.src},
       {DNNL_ARG_MEAN, s.mean},
       {DNNL_ARG_VARIANCE, s.var},
       {DNNL_ARG_SCALE, s.scale},
       {DNNL_ARG_DIFF_DST, diff_dst},
       {DNNL_ARG_DIFF_SRC, diff_src},
       {DNNL_ARG_DIFF_SCALE, grad({C_}, s.weight)}},
      Phase::kOther);
}

// The inner products take their weights in the layout oneDNN chooses (format_tag::any: blocked
// for its jit kernels, where plain (out, in) weights get its slower gemm-based one): the flat
// array's plain weights are reordered into it in each leaf's forward, and backward-data reads
// that copy (reordered again where it wants another layout); backward-weights writes its layout,
// which is reordered into the plain gradient. Where oneDNN's choice is its gemm-based kernel
// anyway (f32 on AVX2 CPUs: it picks transposed weights), which packs its operands itself, the
// primitives take the plain layout instead, and none of the three reorders runs.
// Whether oneDNN picked its gemm-based inner product ("x64:gemm:jit", "gemm:jit"; not "brgemm:").
bool gemm_based(const dnnl::primitive_desc_base& pd) {
  const std::string impl = pd.impl_info_str();
  return impl.starts_with("x64:gemm") || impl.starts_with("gemm");
}
// make(tag) builds an inner product's primitive descriptor with its weights (or their gradient)
// in `tag`: oneDNN's choice (any), or the plain (out, in) layout where that choice is gemm-based.
template <class Make>
auto weights_layout_pd(Make make) {
  auto pd = make(Tag::any);
  return gemm_based(pd) ? make(Tag::ab) : pd;
}

dnnl::inner_product_forward::primitive_desc GptPlanBuilder::linear_pd(const memory::desc& src,
                                                                      std::int64_t O,
                                                                      const memory::desc& dst) {
  using namespace dnnl;
  const std::int64_t I = src.dims()[1];
  return weights_layout_pd([&](Tag tag) {
    return inner_product_forward::primitive_desc(
        inner_product_forward::desc(prop_kind::forward_training, src,
                                    memory::desc({O, I}, act_, tag), dst),
        attr(), eng_);
  });
}

void GptPlanBuilder::linear(const memory& src, std::size_t weight, std::int64_t O,
                            const memory& dst) {
  using namespace dnnl;
  const std::int64_t I = src.get_desc().dims()[1];
  const inner_product_forward::primitive_desc pd = linear_pd(src.get_desc(), O, dst.get_desc());
  memory w = param({O, I}, weight);
  if (pd.weights_desc() != w.get_desc()) {
    memory blocked = plain_layout(pd.weights_desc());
    convert(p_.forward, w, blocked);
    w = blocked;
  }
  blocked_weights_[weight] = w;
  add(p_.forward, inner_product_forward(pd), pd.scratchpad_desc(),
      {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_DST, dst}}, Phase::kMatmul);
}

void GptPlanBuilder::linear_backward(const memory& src, std::size_t weight, std::int64_t O,
                                     const memory& diff_dst, const memory& diff_src) {
  using namespace dnnl;
  const std::int64_t I = src.get_desc().dims()[1];
  const memory dw = grad({O, I}, weight);
  const memory::desc dst_md({M_, O}, act_, Tag::ab);
  const inner_product_forward::primitive_desc hint = linear_pd(src.get_desc(), O, dst_md);
  if (diff_src) {
    const auto dpd = weights_layout_pd([&](Tag tag) {
      return inner_product_backward_data::primitive_desc(
          inner_product_backward_data::desc(diff_src.get_desc(), memory::desc({O, I}, act_, tag),
                                            diff_dst.get_desc()),
          attr(), eng_, hint);
    });
    memory w = blocked_weights_.at(weight);  // forward's copy, this step's weights
    if (dpd.weights_desc() != w.get_desc()) {
      memory other = plain_layout(dpd.weights_desc());
      convert(p_.backward, w, other);
      w = other;
    }
    add(p_.backward, inner_product_backward_data(dpd), dpd.scratchpad_desc(),
        {{DNNL_ARG_DIFF_DST, diff_dst}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_DIFF_SRC, diff_src}},
        Phase::kMatmul);
  }
  const auto wpd = weights_layout_pd([&](Tag tag) {
    return inner_product_backward_weights::primitive_desc(
        inner_product_backward_weights::desc(src.get_desc(), memory::desc({O, I}, Dt::f32, tag),
                                             diff_dst.get_desc()),
        attr(), eng_, hint);
  });
  const bool plain_dw = wpd.diff_weights_desc() == dw.get_desc();
  const memory out = plain_dw ? dw : temp("d.weights", {O, I}, Dt::f32, wpd.diff_weights_desc());
  add(p_.backward, inner_product_backward_weights(wpd), wpd.scratchpad_desc(),
      {{DNNL_ARG_SRC, src}, {DNNL_ARG_DIFF_DST, diff_dst}, {DNNL_ARG_DIFF_WEIGHTS, out}},
      Phase::kMatmul);
  if (!plain_dw) convert(p_.backward, out, dw);
}

GptPlanBuilder::BlockSaved GptPlanBuilder::block_forward(std::int64_t l, const memory& x) {
  using namespace dnnl;
  const GptModel::BlockOffsets& o = m_.block(l);
  BlockSaved b;
  const std::int64_t T = T_, C = C_, H = H_, hs = hs_, N = N_;
  where_ = "h." + std::to_string(l) + ".ln_1";
  // f32: the LayerNorm's output is the next layer's input, kept; bf16: converted, and kept so.
  memory h1_f32 = half() ? temp("ln.out", {M_, C}, Dt::f32) : kept("h1", {M_, C}, Dt::f32);
  b.ln1 = ln_forward(x, o.ln_1, h1_f32);
  b.h1 = as_act(p_.forward, h1_f32, {M_, C}, "h1");
  where_ = "h." + std::to_string(l) + ".attn.c_attn";
  b.qkv = kept("qkv", {M_, 3 * C}, act_);
  linear(b.h1, o.c_attn, 3 * C, b.qkv);

  where_ = "h." + std::to_string(l) + ".attn";
  const Dims heads{N, H, T, hs}, qkv_strides{T * 3 * C, hs, 3 * C, 1};
  const memory q = view(b.qkv, heads, qkv_strides, 0);
  const memory kt = view(b.qkv, {N, H, hs, T}, {T * 3 * C, hs, 1, 3 * C}, C);
  const memory v = view(b.qkv, heads, qkv_strides, 2 * C);
  memory scores = temp("scores", {N, H, T, T}, Dt::f32);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  add_matmul(p_.forward, q, kt, scores, scale);
  // The causal mask: a query sees the keys at and before its position.
  float* sc = static_cast<float*>(scores.get_data_handle());
  custom(p_.forward, [sc, N, H, T] {
    const float minus_inf = -std::numeric_limits<float>::infinity();
    for (std::int64_t r = 0; r < N * H; ++r)
      for (std::int64_t i = 0; i + 1 < T; ++i)
        std::fill(sc + (r * T + i) * T + i + 1, sc + (r * T + i + 1) * T, minus_inf);
  });
  b.p = kept("p", {N, H, T, T}, Dt::f32);
  softmax_forward::primitive_desc smpd(
      softmax_forward::desc(prop_kind::forward_training, scores.get_desc(), 3), attr(), eng_);
  add(p_.forward, softmax_forward(smpd), smpd.scratchpad_desc(),
      {{DNNL_ARG_SRC, scores}, {DNNL_ARG_DST, b.p}}, Phase::kEltwise);
  // The weights the values are averaged with: dropped out and in the activations' type.
  b.p_used = b.p;
  const std::size_t pn = static_cast<std::size_t>(N * H * T * T);
  if (drop_) {
    const float* pm = mask(p_.forward, pn, dropout_layer(l, 0));
    b.p_used = kept("p_used", {N, H, T, T}, act_);
    const float* pp = static_cast<const float*>(b.p.get_data_handle());
    void* out = b.p_used.get_data_handle();
    const bool half = this->half();
    custom(p_.forward, [=] {
      if (half)
        for (std::size_t i = 0; i < pn; ++i) static_cast<bf16*>(out)[i] = to_bf16(pp[i] * pm[i]);
      else
        for (std::size_t i = 0; i < pn; ++i) static_cast<float*>(out)[i] = pp[i] * pm[i];
    });
  } else if (half()) {
    b.p_used = kept("p_used", {N, H, T, T}, act_);
    convert(p_.forward, b.p, b.p_used);
  }
  b.y = kept("y", {M_, C}, act_);
  const memory yh = view(b.y, heads, {T * C, hs, C, 1}, 0);
  add_matmul(p_.forward, b.p_used, v, yh);

  // The residual branches: x += dropout(branch), in f32.
  auto residual = [this, &x](const memory& branch, std::size_t layer) {
    float* xs = static_cast<float*>(x.get_data_handle());
    const float* br = static_cast<const float*>(branch.get_data_handle());
    const std::size_t n = static_cast<std::size_t>(M_ * C_);
    const float* mk = drop_ ? mask(p_.forward, n, layer) : nullptr;
    custom(p_.forward, [=] {
      if (mk)
        for (std::size_t i = 0; i < n; ++i) xs[i] += br[i] * mk[i];
      else
        for (std::size_t i = 0; i < n; ++i) xs[i] += br[i];
    });
  };
  where_ = "h." + std::to_string(l) + ".attn.c_proj";
  memory a = temp("branch", {M_, C}, Dt::f32);
  linear(b.y, o.attn_proj, C, a);
  residual(a, dropout_layer(l, 1));
  // Backward needs the stream as it was here (ln_2's input); the forward goes on in x.
  where_ = "h." + std::to_string(l) + ".ln_2";
  if (training_) {
    b.x_mid = plain({M_, C}, Dt::f32);
    convert(p_.forward, x, b.x_mid);
  } else {
    b.x_mid = x;
  }
  memory h2_f32 = half() ? temp("ln.out", {M_, C}, Dt::f32) : kept("h2", {M_, C}, Dt::f32);
  b.ln2 = ln_forward(b.x_mid, o.ln_2, h2_f32);
  b.h2 = as_act(p_.forward, h2_f32, {M_, C}, "h2");
  where_ = "h." + std::to_string(l) + ".mlp.c_fc";
  b.f = kept("f", {M_, 4 * C}, act_);
  linear(b.h2, o.c_fc, 4 * C, b.f);
  where_ = "h." + std::to_string(l) + ".mlp.gelu";
  b.g = kept("g", {M_, 4 * C}, act_);
  eltwise_forward::primitive_desc gpd(
      eltwise_forward::desc(prop_kind::forward_training, algorithm::eltwise_gelu_erf,
                            b.f.get_desc(), 0.0f, 0.0f),
      attr(), eng_);
  add(p_.forward, eltwise_forward(gpd), gpd.scratchpad_desc(),
      {{DNNL_ARG_SRC, b.f}, {DNNL_ARG_DST, b.g}}, Phase::kEltwise);
  where_ = "h." + std::to_string(l) + ".mlp.c_proj";
  memory mo = temp("branch", {M_, C}, Dt::f32);
  linear(b.g, o.mlp_proj, C, mo);
  residual(mo, dropout_layer(l, 2));
  return b;
}

void GptPlanBuilder::block_backward(std::int64_t l, const BlockSaved& b, const memory& dx) {
  using namespace dnnl;
  const GptModel::BlockOffsets& o = m_.block(l);
  const std::int64_t T = T_, C = C_, H = H_, hs = hs_, N = N_;
  const std::size_t n = static_cast<std::size_t>(M_ * C);
  float* dxs = static_cast<float*>(dx.get_data_handle());
  // A residual branch's gradient: dx through the branch's dropout, in the activations' type.
  auto branch = [&](std::size_t layer) {
    const float* kept = drop_ ? mask(p_.backward, n, layer) : nullptr;
    memory d = temp("d.branch", {M_, C}, act_);
    void* out = d.get_data_handle();
    const bool half = this->half();
    custom(p_.backward, [=] {
      for (std::size_t i = 0; i < n; ++i) {
        const float g = kept ? dxs[i] * kept[i] : dxs[i];
        if (half)
          static_cast<bf16*>(out)[i] = to_bf16(g);
        else
          static_cast<float*>(out)[i] = g;
      }
    });
    return d;
  };
  // dx += d (f32, M x C).
  auto accumulate = [&](const memory& d) {
    const float* ds = static_cast<const float*>(d.get_data_handle());
    custom(p_.backward, [=] {
      for (std::size_t i = 0; i < n; ++i) dxs[i] += ds[i];
    });
  };
  // The input gradient of a linear layer in front of a LayerNorm, as f32 for its backward.
  memory dln = temp("d.ln", {M_, C}, Dt::f32);
  memory dh_f32 = temp("d.h.f32", {M_, C}, Dt::f32);
  memory dh = half() ? temp("d.h", {M_, C}, act_) : dh_f32;

  where_ = "h." + std::to_string(l) + ".mlp.c_proj";
  const memory dmo = branch(dropout_layer(l, 2));
  memory dg = temp("d.g", {M_, 4 * C}, act_);
  linear_backward(b.g, o.mlp_proj, C, dmo, dg);
  where_ = "h." + std::to_string(l) + ".mlp.gelu";
  memory df = temp("d.f", {M_, 4 * C}, act_);
  eltwise_forward::primitive_desc ghint(
      eltwise_forward::desc(prop_kind::forward_training, algorithm::eltwise_gelu_erf,
                            b.f.get_desc(), 0.0f, 0.0f),
      attr(), eng_);
  eltwise_backward::primitive_desc gbpd(
      eltwise_backward::desc(algorithm::eltwise_gelu_erf, df.get_desc(), b.f.get_desc(), 0.0f,
                             0.0f),
      attr(), eng_, ghint);
  add(p_.backward, eltwise_backward(gbpd), gbpd.scratchpad_desc(),
      {{DNNL_ARG_SRC, b.f}, {DNNL_ARG_DIFF_DST, dg}, {DNNL_ARG_DIFF_SRC, df}}, Phase::kEltwise);
  where_ = "h." + std::to_string(l) + ".mlp.c_fc";
  linear_backward(b.h2, o.c_fc, 4 * C, df, dh);
  if (half()) convert(p_.backward, dh, dh_f32);
  where_ = "h." + std::to_string(l) + ".ln_2";
  ln_backward(b.ln2, dh_f32, dln);
  accumulate(dln);

  where_ = "h." + std::to_string(l) + ".attn.c_proj";
  const memory da = branch(dropout_layer(l, 1));
  memory dy = temp("d.y", {M_, C}, act_);
  linear_backward(b.y, o.attn_proj, C, da, dy);

  where_ = "h." + std::to_string(l) + ".attn";
  const Dims heads{N, H, T, hs}, qkv_strides{T * 3 * C, hs, 3 * C, 1};
  const Dims y_strides{T * C, hs, C, 1}, transposed{H * T * T, T * T, 1, T};
  const memory dyh = view(dy, heads, y_strides, 0);
  // dP = dY V^T, through the attention dropout.
  memory dp = temp("d.p", {N, H, T, T}, Dt::f32);
  const memory vt = view(b.qkv, {N, H, hs, T}, {T * 3 * C, hs, 1, 3 * C}, 2 * C);
  add_matmul(p_.backward, dyh, vt, dp);
  const std::size_t pn = static_cast<std::size_t>(N * H * T * T);
  if (drop_) {
    float* d = static_cast<float*>(dp.get_data_handle());
    const float* mk = mask(p_.backward, pn, dropout_layer(l, 0));
    custom(p_.backward, [=] {
      for (std::size_t i = 0; i < pn; ++i) d[i] *= mk[i];
    });
  }
  // dV = P^T dY (P as the forward used it).
  memory dqkv = temp("d.qkv", {M_, 3 * C}, act_);
  const memory pt = view(b.p_used, {N, H, T, T}, transposed, 0);
  const memory dv = view(dqkv, heads, qkv_strides, 2 * C);
  add_matmul(p_.backward, pt, dyh, dv);
  // dS = softmax'(P) dP in the activations' type (causal_softmax_backward: oneDNN 2.6's is a
  // reference loop on AVX2); the scores' scale goes into the two matmuls after it.
  const memory ds_act = temp("d.s", {N, H, T, T}, act_);
  {
    const float* pp = static_cast<const float*>(b.p.get_data_handle());
    const float* dps = static_cast<const float*>(dp.get_data_handle());
    void* out = ds_act.get_data_handle();
    const bool half = this->half();
    custom(p_.backward, [=] {
      if (half)
        causal_softmax_backward(pp, dps, static_cast<bf16*>(out), N * H, T);
      else
        causal_softmax_backward(pp, dps, static_cast<float*>(out), N * H, T);
    });
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  // dQ = scale dS K, dK = scale dS^T Q.
  const memory k = view(b.qkv, heads, qkv_strides, C);
  const memory q = view(b.qkv, heads, qkv_strides, 0);
  const memory dq = view(dqkv, heads, qkv_strides, 0);
  const memory dk = view(dqkv, heads, qkv_strides, C);
  add_matmul(p_.backward, ds_act, k, dq, scale);
  const memory dst_t = view(ds_act, {N, H, T, T}, transposed, 0);
  add_matmul(p_.backward, dst_t, q, dk, scale);

  where_ = "h." + std::to_string(l) + ".attn.c_attn";
  linear_backward(b.h1, o.c_attn, 3 * C, dqkv, dh);
  if (half()) convert(p_.backward, dh, dh_f32);
  where_ = "h." + std::to_string(l) + ".ln_1";
  ln_backward(b.ln1, dh_f32, dln);
  accumulate(dln);
}

void GptPlanBuilder::build_steps() {
  const std::int64_t T = T_, C = C_, V = V_;
  const std::size_t n = static_cast<std::size_t>(M_ * C);
  Plan& p = p_;
  const bool half = this->half();
  const std::int32_t* const* windows = windows_;
  const std::size_t wte = m_.wte(), wpe = m_.wpe();

  // The embeddings: x = wte[token] + wpe[position], dropped out.
  where_ = "transformer.wte";
  memory x = plain({M_, C}, Dt::f32);
  float* xs = static_cast<float*>(x.get_data_handle());
  custom(p.forward, [&p, xs, windows, wte, wpe, T, C, half, M = M_] {
    auto at = [&](std::size_t i) {
      return half ? to_float(static_cast<const bf16*>(p.bound_params)[i])
                  : static_cast<const float*>(p.bound_params)[i];
    };
    for (std::int64_t m = 0; m < M; ++m) {
      const std::int32_t tok = (*windows)[m / T * (T + 1) + m % T];
      const std::size_t e = wte + static_cast<std::size_t>(tok * C);
      const std::size_t q = wpe + static_cast<std::size_t>(m % T * C);
      for (std::int64_t c = 0; c < C; ++c)
        xs[m * C + c] = at(e + static_cast<std::size_t>(c)) + at(q + static_cast<std::size_t>(c));
    }
  });
  if (drop_) {
    const float* emb_mask = mask(p.forward, n, 0);
    custom(p.forward, [=] {
      for (std::size_t i = 0; i < n; ++i) xs[i] *= emb_mask[i];
    });
  }
  // Each block reads the stream as its input and adds its branches to it; backward needs each
  // block's input as it was, so training keeps a copy per block (the first is x itself, copied
  // before block 0 adds to it).
  std::vector<BlockSaved> saved;
  for (std::int64_t l = 0; l < s_.layers; ++l) {
    memory in = x;
    if (training_) {
      in = plain({M_, C}, Dt::f32);
      convert(p.forward, x, in);
    }
    where_ = "h." + std::to_string(l);
    BlockSaved b = block_forward(l, x);
    b.ln1.src = in;  // ln_1 normalized the stream before the block added to it
    saved.push_back(std::move(b));
  }
  where_ = "transformer.ln_f";
  memory xf_f32 = kept("xf", {M_, C}, Dt::f32);
  const LnSaved lnf = ln_forward(x, m_.ln_f(), xf_f32);
  const memory xf = as_act(p.forward, xf_f32, {M_, C}, "xf.act");
  where_ = "lm_head";
  memory logits = plain({M_, V}, Dt::f32);
  linear(xf, wte, V, logits);
  p.logits = static_cast<float*>(logits.get_data_handle());
  if (!training_) return;

  // Backward from the loss's gradient (diff_logits, f32; written by the caller).
  memory dlogits = plain({M_, V}, Dt::f32);
  p.diff_logits = static_cast<float*>(dlogits.get_data_handle());
  const memory dlogits_act = as_act(p.backward, dlogits, {M_, V}, "d.logits.act");
  memory dx = plain({M_, C}, Dt::f32);
  memory dxf = plain({M_, C}, act_);
  linear_backward(xf, wte, V, dlogits_act, dxf);  // also wte's gradient, from the head
  memory dxf_f32 = dxf;
  if (half) {
    dxf_f32 = plain({M_, C}, Dt::f32);
    convert(p.backward, dxf, dxf_f32);
  }
  where_ = "transformer.ln_f";
  ln_backward(lnf, dxf_f32, dx);
  for (std::int64_t l = s_.layers; l-- > 0;)
    block_backward(l, saved[static_cast<std::size_t>(l)], dx);
  // The embeddings' gradients: wpe's overwritten, wte's added to the head's.
  where_ = "transformer.wte";
  float* dxs = static_cast<float*>(dx.get_data_handle());
  const float* emb_mask = drop_ ? mask(p.backward, n, 0) : nullptr;
  custom(p.backward, [&p, dxs, emb_mask, windows, wte, wpe, T, C, M = M_] {
    float* g = p.bound_grad;
    std::fill(g + wpe, g + wpe + static_cast<std::size_t>(T * C), 0.0f);
    for (std::int64_t m = 0; m < M; ++m) {
      const std::int32_t tok = (*windows)[m / T * (T + 1) + m % T];
      float* e = g + wte + static_cast<std::size_t>(tok * C);
      float* q = g + wpe + static_cast<std::size_t>(m % T * C);
      const float* d = dxs + m * C;
      for (std::int64_t c = 0; c < C; ++c) {
        const float v = emb_mask ? d[c] * emb_mask[m * C + c] : d[c];
        e[c] += v;
        q[c] += v;
      }
    }
  });
}

}  // namespace

std::unique_ptr<Plan> build_gpt_plan(const GptPlanRequest& r) {
  static std::mutex building;  // as build_plan: one plan built at a time
  const std::lock_guard lock(building);
  auto p = std::make_unique<Plan>();
  GptPlanBuilder builder(r, *p);
  try {
    builder.build();
  } catch (const dnnl::error& e) {
    throw InternalError("oneDNN: building " + r.model->spec() + " (" +
                        std::string(r.precision == Precision::kBf16 ? "bf16" : "f32") + ") for " +
                        std::to_string(r.N) + " windows, " + builder.where() + ": " + e.what() +
                        " (status " + std::to_string(static_cast<int>(e.status)) + ")");
  }
  return p;
}

}  // namespace cohort::nn::detail
