// Net on oneDNN 2.6 primitives: plans per batch size (built by plan_builder.cpp), binding the
// caller's arrays to a plan and running its steps, the loss between forward and backward, and
// the precision checks of the public entry points. Only src/nn includes oneDNN.
#include "cohort/nn/net.hpp"

#include <oneapi/dnnl/dnnl.hpp>

#include <chrono>
#include <map>
#include <optional>
#include <string_view>
#include <tuple>

#include "cohort/core/error.hpp"
#include "cohort/nn/gpt.hpp"
#include "cohort/nn/loss.hpp"
#include "plan.hpp"

namespace cohort::nn {

using detail::Exec;
using detail::Phase;
using detail::Plan;
using Clock = std::chrono::steady_clock;

struct Net::Impl {
  const Model* model;
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  // (N, training, batch weight gradients of linear layers)
  std::map<std::tuple<std::int64_t, bool, bool>, std::unique_ptr<Plan>> plans;
  PhaseTimes times;
  Clock::time_point backward_begin;         // of the last forward_backward
  StreamKey key;                            // the current step's dropout streams
  std::span<const LinearRows> linear_rows;  // the current call's (batch weight gradients)
  bool blocked_layouts;
  Precision precision;
  bool needs_stats;  // the model has bn layers

  // A language model (Model::gpt): its executor, and the current call's windows as token ids.
  std::optional<GptNet> gpt;
  std::vector<std::int32_t> windows;

  Impl(const Model& m, bool blocked, Precision prec)
      : model(&m), blocked_layouts(blocked), precision(prec), needs_stats(m.has_batchnorm()) {
    if (m.gpt()) gpt.emplace(*m.gpt(), prec);
  }

  // The entries of a layer list's Net (a language model's are forward_backward on token rows
  // and evaluate_windows).
  void require_layers(const char* what) const {
    if (gpt)
      throw InternalError(std::string("nn::Net: ") + what + " called on the language model " +
                          model->spec() + " (its entries take token rows)");
  }

  // A language model's N windows, (N, block + 1) token ids as floats, as ids.
  const std::int32_t* tokens(const float* x, std::int64_t N) {
    windows.resize(static_cast<std::size_t>(N * model->input_features()));
    for (std::size_t i = 0; i < windows.size(); ++i) windows[i] = static_cast<std::int32_t>(x[i]);
    return windows.data();
  }

  double gpt_forward_backward(const void* params, const float* x, std::int64_t N, float* grad,
                              const StreamKey& k) {
    COHORT_CHECK(gpt.has_value(), "token rows are a language model's input");
    const std::int32_t* w = tokens(x, N);
    const double per_window = 1.0 / static_cast<double>(model->gpt()->shape().block);
    const double loss =
        precision == Precision::kBf16
            ? gpt->forward_backward(static_cast<const bf16*>(params), w, N, grad, k, per_window)
            : gpt->forward_backward(static_cast<const float*>(params), w, N, grad, k, per_window);
    return loss;
  }

  std::pair<double, double> gpt_evaluate(const void* params, const float* x, std::int64_t N) {
    COHORT_CHECK(gpt.has_value(), "token rows are a language model's input");
    const std::int32_t* w = tokens(x, N);
    const GptNet::Evaluation e = precision == Precision::kBf16
                                     ? gpt->evaluate(static_cast<const bf16*>(params), w, N)
                                     : gpt->evaluate(static_cast<const float*>(params), w, N);
    const auto T = static_cast<double>(model->gpt()->shape().block);
    return {e.loss / T, static_cast<double>(e.correct) / T};
  }

  Plan& plan(std::int64_t N, bool training, bool batch_linear) {
    auto& slot = plans[{N, training, batch_linear}];
    if (!slot)
      slot = detail::build_plan({model, &engine, &key, &linear_rows, N, training, blocked_layouts,
                                 batch_linear, precision});
    return *slot;
  }

  void require(Precision p, const char* what) const {
    if (precision != p)
      throw InternalError(std::string("nn::Net: ") + what + " called on a " +
                          (precision == Precision::kBf16 ? "bf16" : "f32") + " Net of " +
                          model->spec());
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

  void run(std::vector<Exec>& execs) { detail::run_steps(execs, stream, times, model->spec()); }

  double forward_backward(const void* params, const void* x, const std::int32_t* labels,
                          std::int64_t N, float* grad, const StreamKey& k,
                          std::span<const LinearRows> rows, float* batch_stats) {
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
    run(p.forward);
    auto t0 = Clock::now();
    double loss = softmax_cross_entropy(p.logits, labels, N, model->num_classes(), p.diff_logits);
    const auto t1 = Clock::now();
    times.loss += std::chrono::duration<double>(t1 - t0).count();
    backward_begin = t1;
    run(p.backward);
    return loss;
  }

  const float* forward(const void* params, const void* x, std::int64_t N,
                       const float* running_stats) {
    require_stats(running_stats, "forward");
    Plan& p = plan(N, /*training=*/false, /*batch_linear=*/false);
    bind(p, params, x, nullptr, running_stats);
    run(p.forward);
    return p.logits;
  }
};

Net::Net(const Model& model, bool blocked_layouts, Precision precision)
    : impl_(std::make_unique<Impl>(model, blocked_layouts, precision)) {}
Net::~Net() = default;
Net::Net(Net&&) noexcept = default;
Net& Net::operator=(Net&&) noexcept = default;
Precision Net::precision() const { return impl_->precision; }

double Net::forward_backward(const float* params, const float* x, const std::int32_t* labels,
                             std::int64_t N, float* grad, const StreamKey& key,
                             std::span<const LinearRows> linear_rows, float* batch_stats) {
  impl_->require(Precision::kF32, "forward_backward(const float* ...)");
  if (impl_->gpt) return impl_->gpt_forward_backward(params, x, N, grad, key);
  return impl_->forward_backward(params, x, labels, N, grad, key, linear_rows, batch_stats);
}

double Net::forward_backward(const bf16* params, const bf16* x, const std::int32_t* labels,
                             std::int64_t N, float* grad, const StreamKey& key,
                             std::span<const LinearRows> linear_rows, float* batch_stats) {
  impl_->require(Precision::kBf16, "forward_backward(const bf16* ...)");
  impl_->require_layers("forward_backward(const bf16* params, const bf16* x, ...)");
  return impl_->forward_backward(params, x, labels, N, grad, key, linear_rows, batch_stats);
}

const float* Net::forward(const float* params, const float* x, std::int64_t N,
                          const float* running_stats) {
  impl_->require(Precision::kF32, "forward(const float* ...)");
  impl_->require_layers("forward");
  return impl_->forward(params, x, N, running_stats);
}

const float* Net::forward(const bf16* params, const bf16* x, std::int64_t N,
                          const float* running_stats) {
  impl_->require(Precision::kBf16, "forward(const bf16* ...)");
  impl_->require_layers("forward");
  return impl_->forward(params, x, N, running_stats);
}

double Net::forward_backward(const bf16* params, const float* x, std::int64_t N, float* grad,
                             const StreamKey& key) {
  impl_->require(Precision::kBf16, "forward_backward(const bf16*, const float* ...)");
  return impl_->gpt_forward_backward(params, x, N, grad, key);
}

std::pair<double, double> Net::evaluate_windows(const float* params, const float* x,
                                                std::int64_t N) {
  impl_->require(Precision::kF32, "evaluate_windows(const float* ...)");
  return impl_->gpt_evaluate(params, x, N);
}

std::pair<double, double> Net::evaluate_windows(const bf16* params, const float* x,
                                                std::int64_t N) {
  impl_->require(Precision::kBf16, "evaluate_windows(const bf16* ...)");
  return impl_->gpt_evaluate(params, x, N);
}

const PhaseTimes& Net::times() const { return impl_->gpt ? impl_->gpt->times() : impl_->times; }
std::chrono::steady_clock::time_point Net::backward_begin() const {
  return impl_->gpt ? impl_->gpt->backward_begin() : impl_->backward_begin;
}
void Net::reset_times() {
  impl_->times = {};
  if (impl_->gpt) impl_->gpt->reset_times();
}
void Net::weights_changed() {
  if (impl_->gpt) impl_->gpt->weights_changed();
}
void Net::release_inference_plans() {
  if (impl_->gpt) impl_->gpt->release_inference_plans();
}

}  // namespace cohort::nn
