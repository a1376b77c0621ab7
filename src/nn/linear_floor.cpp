// The linear layers' inner products on the plans' plain weights and on oneDNN's chosen layout; see
// cohort/nn/linear_floor.hpp.
#include "cohort/nn/linear_floor.hpp"

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <unordered_map>

#include "cohort/core/best_of.hpp"
#include "cohort/nn/version.hpp"

namespace cohort::nn {

namespace {

using dnnl::memory;
using Tag = memory::format_tag;
using Dt = memory::data_type;
using Clock = std::chrono::steady_clock;

// A zeroed memory of `md` (zeros: the timing does not depend on the values).
memory zeroed(const memory::desc& md, const dnnl::engine& e) {
  memory m(md, e);
  std::memset(m.get_data_handle(), 0, md.get_size());
  return m;
}

}  // namespace

std::vector<LinearTiming> time_linear_layouts(const Model& model, Precision precision,
                                              std::int64_t rows, bool leaf_weight_grads) {
  std::vector<LinearTiming> out;
  const std::vector<LayerSpec>& layers = model.layers();
  if (layers.empty()) return out;
  const dnnl::engine e(dnnl::engine::kind::cpu, 0);
  dnnl::stream s(e);
  const Dt act = precision == Precision::kBf16 ? Dt::bf16 : Dt::f32;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const LayerSpec& l = layers[i];
    if (l.kind != LayerSpec::Kind::kLinear) continue;
    const bool last = i + 1 == layers.size();
    const bool relu = !last && layers[i + 1].kind == LayerSpec::Kind::kReLU;
    const memory::desc src({rows, l.in.C}, act, Tag::nc), bias({l.out.C}, act, Tag::x);
    const memory::desc dst({rows, l.out.C}, last ? Dt::f32 : act, Tag::nc);
    const memory::desc diff({rows, l.out.C}, act, Tag::nc);  // the plans' output gradient
    const memory::desc plain({l.out.C, l.in.C}, act, Tag::io);
    const memory::desc plain_dw({l.out.C, l.in.C}, Dt::f32, Tag::io),
        db({l.out.C}, Dt::f32, Tag::x);
    // A scratchpad of the primitive's own, as the plans bind one (with oneDNN's default, each
    // call would allocate its own: time that the plans never spend).
    dnnl::primitive_attr attr, backward_attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    backward_attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (relu) {
      dnnl::post_ops ops;
      ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
      attr.set_post_ops(ops);
    }
    // One pass in one layout: its primitive, its arguments, its best time.
    auto time = [&](LinearTiming::Pass pass, bool chosen) {
      const memory::desc w = chosen ? memory::desc({l.out.C, l.in.C}, act, Tag::any) : plain;
      const dnnl::inner_product_forward::primitive_desc fwd(
          {dnnl::prop_kind::forward_training, src, w, bias, dst}, attr, e);
      std::unordered_map<int, memory> args;
      dnnl::primitive p;
      memory::desc scratch;
      if (pass == LinearTiming::Pass::kForward) {
        p = dnnl::inner_product_forward(fwd);
        scratch = fwd.scratchpad_desc();
        args = {{DNNL_ARG_SRC, zeroed(src, e)},
                {DNNL_ARG_WEIGHTS, zeroed(fwd.weights_desc(), e)},
                {DNNL_ARG_BIAS, zeroed(bias, e)},
                {DNNL_ARG_DST, zeroed(dst, e)}};
      } else if (pass == LinearTiming::Pass::kBackwardData) {
        const dnnl::inner_product_backward_data::primitive_desc pd({src, w, diff}, backward_attr, e,
                                                                   fwd);
        p = dnnl::inner_product_backward_data(pd);
        scratch = pd.scratchpad_desc();
        args = {{DNNL_ARG_DIFF_DST, zeroed(diff, e)},
                {DNNL_ARG_WEIGHTS, zeroed(pd.weights_desc(), e)},
                {DNNL_ARG_DIFF_SRC, zeroed(src, e)}};
      } else {
        const memory::desc dw =
            chosen ? memory::desc({l.out.C, l.in.C}, Dt::f32, Tag::any) : plain_dw;
        const dnnl::inner_product_backward_weights::primitive_desc pd({src, dw, db, diff},
                                                                      backward_attr, e, fwd);
        p = dnnl::inner_product_backward_weights(pd);
        scratch = pd.scratchpad_desc();
        args = {{DNNL_ARG_SRC, zeroed(src, e)},
                {DNNL_ARG_DIFF_DST, zeroed(diff, e)},
                {DNNL_ARG_DIFF_WEIGHTS, zeroed(pd.diff_weights_desc(), e)},
                {DNNL_ARG_DIFF_BIAS, zeroed(db, e)}};
      }
      if (scratch.get_size() != 0) args.insert({DNNL_ARG_SCRATCHPAD, zeroed(scratch, e)});
      return best_of([&] {
        const auto t0 = Clock::now();
        p.execute(s, args);
        s.wait();
        return std::chrono::duration<double>(Clock::now() - t0).count();
      });
    };
    std::vector<LinearTiming::Pass> passes{LinearTiming::Pass::kForward};
    if (i != 0) passes.push_back(LinearTiming::Pass::kBackwardData);
    if (leaf_weight_grads) passes.push_back(LinearTiming::Pass::kBackwardWeights);
    for (const LinearTiming::Pass pass : passes)
      out.push_back({i, pass, time(pass, false), time(pass, true)});
  }
  return out;
}

bool plans_choose_layout(Precision precision, bool blocked_layouts) {
  static const bool rule = choose_linear_layout(onednn_isa().find("amx") != std::string::npos,
                                                bf16_support() == Bf16Support::kNative);
  return precision == Precision::kBf16 && blocked_layouts && rule;
}

LinearTotals linear_totals(const std::vector<LinearTiming>& timings, bool plans_choose) {
  LinearTotals sum;
  for (const LinearTiming& t : timings) {
    sum.plain_seconds += t.plain_seconds;
    sum.best_seconds += std::min(t.plain_seconds, t.chosen_seconds);
    const bool chosen = plans_choose && t.pass != LinearTiming::Pass::kBackwardWeights;
    sum.run_seconds += chosen ? t.chosen_seconds : t.plain_seconds;
  }
  return sum;
}

}  // namespace cohort::nn
