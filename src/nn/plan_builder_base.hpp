// Private to src/nn: what every plan builder shares — the plan being built, the engine, the
// activations' type, buffers, adding a primitive or a plain function to a list of steps, a reorder,
// the weights' shared copies in the primitives' layouts, the user scratchpad — for PlanBuilder (the
// layer lists', plan_builder.hpp) and GptPlanBuilder (the language model's, gpt_plan_builder.hpp).
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "plan.hpp"
#include "weight_pairs.hpp"

namespace cohort::nn::detail {

class PlanBuilderBase {
 public:
  using memory = dnnl::memory;
  using Tag = memory::format_tag;
  using Dt = memory::data_type;

  // The step being built ("conv1 forward", "h.0.attn"): named in errors.
  const std::string& where() const { return where_; }

 protected:
  PlanBuilderBase(Plan& plan, const dnnl::engine& engine, Precision precision,
                  WeightCopies& weight_copies, dnnl::stream* stream)
      : p_(plan),
        eng_(engine),
        act_(precision == Precision::kBf16 ? Dt::bf16 : Dt::f32),
        weight_copies_(weight_copies),
        stream_(stream) {}

  // The plan's attributes: a user scratchpad (a task may move between threads). A new object
  // each call: a copy would share its handle.
  static dnnl::primitive_attr attr() {
    dnnl::primitive_attr a;
    a.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    return a;
  }
  // A buffer of `bytes` the plan owns.
  float* buffer(std::size_t bytes) {
    return p_.arrays.allocate_array<float>((bytes + sizeof(float) - 1) / sizeof(float));
  }
  memory new_memory(const memory::desc& md) { return memory(md, eng_, buffer(md.get_size())); }
  void add(std::vector<Exec>& list, dnnl::primitive prim, const memory::desc& scratch,
           std::unordered_map<int, memory> args, Phase phase) {
    scratch_bytes_ = std::max(scratch_bytes_, scratch.get_size());
    list.push_back({std::move(prim), std::move(args), phase, scratch, {}, where_});
  }
  void custom(std::vector<Exec>& list, std::function<void()> f, Phase phase = Phase::kOther) {
    list.push_back({{}, {}, phase, {}, std::move(f), where_});
  }
  // `to` = `from` in to's layout and element type (f32 <-> bf16), element for element.
  void reorder(std::vector<Exec>& list, const memory& from, const memory& to) {
    dnnl::reorder::primitive_desc pd(eng_, from.get_desc(), eng_, to.get_desc(), attr());
    add(list, dnnl::reorder(pd), pd.scratchpad_desc(), {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}},
        Phase::kOther);
  }
  // A copy of the weight at `weight` in layout `md` (from `from`: the parameters' view, or
  // another copy), shared with the net's other plans and the nets sharing them (WeightCopies),
  // written by a prepare step of this plan (once a plan) where it is stale.
  memory weight_copy(const memory& from, std::size_t weight, const memory::desc& md) {
    // Pair blocks from the parameters' view (`from` another copy is not a plain layout).
    const std::optional<PairBlocks> blocks = pair_blocks(from.get_desc(), md);
    WeightCopies::Copy& copy = weight_copies_.get(weight, md, eng_, blocks);
    const bool written = std::any_of(prepared_copies_.begin(), prepared_copies_.end(),
                                     [&](const memory& m) { return m == copy.memory; });
    if (written) return copy.memory;  // once a plan: its steps read the same copy
    prepared_copies_.push_back(copy.memory);
    WeightCopies* copies = &weight_copies_;
    const Plan* plan = &p_;
    if (blocks) {
      custom(p_.prepare, [copies, &copy, from, to = copy.memory, plan, b = *blocks] {
        copies->write(copy, plan->bound_params, [&] {
          to_pair_blocks(b, static_cast<const bf16*>(from.get_data_handle()),
                         static_cast<bf16*>(to.get_data_handle()));
        });
      });
      return copy.memory;
    }
    // The reorder, run by WeightCopies::write (on the net's stream; a reorder between plain and
    // blocked layouts asks for no scratchpad, and one that did would get its own).
    const dnnl::reorder::primitive_desc pd(eng_, from.get_desc(), eng_, md, attr());
    const memory scratch(pd.scratchpad_desc(), eng_, buffer(pd.scratchpad_desc().get_size()));
    const dnnl::reorder prim(pd);
    dnnl::stream* stream = stream_;
    custom(p_.prepare, [copies, &copy, prim, from, to = copy.memory, scratch, stream, plan] {
      copies->write(copy, plan->bound_params, [&] {
        prim.execute(*stream,
                     {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}, {DNNL_ARG_SCRATCHPAD, scratch}});
        stream->wait();
      });
    });
    return copy.memory;
  }
  // The end of a build: one scratchpad for the plan, as large as the largest primitive's need,
  // bound to every primitive that needs one.
  void bind_scratchpad() {
    p_.scratchpad = AlignedBuffer<std::uint8_t>(scratch_bytes_);
    std::vector<std::vector<Exec>*> lists{&p_.prepare, &p_.forward, &p_.backward};
    for (Plan::HeadChunk& c : p_.head_chunks) lists.insert(lists.end(), {&c.forward, &c.backward});
    for (auto* list : lists)
      for (Exec& e : *list)
        if (!e.custom && e.scratchpad_md.get_size() != 0)
          e.args.insert({DNNL_ARG_SCRATCHPAD, memory(e.scratchpad_md, eng_, p_.scratchpad.data())});
  }

  Plan& p_;
  const dnnl::engine& eng_;
  const Dt act_;  // activations, input and parameters: f32, or bf16 for a bf16 plan
  std::size_t scratch_bytes_ = 0;
  std::string where_;
  WeightCopies& weight_copies_;
  dnnl::stream* stream_;
  std::vector<memory> prepared_copies_;  // weight copies this plan's prepare steps write
};

}  // namespace cohort::nn::detail
