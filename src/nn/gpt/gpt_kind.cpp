// The language model as a model kind (nn/model.hpp): GptModel's description behind ModelKind,
// GptNet behind Executor (windows of token ids as float rows, each window's loss a mean over its
// positions), and its default leaf.
#include <algorithm>
#include <vector>

#include "../leaf_caps.hpp"
#include "../model_kinds.hpp"
#include "cohort/core/error.hpp"
#include "cohort/nn/gpt/gpt.hpp"
#include "cohort/nn/gpt/gpt_attention.hpp"

namespace cohort::nn {

namespace {

class GptExecutor final : public Executor {
 public:
  GptExecutor(const GptModel& model, Precision precision)
      : model_(model), net_(model, precision), precision_(precision) {}

  double forward_backward(const void* params, const void* x, const std::int32_t*, std::int64_t N,
                          float* grad, const StreamKey& key, std::span<const LinearRows> rows,
                          float* batch_stats) override {
    COHORT_CHECK(rows.empty() && batch_stats == nullptr,
                 "a language model has no batch weight gradients nor bn statistics");
    const std::int32_t* w = tokens(x, N);
    const double per_window = 1.0 / static_cast<double>(model_.shape().block);
    return precision_ == Precision::kBf16 ? net_.forward_backward(static_cast<const bf16*>(params),
                                                                  w, N, grad, key, per_window)
                                          : net_.forward_backward(static_cast<const float*>(params),
                                                                  w, N, grad, key, per_window);
  }

  Evaluation evaluate(const void* params, const void* x, const std::int32_t*, std::int64_t N,
                      const float*) override {
    const std::int32_t* w = tokens(x, N);
    const GptNet::Evaluation e = precision_ == Precision::kBf16
                                     ? net_.evaluate(static_cast<const bf16*>(params), w, N)
                                     : net_.evaluate(static_cast<const float*>(params), w, N);
    const auto T = static_cast<double>(model_.shape().block);
    return {e.loss / T, static_cast<double>(e.correct) / T};
  }

  const float* logits(const void*, const void*, std::int64_t, const float*) override {
    throw InternalError("nn::Net: logits of the language model " + model_.spec() +
                        " (its logits are per position: GptGenerator draws from them)");
  }

  void weights_changed() override { net_.weights_changed(); }
  void keep_weight_copies(const bf16* params) override { net_.keep_weight_copies(params); }
  void weights_written(std::size_t begin, std::size_t end) override {
    net_.weights_written(begin, end);
  }
  PlanMemory memory() const override { return net_.memory(); }
  void share_weight_copies(Executor& owner) override {
    auto* other = dynamic_cast<GptExecutor*>(&owner);
    COHORT_CHECK(other != nullptr, "GptExecutor::share_weight_copies: another GptExecutor");
    net_.share_weight_copies(other->net_);
  }
  void release_inference_plans() override { net_.release_inference_plans(); }
  const PhaseTimes& times() const override { return net_.times(); }
  std::chrono::steady_clock::time_point backward_begin() const override {
    return net_.backward_begin();
  }
  void reset_times() override { net_.reset_times(); }

 private:
  // N windows, (N, block + 1) token ids as floats, as ids.
  const std::int32_t* tokens(const void* x, std::int64_t N) {
    const auto* ids = static_cast<const float*>(x);
    windows_.resize(static_cast<std::size_t>(N * (model_.shape().block + 1)));
    for (std::size_t i = 0; i < windows_.size(); ++i)
      windows_[i] = static_cast<std::int32_t>(ids[i]);
    return windows_.data();
  }

  const GptModel& model_;
  GptNet net_;
  Precision precision_;
  std::vector<std::int32_t> windows_;
};

class GptKind final : public ModelKind {
 public:
  GptKind(GptModel model, std::int64_t vocab)
      : ModelKind(model.spec(), model.layout(), {1, 1, model.shape().block + 1}, vocab),
        model_(std::move(model)) {}

  const GptModel& model() const { return model_; }

  std::string_view name() const override { return "gpt"; }
  bool has_dropout() const override { return model_.shape().dropout > 0; }
  std::int64_t window() const override { return model_.shape().block; }
  bool bf16_rows() const override { return false; }  // token ids past 256 do not survive bf16
  void init(float* params, std::uint64_t seed) const override { model_.init(params, seed); }
  std::vector<std::pair<std::size_t, std::size_t>> norm_and_bias_ranges() const override {
    return model_.norm_ranges();
  }
  double forward_flops_per_sample() const override {
    return model_.forward_flops_per_token() * static_cast<double>(model_.shape().block);
  }

  // nanoGPT's state_dict: its parameters under their names, then lm_head.weight, the token
  // embedding again (tied: PyTorch lists a tied parameter under both names). The token
  // embedding's padded rows (GptShape::vocab_multiple), 0 throughout, are not part of it: its
  // first `vocab` rows are.
  std::vector<StateTensor> state_dict() const override {
    const std::vector<std::int64_t> wte{model_.shape().vocab, model_.shape().embd};
    std::vector<StateTensor> out;
    for (const ParamLayout::Entry& e : layout().entries())
      out.push_back({e.name, e.offset == model_.wte() ? wte : e.shape.dims,
                     StateTensor::Source::kParams, e.offset});
    out.push_back({"lm_head.weight", wte, StateTensor::Source::kParams, model_.wte()});
    return out;
  }

  std::unique_ptr<Executor> executor(const Model&, bool, Precision precision) const override {
    return std::make_unique<GptExecutor>(model_, precision);
  }

  // As many windows as kLeafActivationValues allow in `precision` and kLeafTokens allows, at
  // least 1; a batch within that cap is still cut into kLanguageModelMinLeaves leaves.
  LeafRule leaf_rule(Precision precision) const override {
    const std::size_t values =
        precision == Precision::kBf16 ? kLeafActivationValues : kLeafActivationValues / 2;
    const auto block = static_cast<std::size_t>(model_.shape().block);
    const auto per_window = static_cast<std::size_t>(values_per_window());
    return {std::max<std::size_t>(1, std::min(values / per_window, kLeafTokens / block)), false,
            kLanguageModelMinLeaves};
  }

  // A leaf's windows' activations grow with block^2 (the attention weights), except where
  // attention is cohort's kernel on this CPU, which keeps none (two values a row and head).
  double leaf_plan_bytes(std::size_t rows, Precision precision) const override {
    if (gpt_attention_kernel(model_, precision)) {
      const GptShape& s = model_.shape();
      return static_cast<double>(rows) * static_cast<double>(s.block) *
             static_cast<double>(s.layers) * static_cast<double>(s.embd) * kKernelLeafBytesPerValue;
    }
    return static_cast<double>(rows) * values_per_window() * leaf_bytes_per_value(precision);
  }

  std::size_t max_eval_rows() const override {
    return kEvalTokens / static_cast<std::size_t>(input().numel());
  }

  // Attention as cohort's kernel: its products at oneDNN's rate all the same.
  double own_kernel_floor_seconds(std::int64_t rows, Precision precision) const override {
    return gpt_attention_kernel(model_, precision) ? gpt_attention_onednn_seconds(model_, rows) : 0;
  }

 private:
  // A window's activation values: block x layers x (embd + heads x block), the two terms a
  // layer's kept activations and buffers grow with (its rows, and its attention weights).
  double values_per_window() const {
    const GptShape& s = model_.shape();
    return static_cast<double>(s.block) * static_cast<double>(s.layers) *
           static_cast<double>(s.embd + s.heads * s.block);
  }

  GptModel model_;
};

}  // namespace

ModelKindEntry gpt_kind_entry() {
  return {"gpt:",
          [](const std::string& spec, SampleShape, std::int64_t vocab) {
            return std::make_shared<const GptKind>(GptModel::parse(spec, vocab), vocab);
          },
          [](const std::string& spec) { return GptModel::parse(spec, 1).shape().block; }};
}

const GptModel& gpt_model(const Model& model) {
  const auto* kind = dynamic_cast<const GptKind*>(&model.kind());
  COHORT_CHECK(kind != nullptr, "'" + model.spec() + "' is a language model");
  return kind->model();
}

}  // namespace cohort::nn
