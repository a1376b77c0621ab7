// Building a Net's plan for one batch size: oneDNN 2.6 primitive descriptors (operation
// descriptors, the v2 API), primitives, activation buffers and the memory objects bound to them,
// as two lists of steps (forward, backward). Nothing here runs a step; net.cpp does.
// Layouts: convolutions and pooling let oneDNN choose (format_tag::any, blocked formats such as
// nChw16c); reorders happen only at the edges — the input images (nchw), the flat parameter
// array (oihw / io, shared by every replica, so convolutions' weights are reordered per pass into
// the primitive's format and weight gradients back), and flatten (to plain nchw). Inner products
// and the loss work on plain (N, F); bf16 inner products take their weights in oneDNN's chosen
// layout, from copies the replicas share (WeightCopies: reordered once a step, or kept current by
// the trainer's root).
// Precision kBf16: activations, the input and the parameters are bf16; weight and bias gradients
// are f32 (oneDNN's backward-weights with bf16 src/diff_dst and f32 diff_weights); the logits
// are f32 (the last inner product has an f32 dst, or a reorder converts), their gradient is
// converted to bf16 on the way back.
// The layers of residual networks (bn, gap, res) are built in plan_resnet.cpp.
#include "plan_builder.hpp"

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <optional>
#include <type_traits>

#include "cohort/core/error.hpp"
#include "cohort/nn/batch_grad.hpp"
#include "cohort/nn/max_pool.hpp"
#include "cohort/tensor/bf16.hpp"

namespace cohort::nn::detail {

namespace {

using dnnl::memory;
using Tag = memory::format_tag;
using Dt = memory::data_type;
using Kind = LayerSpec::Kind;

// Input channels below which a bf16 convolution's backward-weights takes a plain nchw src.
constexpr std::int64_t kFewChannels = 4;

// `md` with the same dimensions and layout but elements of type `dt` (a dropout mask in f32
// laid out like a bf16 activation).
memory::desc with_type(memory::desc md, Dt dt) {
  md.data.data_type = static_cast<dnnl_data_type_t>(dt);
  return md;
}

}  // namespace

void PlanBuilder::build() {
  const Model& model = model_;
  const SampleShape in = model.input();
  memory::desc x_md = in.flat() ? memory::desc({N_, in.C}, act_, Tag::nc)
                                : memory::desc({N_, in.C, in.H, in.W}, act_, Tag::nchw);
  p_.x = memory(x_md, eng_, DNNL_MEMORY_NONE);
  memory cur = p_.x;
  const auto& layers = model.layers();
  // Execution order: a ReLU directly before a max pooling runs after it instead — max commutes
  // with a monotone function, so the outputs and the gradients are the same, and the ReLU
  // passes then touch a quarter of the data (conv -> relu -> maxpool(2) is the common case).
  std::vector<std::size_t> order(layers.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  for (std::size_t i = 0; i + 1 < order.size(); ++i)
    if (layers[i].kind == Kind::kReLU && layers[i + 1].kind == Kind::kMaxPool) {
      std::swap(order[i], order[i + 1]);
      ++i;
    }
  // Layers that work in place (ReLU, dropout) or view their input's buffer (flatten) must not
  // get the caller's input: it is const, and its handle changes every call while a view would
  // keep the first one. The plan copies the input into a buffer of its own for them.
  if (const Kind first = layers[order[0]].kind;
      first == Kind::kReLU || first == Kind::kDropout || first == Kind::kFlatten) {
    memory copy = new_memory(x_md);
    reorder(p_.forward, p_.x, copy);
    cur = copy;
  }
  // A ReLU right after a linear layer runs inside it, as a post-op of the inner product: the
  // output is rounded to bf16 after max(x, 0), which is the max of the rounded value, so the
  // bits are those of two steps, without a pass over the output.
  for (std::size_t k = 0; k + 1 < order.size(); ++k)
    if (layers[order[k]].kind == Kind::kLinear && layers[order[k + 1]].kind == Kind::kReLU)
      relu_fused_into_previous_.insert(&layers[order[k + 1]]);
  std::vector<Saved> saved;
  std::size_t linear_ordinal = 0;
  for (std::size_t k = 0; k < order.size(); ++k) {
    const std::size_t i = order[k];
    if (layers[i].kind == Kind::kLinear) linear_of_[&layers[i]] = linear_ordinal++;
    const LayerSpec& l = layers[i];
    where_ = l.name + " forward";
    fuse_relu_ = k + 1 < order.size() && relu_fused_into_previous_.count(&layers[order[k + 1]]);
    next_ = k + 1 < order.size() ? &layers[order[k + 1]] : nullptr;
    saved.push_back(forward(l, i, cur, /*last=*/i == order.back()));
    cur = saved.back().dst;
  }
  fuse_relu_ = false;
  next_ = nullptr;
  // The logits are f32 (N, C): a last linear layer writes them so; anything else (a bf16
  // activation) is converted here, and its gradient back by the last layer's backward.
  const std::int64_t C = model.num_classes();
  where_ = "logits";
  cur = ensure(cur, memory::desc({N_, C}, Dt::f32, Tag::nc), p_.forward);
  p_.logits = static_cast<float*>(cur.get_data_handle());
  if (training_) {
    p_.diff_logits = buffer(static_cast<std::size_t>(N_ * C) * sizeof(float));
    memory diff(memory::desc({N_, C}, Dt::f32, Tag::nc), eng_, p_.diff_logits);
    for (std::size_t k = saved.size(); k-- > 0;) {
      where_ = saved[k].layer->name + " backward";
      diff = backward(saved[k], k == 0, diff);
    }
  }
  bind_scratchpad();
}

// A forward step of a layer with parameters: src, weights and bias to dst.
void PlanBuilder::add_weighted(dnnl::primitive prim, const memory::desc& scratch, const Saved& s,
                               const memory& bias) {
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, s.src}, {DNNL_ARG_WEIGHTS, s.weights}, {DNNL_ARG_DST, s.dst}};
  if (bias) args.insert({DNNL_ARG_BIAS, bias});  // none for conv(..., nobias)
  add(p_.forward, std::move(prim), scratch, std::move(args), Phase::kMatmul);
}

// `last`: the layer whose output is the logits (a linear layer then writes f32).
PlanBuilder::Saved PlanBuilder::forward(const LayerSpec& l, std::size_t index, memory cur,
                                        bool last) {
  const auto prop =
      training_ ? dnnl::prop_kind::forward_training : dnnl::prop_kind::forward_inference;
  Saved s;
  s.layer = &l;
  s.src = cur;
  switch (l.kind) {
    case Kind::kLinear: {
      // Logical (OC, IC), stored (IC, OC) in the flat array (Model: the forward is then a
      // plain GEMM instead of one on a transposed matrix).
      memory::desc w_md({l.out.C, l.in.C}, act_, Tag::io);
      memory::desc b_md({l.out.C}, act_, Tag::x);
      memory::desc dst_md({N_, l.out.C}, last ? Dt::f32 : act_, Tag::nc);
      s.src = ensure(cur, memory::desc({N_, l.in.C}, act_, Tag::nc), p_.forward);
      dnnl::inner_product_forward::primitive_desc pd(
          {prop, s.src.get_desc(), linear_weights(w_md), b_md, dst_md}, attr_with_relu(fuse_relu_),
          eng_);
      s.user_weights = external(p_.params, w_md, l.weight);
      s.weights = weights_as(s, pd.weights_desc());
      memory b = external(p_.params, b_md, l.bias);
      s.dst = new_memory(dst_md);
      add_weighted(dnnl::inner_product_forward(pd), pd.scratchpad_desc(), s, b);
      s.fwd_pd = pd;
      return s;
    }
    case Kind::kConv: {
      const memory::dims strides{l.stride, l.stride}, pad{l.pad, l.pad};
      memory::desc b_md({l.out.C}, act_, Tag::x);
      const auto alg = dnnl::algorithm::convolution_direct;
      const memory::desc w_md = any({l.out.C, l.in.C, l.kernel, l.kernel});
      dnnl::convolution_forward::primitive_desc pd(
          l.has_bias ? dnnl::convolution_forward::desc(prop, alg, any(image(l.in)), w_md, b_md,
                                                       any(image(l.out)), strides, pad, pad)
                     : dnnl::convolution_forward::desc(prop, alg, any(image(l.in)), w_md,
                                                       any(image(l.out)), strides, pad, pad),
          attr(), eng_);
      s.src = ensure(cur, pd.src_desc(), p_.forward);
      s.user_weights =
          external(p_.params, memory::desc({l.out.C, l.in.C, l.kernel, l.kernel}, act_, Tag::oihw),
                   l.weight);
      s.weights = ensure(s.user_weights, pd.weights_desc(), p_.forward);  // every step
      memory b = l.has_bias ? external(p_.params, b_md, l.bias) : memory();
      s.dst = new_memory(pd.dst_desc());
      add_weighted(dnnl::convolution_forward(pd), pd.scratchpad_desc(), s, b);
      s.fwd_pd = pd;
      return s;
    }
    case Kind::kReLU:
      // The max pooling or batch normalization before it applied it, and runs its backward.
      if (relu_in_pool_.count(&l) || relu_in_bn_.count(&l)) {
        s.dst = cur;
        return s;
      }
      // In place; backward uses the output (relu'(x) = [y > 0]), so no input copy is kept. Fused
      // into the linear layer before it: only the description backward needs.
      add_relu_forward(cur, s, /*run=*/!relu_fused_into_previous_.count(&l));
      return s;
    case Kind::kMaxPool:
    case Kind::kAvgPool: {
      const auto alg = l.kind == Kind::kMaxPool ? dnnl::algorithm::pooling_max
                                                : dnnl::algorithm::pooling_avg_exclude_padding;
      const memory::dims k{l.kernel, l.kernel}, st{l.stride, l.stride}, zero{0, 0};
      dnnl::pooling_forward::primitive_desc pd(
          {prop, alg, cur.get_desc(), any(image(l.out)), st, k, zero, zero}, attr(), eng_);
      s.dst = new_memory(pd.dst_desc());
      if (l.kind == Kind::kMaxPool && (s.pool = max_pool_shape(l, cur, s.dst))) {
        // A ReLU after it (conv -> relu -> maxpool, reordered above) runs in the same pass, and
        // its backward inside the pooling's: two passes over the pooled output fewer each way.
        if (MaxPoolShape fused = *s.pool; next_ && next_->kind == Kind::kReLU) {
          fused.relu = true;
          if (max_pool_supported(fused)) {
            s.pool = fused;
            relu_in_pool_.insert(next_);
          }
        }
        add_max_pool_forward(s);  // cohort's kernel, in the layouts oneDNN chose
        return s;
      }
      std::unordered_map<int, memory> args{{DNNL_ARG_SRC, cur}, {DNNL_ARG_DST, s.dst}};
      if (training_ && pd.workspace_desc().get_size() != 0) {  // max: where each max came from
        s.workspace = memory(pd.workspace_desc(), eng_, buffer(pd.workspace_desc().get_size()));
        args.insert({DNNL_ARG_WORKSPACE, s.workspace});
      }
      add(p_.forward, dnnl::pooling_forward(pd), pd.scratchpad_desc(), std::move(args),
          Phase::kOther);
      s.fwd_pd = pd;
      return s;
    }
    case Kind::kFlatten: {
      // PyTorch's flatten order is (C, H, W): reorder to plain nchw, then view as (N, C*H*W). An
      // input that is (N, C) already (after gap, linear or another flatten) is kept plain.
      s.flat_src_md = cur.get_desc().dims().size() == 2
                          ? memory::desc({N_, l.out.C}, act_, Tag::nc)
                          : memory::desc(image(l.in), act_, Tag::nchw);
      memory plain = ensure(cur, s.flat_src_md, p_.forward);
      s.dst = memory(memory::desc({N_, l.out.C}, act_, Tag::nc), eng_, plain.get_data_handle());
      return s;
    }
    case Kind::kDropout: {
      s.dst = cur;
      if (!training_) return s;  // inference: the identity
      // The mask is drawn in f32 in logical (N, C, H, W) order — the same mask whatever the
      // precision — then laid out like the activation (still f32).
      const std::size_t count = static_cast<std::size_t>(N_ * l.in.numel());
      memory::desc plain_md = l.in.flat() ? memory::desc({N_, l.in.C}, Dt::f32, Tag::nc)
                                          : memory::desc(image(l.in), Dt::f32, Tag::nchw);
      memory plain(plain_md, eng_, buffer(count * sizeof(float)));
      float* plain_ptr = static_cast<float*>(plain.get_data_handle());
      const StreamKey* key = key_;
      const float p = l.p;
      custom(p_.forward,
             [key, index, p, count, plain_ptr] { dropout_mask(*key, index, p, count, plain_ptr); });
      s.mask = ensure(plain, with_type(cur.get_desc(), Dt::f32), p_.forward);
      apply_mask(p_.forward, cur, s.mask);
      return s;
    }
    case Kind::kBatchNorm:
      return forward_bn(l, cur);
    case Kind::kGap:
      return forward_gap(l, cur);
    case Kind::kResidual:
      return forward_res(l, index, cur);
  }
  COHORT_CHECK(false, "unknown layer kind");
  __builtin_unreachable();
}

namespace {
// A 4-d layout's element offsets as PoolLayout, where its channels are innermost: nhwc-like
// (channel stride 1) or one block of channels innermost (nChw16c); nothing padded.
std::optional<PoolLayout> channels_innermost(const dnnl::memory::desc& md) {
  const dnnl_memory_desc_t& d = md.data;
  if (d.ndims != 4 || d.format_kind != dnnl_blocked || d.offset0 != 0) return std::nullopt;
  for (int i = 0; i < 4; ++i)
    if (d.padded_dims[i] != d.dims[i]) return std::nullopt;
  const dnnl_blocking_desc_t& b = d.format_desc.blocking;
  if (b.inner_nblks == 0 && b.strides[1] == 1)
    return PoolLayout{d.dims[1], b.strides[0], 0, b.strides[2], b.strides[3]};
  if (b.inner_nblks == 1 && b.inner_idxs[0] == 1)
    return PoolLayout{b.inner_blks[0], b.strides[0], b.strides[1], b.strides[2], b.strides[3]};
  return std::nullopt;
}

// Calls f with a null pointer to the activations' element type: float, or bf16.
template <class F>
void with_element_type(dnnl::memory::data_type act, F f) {
  if (act == dnnl::memory::data_type::bf16)
    f(static_cast<bf16*>(nullptr));
  else
    f(static_cast<float*>(nullptr));
}
}  // namespace

// Max pooling on cohort's kernel (max_pool.hpp) where it applies: windows that tile the image,
// f32 or bf16, src and dst with their channels innermost in the same lanes.
std::optional<MaxPoolShape> PlanBuilder::max_pool_shape(const LayerSpec& l, const memory& src,
                                                        const memory& dst) const {
  if (l.kernel != l.stride) return std::nullopt;
  const auto a = channels_innermost(src.get_desc()), b = channels_innermost(dst.get_desc());
  if (!a || !b || src.get_desc().data_type() != act_ || dst.get_desc().data_type() != act_)
    return std::nullopt;
  MaxPoolShape shape{N_, l.in.C, l.in.H, l.in.W, l.kernel, *a, *b};
  if (!max_pool_supported(shape) || shape.OH() != l.out.H || shape.OW() != l.out.W)
    return std::nullopt;
  return shape;
}

void PlanBuilder::add_max_pool_forward(Saved& s) {
  std::uint8_t* where = nullptr;  // training: the window index of each maximum, laid out as dst
  if (training_) {
    const std::size_t count = s.dst.get_desc().get_size() / (act_ == Dt::bf16 ? 2 : 4);
    where = reinterpret_cast<std::uint8_t*>(buffer(count));
    s.pool_where = where;
  }
  const MaxPoolShape shape = *s.pool;
  const memory src = s.src, dst = s.dst;  // the input's handle may change between calls
  with_element_type(act_, [&](auto* type) {
    using T = std::remove_pointer_t<decltype(type)>;
    custom(p_.forward, [=] {
      max_pool_forward(shape, static_cast<const T*>(src.get_data_handle()),
                       static_cast<T*>(dst.get_data_handle()), where);
    });
  });
}

// `diff` is laid out as the forward's dst; the input's gradient as its src.
PlanBuilder::memory PlanBuilder::add_max_pool_backward(const Saved& s, const memory& diff) {
  memory diff_src = new_memory(s.src.get_desc());
  const MaxPoolShape shape = *s.pool;
  const std::uint8_t* where = s.pool_where;
  const memory dd = diff;
  with_element_type(act_, [&](auto* type) {
    using T = std::remove_pointer_t<decltype(type)>;
    custom(p_.backward, [=] {
      max_pool_backward(shape, where, static_cast<const T*>(dd.get_data_handle()),
                        static_cast<T*>(diff_src.get_data_handle()));
    });
  });
  return diff_src;
}

// x *= mask over the physical buffer (the same layout; padding is zero in both). The mask is
// f32; a bf16 x is multiplied in f32 and rounded once (to nearest even).
void PlanBuilder::apply_mask(std::vector<Exec>& list, const memory& x, const memory& mask) {
  const float* mp = static_cast<const float*>(mask.get_data_handle());
  const std::size_t n = mask.get_desc().get_size() / sizeof(float);
  if (act_ == Dt::bf16) {
    bf16* xp = static_cast<bf16*>(x.get_data_handle());
    custom(list, [xp, mp, n] {
      for (std::size_t i = 0; i < n; ++i) xp[i] = to_bf16(to_float(xp[i]) * mp[i]);
    });
  } else {
    float* xp = static_cast<float*>(x.get_data_handle());
    custom(list, [xp, mp, n] {
      for (std::size_t i = 0; i < n; ++i) xp[i] *= mp[i];
    });
  }
}

memory PlanBuilder::backward_data_linear(const Saved& s, const memory& diff,
                                         const dnnl::inner_product_forward::primitive_desc& fwd) {
  dnnl::inner_product_backward_data::primitive_desc dpd(
      {s.src.get_desc(), linear_weights(s.user_weights.get_desc()), diff.get_desc()}, attr(), eng_,
      fwd);
  memory diff_src = new_memory(s.src.get_desc());
  add(p_.backward, dnnl::inner_product_backward_data(dpd), dpd.scratchpad_desc(),
      {{DNNL_ARG_DIFF_DST, diff},
       {DNNL_ARG_WEIGHTS, weights_as(s, dpd.weights_desc())},
       {DNNL_ARG_DIFF_SRC, diff_src}},
      Phase::kMatmul);
  return diff_src;
}

// Batch weight gradients: copies the linear layer's input rows (unless the caller holds them)
// and output-gradient rows, in the activations' type, to the call's LinearRows entry
// `ordinal`. The memory objects are read when the step runs, so a rebound input is seen. With
// `relu_dst`, the ReLU after the layer (fused into its forward) has its backward here: dz is
// written as rows (in pairs, fused into the copy), and over diff unless the layer is the first.
void PlanBuilder::keep_rows(const Saved& s, const memory& diff, std::size_t ordinal,
                            const memory& relu_dst, bool first) {
  const std::span<const LinearRows>* rows = linear_rows_;
  const std::size_t x_bytes = s.src.get_desc().get_size(), dy_bytes = diff.get_desc().get_size();
  memory src = s.src, dd = diff, y = relu_dst;
  const std::int64_t n = N_, out = s.layer->out.C;
  custom(p_.backward, [=] {
    const LinearRows& r = (*rows)[ordinal];
    if (r.x) std::memcpy(r.x, src.get_data_handle(), x_bytes);
    auto* d = static_cast<bf16*>(dd.get_data_handle());
    if (y && r.dy_pairs) {
      relu_backward_to_row_pairs(static_cast<const bf16*>(y.get_data_handle()), d, n, out,
                                 static_cast<bf16*>(r.dy), /*in_place=*/!first);
      return;
    }
    if (y) relu_backward(static_cast<const bf16*>(y.get_data_handle()), d, dy_bytes / sizeof(bf16));
    if (r.dy_pairs)
      to_row_pairs(d, n, out, static_cast<bf16*>(r.dy));
    else
      std::memcpy(r.dy, dd.get_data_handle(), dy_bytes);
  });
}

// Appends the layer's backward steps; returns the gradient of its input (unset for the first
// layer, whose input needs none).
memory PlanBuilder::backward(const Saved& s, bool first, memory diff) {
  const LayerSpec& l = *s.layer;
  // A linear layer's output gradient is plain (N, OC) in the activations' type, also for the
  // last layer, whose f32 logits' gradient is converted here.
  diff = ensure(
      diff, l.kind == Kind::kLinear ? memory::desc({N_, l.out.C}, act_, Tag::nc) : s.dst.get_desc(),
      p_.backward);
  switch (l.kind) {
    case Kind::kLinear: {
      auto fwd = dnnl::inner_product_forward::primitive_desc(s.fwd_pd.get());
      if (batch_linear_) {
        keep_rows(s, diff, linear_of_.at(&l), relu_for_rows_, first);
        relu_for_rows_ = memory();
        if (first) return {};
        return backward_data_linear(s, diff, fwd);
      }
      // Weight and bias gradients in f32 whatever the activations' type.
      memory::desc dw_md({l.out.C, l.in.C}, Dt::f32, Tag::io), db_md({l.out.C}, Dt::f32, Tag::x);
      dnnl::inner_product_backward_weights::primitive_desc wpd(
          {s.src.get_desc(), dw_md, db_md, diff.get_desc()}, attr(), eng_, fwd);
      memory dw = external(p_.grads, dw_md, l.weight), db = external(p_.grads, db_md, l.bias);
      add(p_.backward, dnnl::inner_product_backward_weights(wpd), wpd.scratchpad_desc(),
          {{DNNL_ARG_SRC, s.src},
           {DNNL_ARG_DIFF_DST, diff},
           {DNNL_ARG_DIFF_WEIGHTS, dw},
           {DNNL_ARG_DIFF_BIAS, db}},
          Phase::kMatmul);
      if (first) return {};
      return backward_data_linear(s, diff, fwd);
    }
    case Kind::kConv: {
      auto fwd = dnnl::convolution_forward::primitive_desc(s.fwd_pd.get());
      const memory::dims strides{l.stride, l.stride}, pad{l.pad, l.pad};
      memory::desc b_md({l.out.C}, Dt::f32, Tag::x);
      // bf16 with few input channels (a first convolution on images): with `any` oneDNN 2.6
      // picks AMX's backward-weights on nhwc; a plain nchw src gets the avx512_core_bf16
      // kernel, which with the reorder of diff_dst it needs is the faster of the two
      // (docs/decisions.md, "f32 backward-weights where oneDNN picks AMX's"; benchmarks.md).
      const memory::desc w_src = act_ == Dt::bf16 && l.in.C < kFewChannels
                                     ? memory::desc(image(l.in), act_, Tag::nchw)
                                     : any(image(l.in));
      const memory::desc dw_md = any({l.out.C, l.in.C, l.kernel, l.kernel}, Dt::f32);
      const auto alg = dnnl::algorithm::convolution_direct;
      dnnl::convolution_backward_weights::primitive_desc wpd(
          l.has_bias ? dnnl::convolution_backward_weights::desc(
                           alg, w_src, dw_md, b_md, any(image(l.out)), strides, pad, pad)
                     : dnnl::convolution_backward_weights::desc(
                           alg, w_src, dw_md, any(image(l.out)), strides, pad, pad),
          attr(), eng_, fwd);
      memory src = ensure(s.src, wpd.src_desc(), p_.backward);
      memory dd = ensure(diff, wpd.diff_dst_desc(), p_.backward);
      memory user_dw = external(
          p_.grads, memory::desc({l.out.C, l.in.C, l.kernel, l.kernel}, Dt::f32, Tag::oihw),
          l.weight);
      const bool direct = wpd.diff_weights_desc() == user_dw.get_desc();
      memory dw = direct ? user_dw : new_memory(wpd.diff_weights_desc());
      std::unordered_map<int, memory> args{
          {DNNL_ARG_SRC, src}, {DNNL_ARG_DIFF_DST, dd}, {DNNL_ARG_DIFF_WEIGHTS, dw}};
      if (l.has_bias) args.insert({DNNL_ARG_DIFF_BIAS, external(p_.grads, b_md, l.bias)});
      add(p_.backward, dnnl::convolution_backward_weights(wpd), wpd.scratchpad_desc(),
          std::move(args), Phase::kMatmul);
      if (!direct) reorder(p_.backward, dw, user_dw);  // back to the flat (OC, IC, KH, KW)
      if (first) return {};
      dnnl::convolution_backward_data::primitive_desc dpd(
          {dnnl::algorithm::convolution_direct, any(image(l.in)),
           any({l.out.C, l.in.C, l.kernel, l.kernel}), any(image(l.out)), strides, pad, pad},
          attr(), eng_, fwd);
      memory w = ensure(s.weights, dpd.weights_desc(), p_.backward);
      memory dd2 = ensure(diff, dpd.diff_dst_desc(), p_.backward);
      memory diff_src = new_memory(dpd.diff_src_desc());
      add(p_.backward, dnnl::convolution_backward_data(dpd), dpd.scratchpad_desc(),
          {{DNNL_ARG_DIFF_DST, dd2}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_DIFF_SRC, diff_src}},
          Phase::kMatmul);
      return diff_src;
    }
    case Kind::kReLU:
      if (relu_in_pool_.count(&l) || relu_in_bn_.count(&l)) return diff;
      // bf16 with batch weight gradients: the linear layer before it (whose forward ran it)
      // runs its backward in the pass that keeps its rows (keep_rows).
      if (batch_linear_ && act_ == Dt::bf16 && relu_fused_into_previous_.count(&l) &&
          diff.get_desc() == s.dst.get_desc()) {
        relu_for_rows_ = s.dst;
        return diff;
      }
      add_relu_backward(s, diff);
      return diff;
    case Kind::kMaxPool:
    case Kind::kAvgPool: {
      if (s.pool) return add_max_pool_backward(s, diff);
      auto fwd = dnnl::pooling_forward::primitive_desc(s.fwd_pd.get());
      const auto alg = l.kind == Kind::kMaxPool ? dnnl::algorithm::pooling_max
                                                : dnnl::algorithm::pooling_avg_exclude_padding;
      const memory::dims k{l.kernel, l.kernel}, st{l.stride, l.stride}, zero{0, 0};
      dnnl::pooling_backward::primitive_desc pd(
          {alg, s.src.get_desc(), s.dst.get_desc(), st, k, zero, zero}, attr(), eng_, fwd);
      memory diff_src = new_memory(pd.diff_src_desc());
      std::unordered_map<int, memory> args{{DNNL_ARG_DIFF_DST, diff},
                                           {DNNL_ARG_DIFF_SRC, diff_src}};
      if (s.workspace) args.insert({DNNL_ARG_WORKSPACE, s.workspace});
      add(p_.backward, dnnl::pooling_backward(pd), pd.scratchpad_desc(), std::move(args),
          Phase::kOther);
      return diff_src;
    }
    case Kind::kFlatten: {
      // (N, C*H*W) is the plain (N, C, H, W); the layer before wants its own layout back.
      memory plain(s.flat_src_md, eng_, diff.get_data_handle());
      return ensure(plain, s.src.get_desc(), p_.backward);
    }
    case Kind::kDropout:
      apply_mask(p_.backward, diff, s.mask);
      return diff;
    case Kind::kBatchNorm: {
      memory diff_src = backward_bn(s, diff);
      return first ? memory() : diff_src;  // the first layer's input needs none
    }
    case Kind::kGap:
      return first ? memory() : backward_gap(s, diff);
    case Kind::kResidual:
      return backward_res(s, first, diff);
  }
  COHORT_CHECK(false, "unknown layer kind");
  __builtin_unreachable();
}

std::unique_ptr<Plan> build_plan(const PlanRequest& r) {
  // One plan built at a time in the process: replicas build theirs on their first step, and two
  // threads creating oneDNN 2.6 reorder primitive descriptors at once were seen to spin inside
  // dnnl_reorder_primitive_desc_create (resnet20 bf16, 2 workers: 12 minutes at 2 cores) and once
  // to fail it (status 3). A plan is built once per Net, so the wait costs only the first step.
  static std::mutex building;
  const std::lock_guard lock(building);
  auto p = std::make_unique<Plan>();
  PlanBuilder builder(r, *p);
  try {
    builder.build();
  } catch (const dnnl::error& e) {
    throw InternalError("oneDNN: building " + r.model->spec() + " (" +
                        std::string(r.precision == Precision::kBf16 ? "bf16" : "f32") + ") for " +
                        std::to_string(r.N) + " rows, layer " + builder.where() + ": " + e.what() +
                        " (status " + std::to_string(static_cast<int>(e.status)) + ")");
  }
  return p;
}

}  // namespace cohort::nn::detail
