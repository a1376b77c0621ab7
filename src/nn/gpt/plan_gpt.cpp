// Building a GptNet's plan for N windows (gpt_plan.hpp) with a GptPlanBuilder
// (gpt_plan_builder.hpp): the embeddings, the blocks in order (plan_gpt_block.cpp), the final
// LayerNorm and the tied head, forward then backward; and the LayerNorm and linear layers' steps
// that every part uses.
#include <cblas.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>

#include "cohort/core/error.hpp"
#include "cohort/nn/gpt/gpt.hpp"
#include "cohort/nn/gpt/gpt_kernels.hpp"
#include "cohort/nn/version.hpp"
#include "gpt_plan.hpp"
#include "gpt_plan_builder.hpp"

namespace cohort::nn::detail {

GptPlanBuilder::LnSaved GptPlanBuilder::ln_forward(const memory& x, std::size_t weight,
                                                   std::size_t bias, const memory& dst) {
  using namespace dnnl;
  LnSaved s;
  s.src = x;
  s.weight = weight;
  s.bias = bias;
  const bool shift = bias != GptModel::kNoBias;  // every LayerNorm of a model, or none
  s.mean = kept("ln.mean", {M_}, Dt::f32);
  s.stat = kept("ln.stat", {M_}, Dt::f32);
  if (!half()) {  // oneDNN's, in f32 throughout
    s.scale = param({C_}, weight);
    if (shift) s.shift = param({C_}, bias);
    const memory::desc data({M_, C_}, Dt::f32, Tag::ab), stat({M_}, Dt::f32, Tag::a);
    const auto flags = shift ? normalization_flags::use_scale | normalization_flags::use_shift
                             : normalization_flags::use_scale;
    if (!ln_fwd_) {
      ln_fwd_.emplace(layer_normalization_forward::desc(prop_kind::forward_training, data, stat,
                                                        GptModel::kLayerNormEpsilon, flags),
                      attr(), eng_);
      if (training_)
        ln_bwd_.emplace(layer_normalization_backward::desc(prop_kind::backward, data, data, stat,
                                                           GptModel::kLayerNormEpsilon, flags),
                        attr(), eng_, *ln_fwd_);
    }
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, x},
                                         {DNNL_ARG_DST, dst},
                                         {DNNL_ARG_SCALE, s.scale},
                                         {DNNL_ARG_MEAN, s.mean},
                                         {DNNL_ARG_VARIANCE, s.stat}};
    if (shift) args.emplace(DNNL_ARG_SHIFT, s.shift);
    add(p_.forward, layer_normalization_forward(*ln_fwd_), ln_fwd_->scratchpad_desc(),
        std::move(args), Phase::kOther);
    return s;
  }
  // bf16: cohort's loop, writing bf16; the weight and bias as f32, converted by the plan's
  // prepare steps.
  s.scale = plain({C_}, Dt::f32);
  reorder(p_.prepare, param({C_}, weight), s.scale);
  if (shift) {
    s.shift = plain({C_}, Dt::f32);
    reorder(p_.prepare, param({C_}, bias), s.shift);
  }
  custom(
      p_.forward,
      [x, gamma = s.scale, beta = s.shift, dst, mean = s.mean, rstd = s.stat, M = M_, C = C_] {
        layer_norm_forward(
            static_cast<const float*>(x.get_data_handle()),
            static_cast<const float*>(gamma.get_data_handle()),
            beta ? static_cast<const float*>(beta.get_data_handle()) : nullptr,
            static_cast<bf16*>(dst.get_data_handle()), static_cast<float*>(mean.get_data_handle()),
            static_cast<float*>(rstd.get_data_handle()), M, C, GptModel::kLayerNormEpsilon);
      },
      Phase::kOther);
  return s;
}

void GptPlanBuilder::ln_backward(const LnSaved& s, const memory& diff_dst, const memory& diff_src,
                                 bool accumulate) {
  const memory dgamma = grad({C_}, s.weight);
  const memory dbeta = s.bias != GptModel::kNoBias ? grad({C_}, s.bias) : memory();
  if (!half()) {
    const memory out = accumulate ? temp("d.ln", {M_, C_}, Dt::f32) : diff_src;
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, s.src},         {DNNL_ARG_MEAN, s.mean},
                                         {DNNL_ARG_VARIANCE, s.stat},   {DNNL_ARG_SCALE, s.scale},
                                         {DNNL_ARG_DIFF_DST, diff_dst}, {DNNL_ARG_DIFF_SRC, out},
                                         {DNNL_ARG_DIFF_SCALE, dgamma}};
    if (dbeta) {
      args.emplace(DNNL_ARG_SHIFT, s.shift);
      args.emplace(DNNL_ARG_DIFF_SHIFT, dbeta);
    }
    add(p_.backward, dnnl::layer_normalization_backward(*ln_bwd_), ln_bwd_->scratchpad_desc(),
        std::move(args), Phase::kOther);
    if (accumulate) {
      const float* d = static_cast<const float*>(out.get_data_handle());
      float* dx = static_cast<float*>(diff_src.get_data_handle());
      const std::size_t n = static_cast<std::size_t>(M_ * C_);
      custom(p_.backward, [d, dx, n] {
        for (std::size_t i = 0; i < n; ++i) dx[i] += d[i];
      });
    }
    return;
  }
  // The weight's gradient is bound to each step's array: its handle is read when the step runs.
  custom(
      p_.backward,
      [x = s.src, gamma = s.scale, mean = s.mean, rstd = s.stat, diff_dst, diff_src, accumulate,
       dgamma, dbeta, M = M_, C = C_] {
        layer_norm_backward(static_cast<const float*>(x.get_data_handle()),
                            static_cast<const float*>(gamma.get_data_handle()),
                            static_cast<const float*>(mean.get_data_handle()),
                            static_cast<const float*>(rstd.get_data_handle()),
                            static_cast<const bf16*>(diff_dst.get_data_handle()),
                            static_cast<float*>(diff_src.get_data_handle()), accumulate,
                            static_cast<float*>(dgamma.get_data_handle()),
                            dbeta ? static_cast<float*>(dbeta.get_data_handle()) : nullptr, M, C);
      },
      Phase::kOther);
}

namespace {

using Tag = dnnl::memory::format_tag;

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

}  // namespace

dnnl::inner_product_forward::primitive_desc GptPlanBuilder::linear_pd(const memory::desc& src,
                                                                      std::int64_t O,
                                                                      const memory::desc& dst,
                                                                      bool bias) {
  using namespace dnnl;
  const std::int64_t I = src.dims()[1];
  return weights_layout_pd([&](Tag tag) {
    const memory::desc weights({O, I}, act_, tag);
    return inner_product_forward::primitive_desc(
        bias ? inner_product_forward::desc(prop_kind::forward_training, src, weights,
                                           memory::desc({O}, act_, Tag::a), dst)
             : inner_product_forward::desc(prop_kind::forward_training, src, weights, dst),
        attr(), eng_);
  });
}

void GptPlanBuilder::linear(const memory& src, std::size_t weight, std::int64_t O,
                            const memory& dst, std::size_t bias, std::vector<Exec>* list) {
  using namespace dnnl;
  const std::int64_t I = src.get_desc().dims()[1];
  const bool has_bias = bias != GptModel::kNoBias;
  const inner_product_forward::primitive_desc pd =
      linear_pd(src.get_desc(), O, dst.get_desc(), has_bias);
  memory w = param({O, I}, weight);
  if (pd.weights_desc() != w.get_desc()) w = weight_copy(w, weight, pd.weights_desc());
  blocked_weights_[weight] = w;
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_DST, dst}};
  if (has_bias) args.emplace(DNNL_ARG_BIAS, param({O}, bias));
  add(list ? *list : p_.forward, inner_product_forward(pd), pd.scratchpad_desc(), std::move(args),
      Phase::kMatmul);
}

void GptPlanBuilder::linear_backward(const memory& src, std::size_t weight, std::int64_t O,
                                     const memory& diff_dst, const memory& diff_src,
                                     std::size_t bias) {
  if (diff_src) linear_backward_data(src, weight, O, diff_dst, diff_src);
  linear_backward_weights(src, weight, O, diff_dst);
  if (bias == GptModel::kNoBias) return;
  // The bias's gradient: diff_dst's column sums (gpt_kernels.hpp).
  const memory db = grad({O}, bias);
  const bool half = this->half();
  custom(
      p_.backward,
      [diff_dst, db, half, M = M_, O] {
        auto* out = static_cast<float*>(db.get_data_handle());
        if (half)
          bias_backward(static_cast<const bf16*>(diff_dst.get_data_handle()), out, M, O);
        else
          bias_backward(static_cast<const float*>(diff_dst.get_data_handle()), out, M, O);
      },
      Phase::kOther);
}

// dX = dY W: a matmul on the plain bf16 weights where its kernel is AMX's (or GptPaths asks for
// it), else oneDNN's inner product's backward-data on the forward's blocked copy.
void GptPlanBuilder::linear_backward_data(const memory& src, std::size_t weight, std::int64_t O,
                                          const memory& diff_dst, const memory& diff_src,
                                          std::vector<Exec>* list) {
  using namespace dnnl;
  std::vector<Exec>& steps = list ? *list : p_.backward;
  const std::int64_t I = src.get_desc().dims()[1], rows = src.get_desc().dims()[0];
  using Backward = GptPaths::Bf16LinearBackward;
  const bool matmuls = half() && paths_.bf16_linear_backward != Backward::kInnerProduct;
  const bool forced = paths_.bf16_linear_backward == Backward::kMatmul;
  if (matmuls) {
    // dX (M, I) = dY W as a matmul on the plain bf16 weights: where its kernel is AMX's, it ran
    // faster than the inner product's backward-data on the forward's blocked copy on three of
    // the four shapes measured, and as fast on the fourth (docs/decisions.md, "Language models'
    // bf16 weight gradients on AMX"). Elsewhere where GptPaths says so.
    const matmul::primitive_desc mpd(
        matmul::desc(diff_dst.get_desc(), memory::desc({O, I}, act_, Tag::ab), diff_src.get_desc()),
        attr(), eng_);
    if (forced || amx_kernel(mpd)) {
      add(steps, matmul(mpd), mpd.scratchpad_desc(),
          {{DNNL_ARG_SRC, diff_dst},
           {DNNL_ARG_WEIGHTS, param({O, I}, weight)},
           {DNNL_ARG_DST, diff_src}},
          Phase::kMatmul);
      return;
    }
  }
  const inner_product_forward::primitive_desc hint =
      linear_pd(src.get_desc(), O, memory::desc({rows, O}, act_, Tag::ab));
  const auto dpd = weights_layout_pd([&](Tag tag) {
    return inner_product_backward_data::primitive_desc(
        inner_product_backward_data::desc(diff_src.get_desc(), memory::desc({O, I}, act_, tag),
                                          diff_dst.get_desc()),
        attr(), eng_, hint);
  });
  memory w = blocked_weights_.at(weight);  // forward's copy, this step's weights
  if (dpd.weights_desc() != w.get_desc()) w = weight_copy(w, weight, dpd.weights_desc());
  add(steps, inner_product_backward_data(dpd), dpd.scratchpad_desc(),
      {{DNNL_ARG_DIFF_DST, diff_dst}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_DIFF_SRC, diff_src}},
      Phase::kMatmul);
}

// dW = dY^T X into the weight's gradient: in f32 with rows of 4 KB, dnnl_sgemm oriented to them;
// in bf16, a matmul on dY's transposed view where its kernel is a brgemm (or GptPaths asks for
// it); a small f32 one on OpenBLAS where oneDNN's choice is its gemm-based kernel; else oneDNN's
// inner product's backward-weights, reordered from its layout into the plain gradient.
void GptPlanBuilder::linear_backward_weights(const memory& src, std::size_t weight, std::int64_t O,
                                             const memory& diff_dst) {
  using namespace dnnl;
  const std::int64_t I = src.get_desc().dims()[1];
  const memory dw = grad({O, I}, weight);
  using Backward = GptPaths::Bf16LinearBackward;
  const bool matmuls = half() && paths_.bf16_linear_backward != Backward::kInnerProduct;
  const bool forced = paths_.bf16_linear_backward == Backward::kMatmul;
  if (!half() && (wide_rows(I) || wide_rows(O))) {
    // dnnl_sgemm (row-major), the wide operand not transposed (wide_rows): W = dY^T X, or
    // W^T = X^T dY into a transposed (ba) buffer reordered into the gradient.
    const bool w_t = !wide_rows(I);
    const memory out =
        w_t ? temp("d.weights", {O, I}, Dt::f32, memory::desc({O, I}, Dt::f32, Tag::ba)) : dw;
    const std::int64_t M = M_;
    custom(
        p_.backward,
        [src, diff_dst, out, w_t, M, I, O] {
          const auto* x = static_cast<const float*>(src.get_data_handle());
          const auto* dy = static_cast<const float*>(diff_dst.get_data_handle());
          auto* w = static_cast<float*>(out.get_data_handle());
          const dnnl_status_t status =
              w_t ? dnnl_sgemm('T', 'N', I, O, M, 1.0f, x, I, dy, O, 0.0f, w, O)
                  : dnnl_sgemm('T', 'N', O, I, M, 1.0f, dy, O, x, I, 0.0f, w, I);
          COHORT_CHECK(status == dnnl_success, "dnnl_sgemm of a weight gradient");
        },
        Phase::kMatmul);
    if (w_t) reorder(p_.backward, out, dw);
    return;
  }
  if (matmuls) {
    // W (O, I) = dY^T X as a matmul on dY's transposed view, written plain: where its kernel is
    // a brgemm, it ran faster than the inner product's backward-weights kernel (which also writes
    // a blocked layout to reorder) on all but one of the shapes measured on AMX, and in the three
    // presets' leaves on AVX-512 without AMX (docs/decisions.md, "Language models' bf16 weight
    // gradients on AMX"). Elsewhere where GptPaths says so.
    const matmul::primitive_desc mpd(
        matmul::desc(memory::desc({O, M_}, act_, Dims{1, O}), src.get_desc(), dw.get_desc()),
        attr(), eng_);
    if (forced || brgemm_kernel(mpd)) {
      const memory dy_t(mpd.src_desc(), eng_, diff_dst.get_data_handle());
      add(p_.backward, matmul(mpd), mpd.scratchpad_desc(),
          {{DNNL_ARG_SRC, dy_t}, {DNNL_ARG_WEIGHTS, src}, {DNNL_ARG_DST, dw}}, Phase::kMatmul);
      return;
    }
  }
  const inner_product_forward::primitive_desc hint =
      linear_pd(src.get_desc(), O, memory::desc({M_, O}, act_, Tag::ab));
  const auto wpd = weights_layout_pd([&](Tag tag) {
    return inner_product_backward_weights::primitive_desc(
        inner_product_backward_weights::desc(src.get_desc(), memory::desc({O, I}, Dt::f32, tag),
                                             diff_dst.get_desc()),
        attr(), eng_, hint);
  });
  if (small_weight_grad(I, O) && gemm_based(wpd) && openblas_usable()) {
    // OpenBLAS (row-major): W (O, I) = dY^T X, on this thread (the replica's OpenMP limit is 1).
    const std::int64_t M = M_;
    custom(
        p_.backward,
        [src, diff_dst, dw, M, I, O] {
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<blasint>(O),
                      static_cast<blasint>(I), static_cast<blasint>(M), 1.0f,
                      static_cast<const float*>(diff_dst.get_data_handle()),
                      static_cast<blasint>(O), static_cast<const float*>(src.get_data_handle()),
                      static_cast<blasint>(I), 0.0f, static_cast<float*>(dw.get_data_handle()),
                      static_cast<blasint>(I));
        },
        Phase::kMatmul);
    return;
  }
  const bool plain_dw = wpd.diff_weights_desc() == dw.get_desc();
  const memory out = plain_dw ? dw : temp("d.weights", {O, I}, Dt::f32, wpd.diff_weights_desc());
  add(p_.backward, inner_product_backward_weights(wpd), wpd.scratchpad_desc(),
      {{DNNL_ARG_SRC, src}, {DNNL_ARG_DIFF_DST, diff_dst}, {DNNL_ARG_DIFF_WEIGHTS, out}},
      Phase::kMatmul);
  if (!plain_dw) reorder(p_.backward, out, dw);
}

void GptPlanBuilder::head(const memory& xf, const memory& dxf) {
  using namespace dnnl;
  const std::int64_t V = V_, C = C_, R = head_rows();
  const std::size_t wte = m_.wte();
  // The logits, f32, and their gradient, written over them by the caller (nothing reads the
  // logits after the loss); in bf16 also that gradient in bf16, the head's backward's dY.
  const std::int64_t rows = std::min(R, M_);
  memory logits = plain({rows, V}, Dt::f32);
  p_.logits = p_.diff_logits = static_cast<float*>(logits.get_data_handle());
  p_.logits_bytes += logits.get_desc().get_size();
  memory dlogits_act = logits;
  if (training_ && half()) {
    dlogits_act = plain({rows, V}, act_);
    p_.logits_bytes += dlogits_act.get_desc().get_size();
  }
  if (R >= M_) {  // one chunk: the plan's own steps
    linear(xf, wte, V, logits);
    if (!training_) return;
    if (half()) reorder(p_.backward, logits, dlogits_act);
    linear_backward(xf, wte, V, dlogits_act, dxf);  // also wte's gradient, from the head
    return;
  }
  // Chunks of R rows: each chunk's logits, its loss (the caller's), its part of dxf, and its
  // term of the token embedding's gradient (the first written, the others added: dW = the sum
  // over the chunks of dY^T X, a GEMM with beta 1 in f32, a matmul with a sum post-op in bf16).
  const memory dw = training_ ? grad({V, C}, wte) : memory();
  for (std::int64_t first = 0; first < M_; first += R) {
    const std::int64_t n = std::min(R, M_ - first);
    Plan::HeadChunk& chunk = p_.head_chunks.emplace_back();
    chunk.first = first;
    chunk.rows = n;
    const memory x = view(xf, {n, C}, {C, 1}, first * C);
    const memory z = view(logits, {n, V}, {V, 1}, 0);
    linear(x, wte, V, z, GptModel::kNoBias, &chunk.forward);
    if (!training_) continue;
    const memory dz = view(dlogits_act, {n, V}, {V, 1}, 0);
    if (half()) reorder(chunk.backward, z, dz);
    linear_backward_data(x, wte, V, dz, view(dxf, {n, C}, {C, 1}, first * C), &chunk.backward);
    const bool accumulate = first > 0;
    if (!half()) {
      custom(
          chunk.backward,
          [x, dz, dw, n, V, C, accumulate] {
            const dnnl_status_t status =
                dnnl_sgemm('T', 'N', V, C, n, 1.0f, static_cast<const float*>(dz.get_data_handle()),
                           V, static_cast<const float*>(x.get_data_handle()), C,
                           accumulate ? 1.0f : 0.0f, static_cast<float*>(dw.get_data_handle()), C);
            COHORT_CHECK(status == dnnl_success, "dnnl_sgemm of the head's weight gradient");
          },
          Phase::kMatmul);
      continue;
    }
    primitive_attr a = attr();
    if (accumulate) {
      post_ops sum;
      sum.append_sum(1.0f);
      a.set_post_ops(sum);
    }
    const matmul::primitive_desc mpd(
        matmul::desc(memory::desc({V, n}, act_, Dims{1, V}), x.get_desc(), dw.get_desc()), a, eng_);
    const memory dz_t(mpd.src_desc(), eng_, dz.get_data_handle());
    add(chunk.backward, matmul(mpd), mpd.scratchpad_desc(),
        {{DNNL_ARG_SRC, dz_t}, {DNNL_ARG_WEIGHTS, x}, {DNNL_ARG_DST, dw}}, Phase::kMatmul);
  }
}

void GptPlanBuilder::build_steps() {
  const std::int64_t T = T_, C = C_;
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
  // block's input as it was, so training keeps a copy per block: block 0's copied here, the
  // others' written by the block before as its last residual add writes the stream (no pass of
  // their own).
  std::vector<memory> ins(static_cast<std::size_t>(s_.layers));
  if (training_) {
    for (memory& in : ins) in = plain({M_, C}, Dt::f32);
    float* in0 = static_cast<float*>(ins[0].get_data_handle());
    custom(p.forward, [=] { std::memcpy(in0, xs, n * sizeof(float)); });
  }
  std::vector<BlockSaved> saved;
  for (std::int64_t l = 0; l < s_.layers; ++l) {
    const auto i = static_cast<std::size_t>(l);
    where_ = "h." + std::to_string(l);
    BlockSaved b = block_forward(l, x, i + 1 < ins.size() ? ins[i + 1] : memory());
    b.ln1.src = training_ ? ins[i] : x;  // ln_1 normalized the stream before the block added
    saved.push_back(std::move(b));
  }
  where_ = "transformer.ln_f";
  const memory xf = kept("xf", {M_, C}, act_);
  const LnSaved lnf = ln_forward(x, m_.ln_f(), m_.ln_f_bias(), xf);
  where_ = "lm_head";
  memory dxf = training_ ? plain({M_, C}, act_) : memory();
  head(xf, dxf);
  if (!training_) return;

  memory dx = plain({M_, C}, Dt::f32);
  where_ = "transformer.ln_f";
  ln_backward(lnf, dxf, dx, false);
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
