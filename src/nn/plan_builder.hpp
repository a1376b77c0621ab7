// Private to src/nn: PlanBuilder, the object that builds one Plan (plan.hpp), shared by the files
// that build the steps of its layer kinds: plan_builder.cpp (the plan itself, linear, conv,
// pooling, ReLU, flatten, dropout) and plan_resnet.cpp (batch normalization, global average
// pooling, residual blocks). Not an interface: one builder lives for one build_plan call.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cohort/nn/linear_floor.hpp"
#include "cohort/nn/max_pool.hpp"
#include "plan.hpp"
#include "plan_builder_base.hpp"

namespace cohort::nn::detail {

// Builds one plan; a helper object so the many small steps share their context.
class PlanBuilder : public PlanBuilderBase {
 public:
  using Kind = LayerSpec::Kind;

  PlanBuilder(const PlanRequest& r, Plan& plan)
      : PlanBuilderBase(plan, *r.engine, r.precision, *r.weight_copies, r.stream),
        model_(*r.model),
        key_(r.key),
        linear_rows_(r.linear_rows),
        batch_linear_(r.batch_linear),
        N_(r.N),
        training_(r.training),
        blocked_(r.blocked) {}

  void build();

 private:
  // What backward needs from a layer's forward.
  struct Saved {
    const LayerSpec* layer = nullptr;
    memory src, dst;                     // the layer's input and output as the layer saw them
    memory weights;                      // linear/conv weights in the primitive's format
    memory user_weights;                 // the parameters' view of them
    dnnl::primitive_desc_base fwd_pd;    // res: its final ReLU's
    memory workspace;                    // max pooling on oneDNN; bn with its ReLU fused
    std::optional<MaxPoolShape> pool;    // max pooling on cohort's kernel
    std::uint8_t* pool_where = nullptr;  // its window index of each maximum (training)
    memory mask;                         // dropout: f32, in the output's layout
    memory::desc flat_src_md;            // flatten, gap: the plain (N, C, H, W) view of the output
    memory pooled;                       // gap: the pooling's own output, (N, C, 1, 1)
    memory scale, shift;                 // bn: f32 (C)
    memory mean, var;                    // bn: f32 (C), views into the caller's statistics
    std::vector<Saved> body, shortcut;   // res: its sub-layers
  };

  // plan_builder.cpp
  Saved forward(const LayerSpec& l, std::size_t index, memory cur, bool last);
  memory backward(const Saved& s, bool first, memory diff);
  void add_weighted(dnnl::primitive prim, const memory::desc& scratch, const Saved& s,
                    const memory& bias);
  void apply_mask(std::vector<Exec>& list, const memory& x, const memory& mask);
  memory backward_data_linear(const Saved& s, const memory& diff,
                              const dnnl::inner_product_forward::primitive_desc& fwd);
  // relu_dst: the output of a ReLU fused into this linear layer's forward whose backward runs
  // here, in the same pass (null: none; unset for the first layer: dz is kept only as rows).
  void keep_rows(const Saved& s, const memory& diff, std::size_t ordinal, const memory& relu_dst,
                 bool first);
  std::optional<MaxPoolShape> max_pool_shape(const LayerSpec& l, const memory& src,
                                             const memory& dst) const;
  void add_max_pool_forward(Saved& s);
  memory add_max_pool_backward(const Saved& s, const memory& diff);

  // plan_resnet.cpp
  Saved forward_bn(const LayerSpec& l, memory cur);
  memory backward_bn(const Saved& s, memory diff);
  Saved forward_gap(const LayerSpec& l, memory cur);
  memory backward_gap(const Saved& s, memory diff);
  Saved forward_res(const LayerSpec& l, std::size_t index, memory cur);
  memory backward_res(const Saved& s, bool first, memory diff);
  memory param_f32(const memory::desc& f32_md, std::size_t offset);
  // run = false: the ReLU runs fused into the step before it; only its description is made.
  void add_relu_forward(memory x, Saved& s, bool run = true);
  void add_relu_backward(const Saved& s, const memory& diff);
  // relu: max(a + b, 0) in the same primitive (an eltwise post-op).
  void add_sum(std::vector<Exec>& list, const memory& a, const memory& b, const memory& dst,
               bool relu = false);

  // The plan's attributes (user scratchpad), with max(x, 0) as a post-op when `relu`. A new
  // object each time: a copy of attr_ would share its handle.
  dnnl::primitive_attr attr_with_relu(bool relu) const {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (relu) {
      dnnl::post_ops ops;
      ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
      attr.set_post_ops(ops);
    }
    return attr;
  }
  // `m` in layout (and element type) `want`: itself, or a reorder into a new buffer appended to
  // `list`.
  memory ensure(const memory& m, const memory::desc& want, std::vector<Exec>& list) {
    if (m.get_desc() == want) return m;
    memory out = new_memory(want);
    reorder(list, m, out);
    return out;
  }
  // A layer's weights in layout `md`: the parameters' view, or their copy in that layout,
  // reordered once a step for every plan and replica (weight_copy), not once a pass.
  memory weights_as(const Saved& s, const memory::desc& md) {
    if (s.user_weights.get_desc() == md) return s.user_weights;
    if (s.weights && s.weights.get_desc() == md) return s.weights;
    return weight_copy(s.user_weights, s.layer->weight, md);
  }
  // A linear layer's weights as its forward and backward-data ask for them: the layout oneDNN
  // chooses where plans_choose_layout says so (its brgemm kernels rather than the gemm-based
  // kernel of plain weights; docs/decisions.md, "Plain vs blocked layouts"); else `plain`, the
  // stored (IC, OC).
  memory::desc linear_weights(const memory::desc& plain) const {
    const Precision p = act_ == Dt::bf16 ? Precision::kBf16 : Precision::kF32;
    if (!plans_choose_layout(p, blocked_)) return plain;
    return memory::desc(plain.dims(), act_, Tag::any);
  }
  memory external(std::vector<External>& list, const memory::desc& md, std::size_t offset) {
    memory m(md, eng_, DNNL_MEMORY_NONE);
    list.push_back({m, offset});
    return m;
  }

  // A layout oneDNN may choose (blocked), or plain nchw / oihw when blocked layouts are off;
  // elements of the activations' type unless told.
  memory::desc any(memory::dims dims) const { return any(std::move(dims), act_); }
  memory::desc any(memory::dims dims, Dt dt) const {
    return memory::desc(dims, dt, blocked_ ? Tag::any : Tag::abcd);
  }
  memory::dims image(const SampleShape& s) const { return {N_, s.C, s.H, s.W}; }

  const Model& model_;
  const StreamKey* key_;
  const std::span<const LinearRows>* linear_rows_;
  const bool batch_linear_;
  std::map<const LayerSpec*, std::size_t> linear_of_;    // linear layer -> its ordinal
  std::set<const LayerSpec*> relu_fused_into_previous_;  // ReLUs run as a linear's post-op
  bool fuse_relu_ = false;                   // the layer being built ends with a fused ReLU
  std::set<const LayerSpec*> relu_in_pool_;  // ReLUs run inside cohort's max pooling before them
  std::set<const LayerSpec*> relu_in_bn_;    // ReLUs run inside the batch normalization before them
  memory relu_for_rows_;  // backward: a ReLU's output whose backward the linear layer's rows run
  const LayerSpec* next_ = nullptr;  // the layer after the one being built, in order
  const std::int64_t N_;
  const bool training_;
  const bool blocked_;
};

}  // namespace cohort::nn::detail
