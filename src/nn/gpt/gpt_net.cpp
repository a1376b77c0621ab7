// GptNet: plans per window count (plan_gpt.cpp), bound to the caller's arrays and run; the loss
// over every position between forward and backward.
#include <algorithm>
#include <chrono>
#include <map>
#include <utility>
#include <vector>

#include "cohort/core/error.hpp"
#include "cohort/nn/gpt/gpt.hpp"
#include "cohort/nn/gpt/gpt_kernels.hpp"
#include "cohort/nn/loss.hpp"
#include "gpt_plan.hpp"

namespace cohort::nn {

using detail::Exec;
using detail::Phase;
using detail::Plan;
using Clock = std::chrono::steady_clock;

struct GptNet::Impl {
  const GptModel* model;
  Precision precision;
  GptPaths paths;
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  // Before the plans, which hold views of it; shared with other nets (share_weight_copies).
  std::shared_ptr<detail::WeightCopies> weight_copies = std::make_shared<detail::WeightCopies>();
  dnnl::stream stream{engine};
  std::map<std::pair<std::int64_t, bool>, std::unique_ptr<Plan>> plans;  // (N, training)
  PhaseTimes times;
  StreamKey key;                          // the current call's
  const std::int32_t* windows = nullptr;  // the current call's
  std::vector<std::int32_t> targets;      // the current call's, (N x block)
  Clock::time_point backward_begin;       // of the last forward_backward
  // weights_changed's count: 0 until its first call (every run prepares its plan).
  std::uint64_t generation = 0;
  bool copies_owner = true;  // false after share_weight_copies

  Impl(const GptModel& m, Precision p, GptPaths g) : model(&m), precision(p), paths(g) {}

  Plan& plan(std::int64_t N, bool training) {
    auto& slot = plans[{N, training}];
    if (!slot)
      slot = detail::build_gpt_plan({model, &engine, &key, &windows, N, training, precision, paths,
                                     weight_copies.get(), &stream});
    return *slot;
  }

  void require(Precision p, const char* what) const {
    if (precision != p)
      throw InternalError(std::string("nn::GptNet: ") + what + " called on a " +
                          (precision == Precision::kBf16 ? "bf16" : "f32") + " net of " +
                          model->spec());
  }

  void bind(Plan& p, const void* params, float* grad) {
    detail::bind_arrays(p, params, precision == Precision::kBf16 ? sizeof(bf16) : sizeof(float),
                        grad);
  }

  void run(std::vector<Exec>& execs) { detail::run_steps(execs, stream, times, model->spec()); }

  // The plan's weights in its primitives' layouts, where they may have changed since it last
  // reordered them.
  void prepare(Plan& p, const void* params) {
    detail::prepare_plan(p, params, generation, *weight_copies, [&](auto& steps) { run(steps); });
  }

  // The targets of N windows, (N x block), the positions' order.
  void fill_targets(std::int64_t N) {
    const std::int64_t T = model->shape().block;
    targets.resize(static_cast<std::size_t>(N * T));
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t t = 0; t < T; ++t)
        targets[static_cast<std::size_t>(n * T + t)] = windows[n * (T + 1) + t + 1];
  }

  // The cross-entropy summed over positions [first, first + rows), whose logits the plan's head
  // wrote to p.logits, times `scale`; in training, its gradient (times `scale`) written over
  // them. The logits' rows are padded_vocab() apart; the padded columns are out of the loss, and
  // their gradient is 0.
  double chunk_loss(const Plan& p, std::int64_t first, std::int64_t rows, bool training,
                    double scale) {
    const GptShape& s = model->shape();
    const auto t0 = Clock::now();
    const std::int64_t V = s.vocab, stride = s.padded_vocab();
    const double loss =
        token_cross_entropy(p.logits, targets.data() + first, rows, V, stride,
                            static_cast<float>(scale), training ? p.diff_logits : nullptr);
    times.loss += std::chrono::duration<double>(Clock::now() - t0).count();
    return loss * scale;
  }

  double forward_backward(const void* params, const std::int32_t* w, std::int64_t N, float* grad,
                          const StreamKey& k, double scale) {
    Plan& p = plan(N, /*training=*/true);
    key = k;
    windows = w;
    bind(p, params, grad);
    prepare(p, params);
    run(p.forward);
    fill_targets(N);
    double loss = 0;
    if (p.head_chunks.empty()) {
      loss = chunk_loss(p, 0, N * model->shape().block, true, scale);
      backward_begin = Clock::now();
    } else {  // each chunk's logits, loss and head backward in turn
      backward_begin = Clock::now();
      for (Plan::HeadChunk& c : p.head_chunks) {
        run(c.forward);
        loss += chunk_loss(p, c.first, c.rows, true, scale);
        run(c.backward);
      }
    }
    run(p.backward);
    return loss;
  }

  Evaluation evaluate(const void* params, const std::int32_t* w, std::int64_t N) {
    Plan& p = plan(N, /*training=*/false);
    windows = w;
    bind(p, params, nullptr);
    prepare(p, params);
    run(p.forward);
    fill_targets(N);
    const GptShape& s = model->shape();
    Evaluation e;
    auto score = [&](std::int64_t first, std::int64_t rows) {
      e.loss += chunk_loss(p, first, rows, false, 1);
      e.correct += count_correct(p.logits, targets.data() + first, rows, s.vocab, s.padded_vocab());
    };
    if (p.head_chunks.empty()) score(0, N * s.block);
    for (Plan::HeadChunk& c : p.head_chunks) {
      run(c.forward);
      score(c.first, c.rows);
    }
    return e;
  }
};

GptNet::GptNet(const GptModel& model, Precision precision, GptPaths paths)
    : impl_(std::make_unique<Impl>(model, precision, paths)) {}
GptNet::~GptNet() = default;
PlanMemory GptNet::memory() const {
  // Copies shared with other nets are counted by the net that made them.
  const std::size_t copies = impl_->copies_owner ? impl_->weight_copies->bytes() : 0;
  PlanMemory m{copies, 0, copies};
  for (const auto& [shape, plan] : impl_->plans) {
    const PlanMemory p = plan->memory();
    m.total += p.total;
    m.logits += p.logits;
    m.weight_copies += p.weight_copies;
  }
  return m;
}
GptNet::GptNet(GptNet&&) noexcept = default;
GptNet& GptNet::operator=(GptNet&&) noexcept = default;
Precision GptNet::precision() const { return impl_->precision; }

double GptNet::forward_backward(const float* params, const std::int32_t* windows, std::int64_t N,
                                float* grad, const StreamKey& key, double scale) {
  impl_->require(Precision::kF32, "forward_backward(const float* ...)");
  return impl_->forward_backward(params, windows, N, grad, key, scale);
}
double GptNet::forward_backward(const bf16* params, const std::int32_t* windows, std::int64_t N,
                                float* grad, const StreamKey& key, double scale) {
  impl_->require(Precision::kBf16, "forward_backward(const bf16* ...)");
  return impl_->forward_backward(params, windows, N, grad, key, scale);
}
GptNet::Evaluation GptNet::evaluate(const float* params, const std::int32_t* windows,
                                    std::int64_t N) {
  impl_->require(Precision::kF32, "evaluate(const float* ...)");
  return impl_->evaluate(params, windows, N);
}
GptNet::Evaluation GptNet::evaluate(const bf16* params, const std::int32_t* windows,
                                    std::int64_t N) {
  impl_->require(Precision::kBf16, "evaluate(const bf16* ...)");
  return impl_->evaluate(params, windows, N);
}

std::chrono::steady_clock::time_point GptNet::backward_begin() const {
  return impl_->backward_begin;
}
void GptNet::weights_changed() {
  ++impl_->generation;
  impl_->weight_copies->changed();
}

void GptNet::share_weight_copies(GptNet& owner) {
  COHORT_CHECK(impl_->plans.empty() && owner.impl_->precision == impl_->precision &&
                   owner.impl_->model == impl_->model,
               "GptNet::share_weight_copies: a net of the same model and precision, before any "
               "plan");
  impl_->weight_copies = owner.impl_->weight_copies;
  impl_->copies_owner = false;
  impl_->engine = owner.impl_->engine;  // the copies' memory objects are on its engine
  impl_->stream = dnnl::stream(impl_->engine);
}
void GptNet::keep_weight_copies(const bf16* params) { impl_->weight_copies->keep(params); }
void GptNet::weights_written(std::size_t begin, std::size_t end) {
  impl_->weight_copies->refresh(begin, end);
}
const PhaseTimes& GptNet::times() const { return impl_->times; }
void GptNet::reset_times() { impl_->times = {}; }
void GptNet::release_inference_plans() {
  std::erase_if(impl_->plans, [](const auto& p) { return !p.first.second; });
}

}  // namespace cohort::nn
