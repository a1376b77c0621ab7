// The plan steps of the layers residual networks add: batch normalization, global average
// pooling and the residual block, a composite built from the other kinds' steps. Part of
// PlanBuilder (plan_builder.hpp); builds steps, runs nothing.
// bn runs oneDNN's batch_normalization on the layout its input has (a convolution's blocked
// layout, or plain (N, C) after a linear layer), with f32 scale, shift and statistics in both
// precisions; a ReLU right after it runs inside it (fuse_norm_relu: forward writes max(y, 0) and
// a mask of y > 0 as its workspace, backward applies the mask in the same pass), one pass over
// the activations fewer each way. Training normalizes with the statistics of the plan's own N rows
// (ghost batch normalization) and writes them into the caller's batch_stats; inference reads the
// caller's running statistics.
#include <oneapi/dnnl/dnnl.hpp>

#include "plan_builder.hpp"

namespace cohort::nn::detail {

namespace {

// PyTorch's BatchNorm default.
constexpr float kBnEpsilon = 1e-5f;

}  // namespace

// An f32 (C) tensor of the flat parameter array: a view of it in an f32 Net; in a bf16 Net (the
// array is the bf16 copy) a buffer the bf16 values are converted into by a step of every forward.
PlanBuilder::memory PlanBuilder::param_f32(const memory::desc& f32_md, std::size_t offset) {
  memory user = external(p_.params, memory::desc(f32_md.dims(), act_, Tag::x), offset);
  if (act_ == Dt::f32) return user;
  memory converted = new_memory(f32_md);
  reorder(p_.forward, user, converted);
  return converted;
}

PlanBuilder::Saved PlanBuilder::forward_bn(const LayerSpec& l, memory cur) {
  using Flags = dnnl::normalization_flags;
  Saved s;
  s.layer = &l;
  s.src = cur;  // (N, C, H, W) in the layout the layer before produced, or (N, C)
  const memory::desc c_md({l.in.C}, Dt::f32, Tag::x);
  const auto prop =
      training_ ? dnnl::prop_kind::forward_training : dnnl::prop_kind::forward_inference;
  // Training computes the mean and the biased variance of these N rows (outputs); inference
  // takes the running statistics (inputs).
  const bool fuse_relu = next_ != nullptr && next_->kind == LayerSpec::Kind::kReLU;
  Flags flags = training_ ? Flags::use_scale | Flags::use_shift
                          : Flags::use_scale | Flags::use_shift | Flags::use_global_stats;
  if (fuse_relu) flags = flags | Flags::fuse_norm_relu;
  dnnl::batch_normalization_forward::primitive_desc pd({prop, cur.get_desc(), kBnEpsilon, flags},
                                                       attr(), eng_);
  if (fuse_relu) relu_in_bn_.insert(next_);
  s.scale = param_f32(c_md, l.weight);  // gamma, (C)
  s.shift = param_f32(c_md, l.bias);    // beta, (C)
  s.mean = external(p_.stats, pd.mean_desc(), l.running_mean);
  s.var = external(p_.stats, pd.variance_desc(), l.running_var);
  s.dst = new_memory(pd.dst_desc());  // not in place: backward needs the input
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, s.src},     {DNNL_ARG_DST, s.dst},
                                       {DNNL_ARG_SCALE, s.scale}, {DNNL_ARG_SHIFT, s.shift},
                                       {DNNL_ARG_MEAN, s.mean},   {DNNL_ARG_VARIANCE, s.var}};
  if (fuse_relu && training_) {  // the ReLU's mask, for backward
    s.workspace = new_memory(pd.workspace_desc());
    args.insert({DNNL_ARG_WORKSPACE, s.workspace});
  }
  add(p_.forward, dnnl::batch_normalization_forward(pd), pd.scratchpad_desc(), std::move(args),
      Phase::kOther);
  s.fwd_pd = pd;
  return s;
}

// diff: in the layout of the output (= of the input). Writes the scale and shift gradients (f32)
// into grad; returns the input gradient, through the batch statistics (prop_kind::backward).
PlanBuilder::memory PlanBuilder::backward_bn(const Saved& s, memory diff) {
  using Flags = dnnl::normalization_flags;
  const LayerSpec& l = *s.layer;
  auto fwd = dnnl::batch_normalization_forward::primitive_desc(s.fwd_pd.get());
  const memory::desc c_md({l.in.C}, Dt::f32, Tag::x);
  // With the ReLU fused (its workspace), diff is the ReLU output's gradient.
  const Flags flags = s.workspace ? Flags::use_scale | Flags::use_shift | Flags::fuse_norm_relu
                                  : Flags::use_scale | Flags::use_shift;
  dnnl::batch_normalization_backward::primitive_desc pd(
      {dnnl::prop_kind::backward, diff.get_desc(), s.src.get_desc(), kBnEpsilon, flags}, attr(),
      eng_, fwd);
  // Not in place: in a residual block the output gradient also feeds the shortcut.
  memory diff_src = new_memory(pd.diff_src_desc());
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, s.src},
                                       {DNNL_ARG_MEAN, s.mean},
                                       {DNNL_ARG_VARIANCE, s.var},
                                       {DNNL_ARG_DIFF_DST, diff},
                                       {DNNL_ARG_SCALE, s.scale},
                                       {DNNL_ARG_SHIFT, s.shift},
                                       {DNNL_ARG_DIFF_SRC, diff_src},
                                       {DNNL_ARG_DIFF_SCALE, external(p_.grads, c_md, l.weight)},
                                       {DNNL_ARG_DIFF_SHIFT, external(p_.grads, c_md, l.bias)}};
  if (s.workspace) args.insert({DNNL_ARG_WORKSPACE, s.workspace});
  add(p_.backward, dnnl::batch_normalization_backward(pd), pd.scratchpad_desc(), std::move(args),
      Phase::kOther);
  return diff_src;
}

// Average pooling over the whole H x W, then, as flatten does, plain (N, C, 1, 1) viewed as
// (N, C) for the linear layer that follows.
PlanBuilder::Saved PlanBuilder::forward_gap(const LayerSpec& l, memory cur) {
  const auto prop =
      training_ ? dnnl::prop_kind::forward_training : dnnl::prop_kind::forward_inference;
  Saved s;
  s.layer = &l;
  s.src = cur;
  const memory::dims k{l.in.H, l.in.W}, one{1, 1}, zero{0, 0};
  dnnl::pooling_forward::primitive_desc pd(
      {prop, dnnl::algorithm::pooling_avg_exclude_padding, cur.get_desc(), any({N_, l.in.C, 1, 1}),
       one, k, zero, zero},
      attr(), eng_);
  s.pooled = new_memory(pd.dst_desc());  // (N, C, 1, 1)
  add(p_.forward, dnnl::pooling_forward(pd), pd.scratchpad_desc(),
      {{DNNL_ARG_SRC, cur}, {DNNL_ARG_DST, s.pooled}}, Phase::kOther);
  s.flat_src_md = memory::desc({N_, l.in.C, 1, 1}, act_, Tag::nchw);
  memory plain = ensure(s.pooled, s.flat_src_md, p_.forward);
  s.dst = memory(memory::desc({N_, l.in.C}, act_, Tag::nc), eng_, plain.get_data_handle());
  s.fwd_pd = pd;
  return s;
}

PlanBuilder::memory PlanBuilder::backward_gap(const Saved& s, memory diff) {
  const LayerSpec& l = *s.layer;
  auto fwd = dnnl::pooling_forward::primitive_desc(s.fwd_pd.get());
  memory plain(s.flat_src_md, eng_, diff.get_data_handle());  // (N, C) is (N, C, 1, 1)
  memory dd = ensure(plain, s.pooled.get_desc(), p_.backward);
  const memory::dims k{l.in.H, l.in.W}, one{1, 1}, zero{0, 0};
  dnnl::pooling_backward::primitive_desc pd(
      {dnnl::algorithm::pooling_avg_exclude_padding, s.src.get_desc(), s.pooled.get_desc(), one, k,
       zero, zero},
      attr(), eng_, fwd);
  memory diff_src = new_memory(pd.diff_src_desc());
  add(p_.backward, dnnl::pooling_backward(pd), pd.scratchpad_desc(),
      {{DNNL_ARG_DIFF_DST, dd}, {DNNL_ARG_DIFF_SRC, diff_src}}, Phase::kOther);
  return diff_src;
}

// ReLU in place on x, kept for backward as s.dst (relu'(x) = [y > 0]).
void PlanBuilder::add_relu_forward(memory x, Saved& s, bool run) {
  const auto prop =
      training_ ? dnnl::prop_kind::forward_training : dnnl::prop_kind::forward_inference;
  dnnl::eltwise_forward::primitive_desc pd(
      {prop, dnnl::algorithm::eltwise_relu_use_dst_for_bwd, x.get_desc(), 0.0f}, attr(), eng_);
  if (run)
    add(p_.forward, dnnl::eltwise_forward(pd), pd.scratchpad_desc(),
        {{DNNL_ARG_SRC, x}, {DNNL_ARG_DST, x}}, Phase::kEltwise);
  s.dst = x;
  s.fwd_pd = pd;
}

void PlanBuilder::add_relu_backward(const Saved& s, const memory& diff) {
  auto fwd = dnnl::eltwise_forward::primitive_desc(s.fwd_pd.get());
  dnnl::eltwise_backward::primitive_desc pd(
      {dnnl::algorithm::eltwise_relu_use_dst_for_bwd, s.dst.get_desc(), s.dst.get_desc(), 0.0f},
      attr(), eng_, fwd);
  add(p_.backward, dnnl::eltwise_backward(pd), pd.scratchpad_desc(),
      {{DNNL_ARG_DST, s.dst}, {DNNL_ARG_DIFF_DST, diff}, {DNNL_ARG_DIFF_SRC, diff}},
      Phase::kEltwise);
}

// dst = a + b (relu: max(a + b, 0), rounded to dst's type after the max, which is the max of
// the rounded sum) on oneDNN's binary add; a, b and dst share one layout (dst may be a: in place).
void PlanBuilder::add_sum(std::vector<Exec>& list, const memory& a, const memory& b,
                          const memory& dst, bool relu) {
  dnnl::binary::primitive_desc pd(
      {dnnl::algorithm::binary_add, a.get_desc(), b.get_desc(), dst.get_desc()},
      attr_with_relu(relu), eng_);
  add(list, dnnl::binary(pd), pd.scratchpad_desc(),
      {{DNNL_ARG_SRC_0, a}, {DNNL_ARG_SRC_1, b}, {DNNL_ARG_DST, dst}}, Phase::kEltwise);
}

// relu(body(x) + shortcut(x)): the body's and the shortcut's steps as their own layers build
// them (a ReLU after a bn inside them fused into it), the sum in the body output's layout (the
// shortcut's reordered to it if it differs) with the ReLU in the same primitive.
PlanBuilder::Saved PlanBuilder::forward_res(const LayerSpec& l, std::size_t index, memory cur) {
  Saved s;
  s.layer = &l;
  s.src = cur;
  const LayerSpec* const after = next_;  // the layer after the block
  const auto run = [&](const std::vector<LayerSpec>& layers, std::vector<Saved>& saved) {
    memory x = cur;
    for (std::size_t k = 0; k < layers.size(); ++k) {
      where_ = layers[k].name + " forward";
      next_ = k + 1 < layers.size() ? &layers[k + 1] : nullptr;
      saved.push_back(forward(layers[k], index, x, /*last=*/false));
      x = saved.back().dst;
    }
    return x;
  };
  memory body = run(l.body, s.body);
  memory shortcut = run(l.shortcut, s.shortcut);  // the identity, or conv1x1-bn
  next_ = after;
  where_ = l.name + " forward";
  shortcut = ensure(shortcut, body.get_desc(), p_.forward);
  memory sum = new_memory(body.get_desc());  // (N, OC, OH, OW)
  add_sum(p_.forward, body, shortcut, sum, /*relu=*/true);
  add_relu_forward(sum, s, /*run=*/false);  // the description its backward needs
  return s;
}

// ReLU backward in place on the output gradient, which then goes back through the body and
// through the shortcut (or the identity); the two input gradients are summed in place into the
// body's (the first layer's input needs neither).
PlanBuilder::memory PlanBuilder::backward_res(const Saved& s, bool first, memory diff) {
  add_relu_backward(s, diff);
  memory body = diff;
  for (std::size_t k = s.body.size(); k-- > 0;) {
    where_ = s.body[k].layer->name + " backward";
    body = backward(s.body[k], first && k == 0, body);
  }
  memory shortcut = diff;
  for (std::size_t k = s.shortcut.size(); k-- > 0;) {
    where_ = s.shortcut[k].layer->name + " backward";
    shortcut = backward(s.shortcut[k], first && k == 0, shortcut);
  }
  where_ = s.layer->name + " backward";
  if (first) return {};
  shortcut = ensure(shortcut, body.get_desc(), p_.backward);
  add_sum(p_.backward, body, shortcut, body);
  return body;
}

}  // namespace cohort::nn::detail
