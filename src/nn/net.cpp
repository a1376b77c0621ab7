// Net on oneDNN 2.6 primitives. For each batch size N a Plan is built once: primitive descriptors
// (plain formats: the weights live in the shared flat (OC, IC) array that every replica reads, so a
// blocked weight layout would cost a reorder per replica per step), primitives, activation buffers
// and memory objects bound to them. A step only rebinds the caller's pointers and executes.
// This file is the only place in cohort that includes oneDNN.
#include "cohort/nn/net.hpp"

#include <oneapi/dnnl/dnnl.hpp>

#include <chrono>
#include <map>
#include <unordered_map>

#include "cohort/core/error.hpp"
#include "cohort/nn/loss.hpp"
#include "cohort/tensor/buffer.hpp"

namespace cohort::nn {

namespace {

using dnnl::memory;
using Tag = memory::format_tag;
using Dt = memory::data_type;
using Clock = std::chrono::steady_clock;

enum class Phase { kMatmul, kEltwise };

// A memory object bound to a caller-owned array at a fixed float offset; rebound when the
// caller's base pointer changes.
struct External {
  memory mem;
  std::size_t offset;
};

struct Exec {
  dnnl::primitive prim;
  std::unordered_map<int, memory> args;
  Phase phase;
  memory::desc scratchpad_md;  // bound to the plan's scratchpad once its size is known
};

// What oneDNN needs to run one batch size: primitives in execution order, their buffers.
struct Plan {
  std::int64_t N = 0;
  std::vector<AlignedBuffer<float>> buffers;  // activations and their gradients
  AlignedBuffer<std::uint8_t> scratchpad;     // shared by all primitives: they run in sequence
  std::vector<Exec> forward, backward;
  memory x;                                   // (N, IC0), caller's input
  std::vector<External> params, grads;        // views into caller's arrays
  const float* bound_params = nullptr;
  float* bound_grad = nullptr;
  float* logits = nullptr;                    // (N, C)
  float* diff_logits = nullptr;               // (N, C)
};

}  // namespace

struct Net::Impl {
  const Model* model;
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::map<std::pair<std::int64_t, bool>, std::unique_ptr<Plan>> plans;  // (N, training)
  PhaseTimes times;

  explicit Impl(const Model& m) : model(&m) {}

  Plan& plan(std::int64_t N, bool training) {
    auto& slot = plans[{N, training}];
    if (!slot) slot = build(N, training);
    return *slot;
  }

  std::unique_ptr<Plan> build(std::int64_t N, bool training);

  void bind(Plan& p, const float* params, const float* x, float* grad) {
    p.x.set_data_handle(const_cast<float*>(x));
    if (p.bound_params != params) {
      for (auto& e : p.params) e.mem.set_data_handle(const_cast<float*>(params) + e.offset);
      p.bound_params = params;
    }
    if (grad && p.bound_grad != grad) {
      for (auto& e : p.grads) e.mem.set_data_handle(grad + e.offset);
      p.bound_grad = grad;
    }
  }

  void run(std::vector<Exec>& execs) {
    for (auto& e : execs) {
      auto t0 = Clock::now();
      e.prim.execute(stream, e.args);
      double dt = std::chrono::duration<double>(Clock::now() - t0).count();
      (e.phase == Phase::kMatmul ? times.matmul : times.eltwise) += dt;
    }
    stream.wait();
  }
};

std::unique_ptr<Plan> Net::Impl::build(std::int64_t N, bool training) {
  auto p = std::make_unique<Plan>();
  p->N = N;
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);  // one task may move between threads
  const auto prop = training ? dnnl::prop_kind::forward_training : dnnl::prop_kind::forward_inference;

  auto new_buffer = [&](std::int64_t rows, std::int64_t cols) {
    p->buffers.emplace_back(static_cast<std::size_t>(rows * cols));
    return p->buffers.back().data();
  };
  std::size_t scratch_bytes = 0;
  auto add = [&](std::vector<Exec>& list, dnnl::primitive prim, const memory::desc& scratch_md,
                 std::unordered_map<int, memory> args, Phase phase) {
    scratch_bytes = std::max(scratch_bytes, scratch_md.get_size());
    list.push_back({std::move(prim), std::move(args), phase, scratch_md});
  };
  std::string where;  // the layer being built, for error messages

  const auto& layers = model->layers();
  std::int64_t features = model->input_features();
  memory::desc cur_md({N, features}, Dt::f32, Tag::nc);
  p->x = memory(cur_md, engine, DNNL_MEMORY_NONE);
  memory cur = p->x;
  // Forward pass, remembering what backward needs.
  struct Saved {
    const LayerSpec* layer;
    memory src, dst;
    memory::desc src_md, dst_md;
    dnnl::inner_product_forward::primitive_desc ip_pd;
    dnnl::eltwise_forward::primitive_desc relu_pd;
    memory weights, bias;
  };
  std::vector<Saved> saved;
  try {
    for (const auto& l : layers) {
      where = l.name + " forward, input (" + std::to_string(N) + ", " +
              std::to_string(cur_md.dims()[1]) + ")";
      if (l.kind == LayerSpec::Kind::kLinear) {
        memory::desc w_md({l.out, l.in}, Dt::f32, Tag::oi);  // (OC, IC), the flat array's layout
        memory::desc b_md({l.out}, Dt::f32, Tag::x);        // (OC)
        memory::desc dst_md({N, l.out}, Dt::f32, Tag::nc);  // (N, OC)
        dnnl::inner_product_forward::primitive_desc pd(
            {prop, cur_md, w_md, b_md, dst_md}, attr, engine);
        memory w(w_md, engine, DNNL_MEMORY_NONE), b(b_md, engine, DNNL_MEMORY_NONE);
        p->params.push_back({w, l.weight});
        p->params.push_back({b, l.bias});
        memory dst(dst_md, engine, new_buffer(N, l.out));
        add(p->forward, dnnl::inner_product_forward(pd), pd.scratchpad_desc(),
            {{DNNL_ARG_SRC, cur}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_BIAS, b}, {DNNL_ARG_DST, dst}},
            Phase::kMatmul);
        saved.push_back({&l, cur, dst, cur_md, dst_md, pd, {}, w, b});
        cur = dst;
        cur_md = dst_md;
      } else {
        // In place; backward uses the output (relu'(x) = [y > 0]), so no input copy is kept.
        dnnl::eltwise_forward::primitive_desc pd(
            {prop, dnnl::algorithm::eltwise_relu_use_dst_for_bwd, cur_md, 0.0f}, attr, engine);
        add(p->forward, dnnl::eltwise_forward(pd), pd.scratchpad_desc(),
            {{DNNL_ARG_SRC, cur}, {DNNL_ARG_DST, cur}}, Phase::kEltwise);
        Saved s{};
        s.layer = &l;
        s.dst = cur;
        s.dst_md = cur_md;
        s.relu_pd = pd;
        saved.push_back(s);
      }
    }
    p->logits = static_cast<float*>(cur.get_data_handle());

    if (training) {
      // Backward pass in reverse; the gradient of the logits comes from the loss.
      const std::int64_t C = model->num_classes();
      p->diff_logits = new_buffer(N, C);
      memory diff(memory::desc({N, C}, Dt::f32, Tag::nc), engine, p->diff_logits);
      for (auto it = saved.rbegin(); it != saved.rend(); ++it) {
        const LayerSpec& l = *it->layer;
        where = l.name + " backward, output gradient (" + std::to_string(N) + ", " +
                std::to_string(it->dst_md.dims()[1]) + ")";
        if (l.kind == LayerSpec::Kind::kReLU) {
          dnnl::eltwise_backward::primitive_desc pd(
              {dnnl::algorithm::eltwise_relu_use_dst_for_bwd, it->dst_md, it->dst_md, 0.0f}, attr,
              engine, it->relu_pd);
          add(p->backward, dnnl::eltwise_backward(pd), pd.scratchpad_desc(),
              {{DNNL_ARG_DST, it->dst}, {DNNL_ARG_DIFF_DST, diff}, {DNNL_ARG_DIFF_SRC, diff}},
              Phase::kEltwise);
          continue;
        }
        memory::desc dw_md({l.out, l.in}, Dt::f32, Tag::oi), db_md({l.out}, Dt::f32, Tag::x);
        dnnl::inner_product_backward_weights::primitive_desc wpd(
            {it->src_md, dw_md, db_md, it->dst_md}, attr, engine, it->ip_pd);
        memory dw(dw_md, engine, DNNL_MEMORY_NONE), db(db_md, engine, DNNL_MEMORY_NONE);
        p->grads.push_back({dw, l.weight});
        p->grads.push_back({db, l.bias});
        add(p->backward, dnnl::inner_product_backward_weights(wpd), wpd.scratchpad_desc(),
            {{DNNL_ARG_SRC, it->src}, {DNNL_ARG_DIFF_DST, diff}, {DNNL_ARG_DIFF_WEIGHTS, dw},
             {DNNL_ARG_DIFF_BIAS, db}},
            Phase::kMatmul);
        if (it + 1 == saved.rend()) break;  // the input needs no gradient
        dnnl::inner_product_backward_data::primitive_desc dpd(
            {it->src_md, it->weights.get_desc(), it->dst_md}, attr, engine, it->ip_pd);
        memory diff_src(it->src_md, engine, new_buffer(N, l.in));
        add(p->backward, dnnl::inner_product_backward_data(dpd), dpd.scratchpad_desc(),
            {{DNNL_ARG_DIFF_DST, diff}, {DNNL_ARG_WEIGHTS, it->weights},
             {DNNL_ARG_DIFF_SRC, diff_src}},
            Phase::kMatmul);
        diff = diff_src;
      }
    }
  } catch (const dnnl::error& e) {
    throw InternalError("oneDNN: building " + model->spec() + ", layer " + where + ": " +
                        e.what() + " (status " +
                        std::to_string(static_cast<int>(e.status)) + ")");
  }

  // One scratchpad for the plan, as large as the largest primitive's need.
  p->scratchpad = AlignedBuffer<std::uint8_t>(scratch_bytes);
  for (auto* list : {&p->forward, &p->backward})
    for (auto& e : *list)
      if (e.scratchpad_md.get_size() != 0)
        e.args.insert({DNNL_ARG_SCRATCHPAD, memory(e.scratchpad_md, engine, p->scratchpad.data())});
  return p;
}

Net::Net(const Model& model) : impl_(std::make_unique<Impl>(model)) {}
Net::~Net() = default;
Net::Net(Net&&) noexcept = default;
Net& Net::operator=(Net&&) noexcept = default;

double Net::forward_backward(const float* params, const float* x, const std::int32_t* labels,
                             std::int64_t N, float* grad) {
  Plan& p = impl_->plan(N, /*training=*/true);
  impl_->bind(p, params, x, grad);
  impl_->run(p.forward);
  auto t0 = Clock::now();
  double loss = softmax_cross_entropy(p.logits, labels, N, impl_->model->num_classes(),
                                      p.diff_logits);
  impl_->times.loss += std::chrono::duration<double>(Clock::now() - t0).count();
  impl_->run(p.backward);
  return loss;
}

const float* Net::forward(const float* params, const float* x, std::int64_t N) {
  Plan& p = impl_->plan(N, /*training=*/false);
  impl_->bind(p, params, x, nullptr);
  impl_->run(p.forward);
  return p.logits;
}

const PhaseTimes& Net::times() const { return impl_->times; }
void Net::reset_times() { impl_->times = {}; }

}  // namespace cohort::nn
