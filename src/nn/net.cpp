// The layer lists' executor on oneDNN 2.6 primitives: plans per batch size (built by
// plan_builder.cpp), binding the caller's arrays to a plan and running its steps, the loss
// between forward and backward; and Net, the typed front of every kind's executor, with the
// precision checks of its entry points. Only src/nn includes oneDNN.
#include "cohort/nn/net.hpp"

#include <oneapi/dnnl/dnnl.hpp>

#include <chrono>
#include <map>
#include <memory>
#include <string_view>
#include <tuple>

#include "cohort/core/error.hpp"
#include "cohort/nn/loss.hpp"
#include "model_kinds.hpp"
#include "plan.hpp"

namespace cohort::nn {

using detail::Exec;
using detail::Phase;
using detail::Plan;
using Clock = std::chrono::steady_clock;

namespace {

// A layer list on oneDNN's primitives.
class LayerExecutor final : public Executor {
 public:
  const Model* model;
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  // Before the plans, which hold views of it; shared with other executors (share_weight_copies).
  std::shared_ptr<detail::WeightCopies> weight_copies = std::make_shared<detail::WeightCopies>();
  dnnl::stream stream{engine};
  // (N, training, batch weight gradients of linear layers)
  std::map<std::tuple<std::int64_t, bool, bool>, std::unique_ptr<Plan>> plans;
  PhaseTimes times_;
  Clock::time_point backward_begin_;        // of the last forward_backward
  StreamKey key;                            // the current step's dropout streams
  std::span<const LinearRows> linear_rows;  // the current call's (batch weight gradients)
  bool blocked_layouts;
  Precision precision;
  bool needs_stats;  // the model has bn layers
  // weights_changed's count: 0 until its first call (every run prepares its plan).
  std::uint64_t generation = 0;
  bool copies_owner = true;  // false after share_weight_copies

  LayerExecutor(const Model& m, bool blocked, Precision prec)
      : model(&m), blocked_layouts(blocked), precision(prec), needs_stats(m.has_batchnorm()) {}

  Plan& plan(std::int64_t N, bool training, bool batch_linear) {
    auto& slot = plans[{N, training, batch_linear}];
    if (!slot)
      slot = detail::build_plan({model, &engine, &key, &linear_rows, N, training, blocked_layouts,
                                 batch_linear, precision, weight_copies.get(), &stream});
    return *slot;
  }

  // The plan's weights in its primitives' layouts, where they may have changed since it last
  // wrote them (WeightCopies).
  void prepare(Plan& p, const void* params) {
    detail::prepare_plan(p, params, generation, *weight_copies, [&](auto& steps) { run(steps); });
  }

  // A model with bn layers needs statistics: the batch's (training) or the running ones.
  void require_stats(const float* stats, const char* what) const {
    if (!stats && needs_stats)
      throw InternalError(std::string("nn::Net: ") + what + " of " + model->spec() +
                          ", a model with bn layers, without " +
                          (std::string_view(what) == "forward" ? "running_stats" : "batch_stats"));
  }

  // params and x hold elements of the Net's precision (float or bf16); stats are floats.
  void bind(Plan& p, const void* params, const void* x, float* grad, const float* stats) {
    p.x.set_data_handle(const_cast<void*>(x));
    detail::bind_arrays(p, params, precision == Precision::kBf16 ? sizeof(bf16) : sizeof(float),
                        grad);
    if (stats && p.bound_stats != stats) {
      for (auto& e : p.stats) e.mem.set_data_handle(const_cast<float*>(stats) + e.offset);
      p.bound_stats = stats;
    }
  }

  void run(std::vector<Exec>& execs) { detail::run_steps(execs, stream, times_, model->spec()); }

  double forward_backward(const void* params, const void* x, const std::int32_t* labels,
                          std::int64_t N, float* grad, const StreamKey& k,
                          std::span<const LinearRows> rows, float* batch_stats) override {
    require_stats(batch_stats, "forward_backward");
    const bool batch_linear = !rows.empty();
    if (batch_linear) {
      std::size_t linear = 0;
      for (const auto& l : model->layers()) linear += l.kind == LayerSpec::Kind::kLinear;
      COHORT_CHECK(rows.size() == linear, "one LinearRows per linear layer");
      for (const LinearRows& r : rows)
        COHORT_CHECK(!r.dy_pairs || precision == Precision::kBf16, "row pairs are bf16 rows");
    }
    Plan& p = plan(N, /*training=*/true, batch_linear);
    key = k;
    linear_rows = rows;
    bind(p, params, x, grad, batch_stats);
    prepare(p, params);
    run(p.forward);
    auto t0 = Clock::now();
    double loss = softmax_cross_entropy(p.logits, labels, N, model->num_classes(), p.diff_logits);
    const auto t1 = Clock::now();
    times_.loss += std::chrono::duration<double>(t1 - t0).count();
    backward_begin_ = t1;
    run(p.backward);
    return loss;
  }

  const float* logits(const void* params, const void* x, std::int64_t N,
                      const float* running_stats) override {
    require_stats(running_stats, "forward");
    Plan& p = plan(N, /*training=*/false, /*batch_linear=*/false);
    bind(p, params, x, nullptr, running_stats);
    prepare(p, params);
    run(p.forward);
    return p.logits;
  }

  Evaluation evaluate(const void* params, const void* x, const std::int32_t* labels, std::int64_t N,
                      const float* running_stats) override {
    const float* z = logits(params, x, N, running_stats);  // (N, classes)
    const auto classes = model->num_classes();
    return {softmax_cross_entropy(z, labels, N, classes, nullptr),
            static_cast<double>(count_correct(z, labels, N, classes))};
  }

  void weights_changed() override {
    ++generation;
    weight_copies->changed();
  }
  void keep_weight_copies(const bf16* params) override { weight_copies->keep(params); }
  void weights_written(std::size_t begin, std::size_t end) override {
    weight_copies->refresh(begin, end);
  }

  void share_weight_copies(Executor& owner) override {
    auto* o = dynamic_cast<LayerExecutor*>(&owner);
    COHORT_CHECK(o != nullptr && plans.empty() && o->model == model && o->precision == precision &&
                     o->blocked_layouts == blocked_layouts,
                 "nn::Net::share_weight_copies: a net of the same model, precision and layouts, "
                 "before any plan");
    weight_copies = o->weight_copies;
    copies_owner = false;
    engine = o->engine;  // the copies' memory objects are on its engine
    stream = dnnl::stream(engine);
  }

  PlanMemory memory() const override {
    // Copies shared with other executors are counted by the one that made them.
    const std::size_t copies = copies_owner ? weight_copies->bytes() : 0;
    PlanMemory m{copies, 0, copies};
    for (const auto& [shape, plan] : plans) {
      const PlanMemory p = plan->memory();
      m.total += p.total;
      m.logits += p.logits;
      m.weight_copies += p.weight_copies;
    }
    return m;
  }
  const PhaseTimes& times() const override { return times_; }
  Clock::time_point backward_begin() const override { return backward_begin_; }
  void reset_times() override { times_ = {}; }
};

}  // namespace

std::unique_ptr<Executor> layer_executor(const Model& model, bool blocked_layouts,
                                         Precision precision) {
  return std::make_unique<LayerExecutor>(model, blocked_layouts, precision);
}

struct Net::Impl {
  const Model* model;
  Precision precision;
  std::unique_ptr<Executor> exec;

  void require(Precision p, const char* what) const {
    if (precision != p)
      throw InternalError(std::string("nn::Net: ") + what + " called on a " +
                          (precision == Precision::kBf16 ? "bf16" : "f32") + " Net of " +
                          model->spec());
  }

  // A bf16 Net's rows are bf16 where the kind's are (ModelKind::bf16_rows), else floats.
  void require_rows(bool bf16_rows, const char* what) const {
    if (bf16_rows != model->kind().bf16_rows())
      throw InternalError(std::string("nn::Net: ") + what + " called on a bf16 Net of " +
                          model->spec() + ", whose rows are " +
                          (model->kind().bf16_rows() ? "bf16" : "floats"));
  }
};

Net::Net(const Model& model, bool blocked_layouts, Precision precision)
    : impl_(std::make_unique<Impl>(
          Impl{&model, precision, model.kind().executor(model, blocked_layouts, precision)})) {}
Net::~Net() = default;
Net::Net(Net&&) noexcept = default;
Net& Net::operator=(Net&&) noexcept = default;
Precision Net::precision() const { return impl_->precision; }

double Net::forward_backward(const float* params, const float* x, const std::int32_t* labels,
                             std::int64_t N, float* grad, const StreamKey& key,
                             std::span<const LinearRows> linear_rows, float* batch_stats) {
  impl_->require(Precision::kF32, "forward_backward(const float* ...)");
  return impl_->exec->forward_backward(params, x, labels, N, grad, key, linear_rows, batch_stats);
}

double Net::forward_backward(const bf16* params, const bf16* x, const std::int32_t* labels,
                             std::int64_t N, float* grad, const StreamKey& key,
                             std::span<const LinearRows> linear_rows, float* batch_stats) {
  impl_->require(Precision::kBf16, "forward_backward(const bf16* ...)");
  impl_->require_rows(true, "forward_backward(const bf16* params, const bf16* x, ...)");
  return impl_->exec->forward_backward(params, x, labels, N, grad, key, linear_rows, batch_stats);
}

double Net::forward_backward(const bf16* params, const float* x, const std::int32_t* labels,
                             std::int64_t N, float* grad, const StreamKey& key,
                             std::span<const LinearRows> linear_rows, float* batch_stats) {
  impl_->require(Precision::kBf16, "forward_backward(const bf16*, const float* ...)");
  impl_->require_rows(false, "forward_backward(const bf16* params, const float* x, ...)");
  return impl_->exec->forward_backward(params, x, labels, N, grad, key, linear_rows, batch_stats);
}

const float* Net::forward(const float* params, const float* x, std::int64_t N,
                          const float* running_stats) {
  impl_->require(Precision::kF32, "forward(const float* ...)");
  return impl_->exec->logits(params, x, N, running_stats);
}

const float* Net::forward(const bf16* params, const bf16* x, std::int64_t N,
                          const float* running_stats) {
  impl_->require(Precision::kBf16, "forward(const bf16* ...)");
  impl_->require_rows(true, "forward(const bf16* params, const bf16* x, ...)");
  return impl_->exec->logits(params, x, N, running_stats);
}

Evaluation Net::evaluate(const float* params, const float* x, const std::int32_t* labels,
                         std::int64_t N, const float* running_stats) {
  impl_->require(Precision::kF32, "evaluate(const float* ...)");
  return impl_->exec->evaluate(params, x, labels, N, running_stats);
}

Evaluation Net::evaluate(const bf16* params, const bf16* x, const std::int32_t* labels,
                         std::int64_t N, const float* running_stats) {
  impl_->require(Precision::kBf16, "evaluate(const bf16* ...)");
  impl_->require_rows(true, "evaluate(const bf16* params, const bf16* x, ...)");
  return impl_->exec->evaluate(params, x, labels, N, running_stats);
}

Evaluation Net::evaluate(const bf16* params, const float* x, const std::int32_t* labels,
                         std::int64_t N, const float* running_stats) {
  impl_->require(Precision::kBf16, "evaluate(const bf16*, const float* ...)");
  impl_->require_rows(false, "evaluate(const bf16* params, const float* x, ...)");
  return impl_->exec->evaluate(params, x, labels, N, running_stats);
}

const PhaseTimes& Net::times() const { return impl_->exec->times(); }
std::chrono::steady_clock::time_point Net::backward_begin() const {
  return impl_->exec->backward_begin();
}
void Net::reset_times() { impl_->exec->reset_times(); }
void Net::weights_changed() { impl_->exec->weights_changed(); }
void Net::release_inference_plans() { impl_->exec->release_inference_plans(); }
PlanMemory Net::memory() const { return impl_->exec->memory(); }
void Net::share_weight_copies(Net& owner) { impl_->exec->share_weight_copies(*owner.impl_->exec); }
void Net::keep_weight_copies(const bf16* params) { impl_->exec->keep_weight_copies(params); }
void Net::weights_written(std::size_t begin, std::size_t end) {
  impl_->exec->weights_written(begin, end);
}

}  // namespace cohort::nn
