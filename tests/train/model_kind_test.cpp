// A model kind added from outside the engine (nn::register_model_kind): softmax regression,
// "toy:CLASSES", on plain loops. The trainer, validation, the roofline and export run it through
// nn::ModelKind and nn::Executor alone; nothing in src/ names it. Seeds are fixed and printed.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "cohort/checkpoint/checkpoint.hpp"
#include "cohort/core/error.hpp"
#include "cohort/core/rng.hpp"
#include "cohort/export/export.hpp"
#include "cohort/nn/model.hpp"
#include "cohort/train/trainer.hpp"
#include "train_test_util.hpp"

namespace cohort::train {
namespace {

// logits = W x + b over the flattened input; W (classes, features), then b (classes).
class ToyExecutor final : public nn::Executor {
 public:
  ToyExecutor(std::int64_t features, std::int64_t classes)
      : F_(features), C_(classes), z_(static_cast<std::size_t>(classes)) {}

  double forward_backward(const void* params, const void* x, const std::int32_t* labels,
                          std::int64_t N, float* grad, const nn::StreamKey&,
                          std::span<const nn::LinearRows> rows, float* stats) override {
    EXPECT_TRUE(rows.empty() && stats == nullptr) << "the toy has no linear layers nor bn";
    const auto* w = static_cast<const float*>(params);
    std::fill(grad, grad + C_ * F_ + C_, 0.0f);
    double loss = 0;
    for (std::int64_t n = 0; n < N; ++n) {
      const float* row = static_cast<const float*>(x) + n * F_;
      const std::vector<double> p = softmax(w, row);
      loss -= std::log(p[static_cast<std::size_t>(labels[n])]);
      for (std::int64_t c = 0; c < C_; ++c) {
        const double d = p[static_cast<std::size_t>(c)] - (c == labels[n] ? 1.0 : 0.0);
        for (std::int64_t f = 0; f < F_; ++f) grad[c * F_ + f] += static_cast<float>(d * row[f]);
        grad[C_ * F_ + c] += static_cast<float>(d);
      }
    }
    calls_ += 1;
    return loss;
  }

  nn::Evaluation evaluate(const void* params, const void* x, const std::int32_t* labels,
                          std::int64_t N, const float*) override {
    nn::Evaluation e;
    for (std::int64_t n = 0; n < N; ++n) {
      const std::vector<double> p =
          softmax(static_cast<const float*>(params), static_cast<const float*>(x) + n * F_);
      e.loss -= std::log(p[static_cast<std::size_t>(labels[n])]);
      e.correct += std::max_element(p.begin(), p.end()) - p.begin() == labels[n] ? 1 : 0;
    }
    return e;
  }

  const float* logits(const void*, const void*, std::int64_t, const float*) override {
    throw InputError("toy: no logits");
  }
  const nn::PhaseTimes& times() const override { return times_; }
  std::chrono::steady_clock::time_point backward_begin() const override { return {}; }
  void reset_times() override { times_ = {}; }

  static inline int calls_ = 0;  // forward_backward calls, over every toy executor

 private:
  std::vector<double> softmax(const float* w, const float* row) {
    double top = -1e300;
    for (std::int64_t c = 0; c < C_; ++c) {
      double z = w[C_ * F_ + c];
      for (std::int64_t f = 0; f < F_; ++f) z += double(w[c * F_ + f]) * row[f];
      z_[static_cast<std::size_t>(c)] = z;
      top = std::max(top, z);
    }
    std::vector<double> p(static_cast<std::size_t>(C_));
    double sum = 0;
    for (std::size_t c = 0; c < p.size(); ++c) sum += p[c] = std::exp(z_[c] - top);
    for (double& v : p) v /= sum;
    return p;
  }

  std::int64_t F_, C_;
  std::vector<double> z_;
  nn::PhaseTimes times_;
};

ParamLayout toy_layout(std::int64_t features, std::int64_t classes) {
  ParamLayout layout;
  layout.add("fc.weight", Shape{{classes, features}});
  layout.add("fc.bias", Shape{{classes}});
  return layout;
}

class ToyKind final : public nn::ModelKind {
 public:
  ToyKind(const std::string& spec, nn::SampleShape input, std::int64_t classes)
      : ModelKind(spec, toy_layout(input.numel(), classes), input, classes) {}
  std::string_view name() const override { return "toy"; }
  bool has_dropout() const override { return false; }
  std::size_t weight() const { return layout().entries()[0].offset; }
  std::size_t bias() const { return layout().entries()[1].offset; }
  void init(float* params, std::uint64_t seed) const override {
    std::fill(params, params + layout().total(), 0.0f);
    Rng rng({seed, 0x70e});
    for (std::size_t i = 0; i < layout().entries()[0].shape.numel(); ++i)
      params[weight() + i] = rng.uniform(-0.01f, 0.01f);
  }
  std::vector<std::pair<std::size_t, std::size_t>> norm_and_bias_ranges() const override {
    return {{bias(), bias() + static_cast<std::size_t>(num_classes())}};
  }
  double forward_flops_per_sample() const override {
    return 2.0 * double(input().numel()) * double(num_classes());
  }
  std::vector<nn::StateTensor> state_dict() const override {
    std::vector<nn::StateTensor> out;
    for (const ParamLayout::Entry& e : layout().entries())
      out.push_back({e.name, e.shape.dims, nn::StateTensor::Source::kParams, e.offset});
    return out;
  }
  std::unique_ptr<nn::Executor> executor(const nn::Model&, bool,
                                         nn::Precision precision) const override {
    if (precision != nn::Precision::kF32) throw InputError("--precision: the toy runs f32 only");
    return std::make_unique<ToyExecutor>(input().numel(), num_classes());
  }
  nn::LeafRule leaf_rule(nn::Precision) const override { return {16, false}; }
};

void register_toy() {
  nn::register_model_kind({"toy:",
                           [](const std::string& spec, nn::SampleShape input, std::int64_t) {
                             return std::make_shared<const ToyKind>(spec, input,
                                                                    std::stoll(spec.substr(4)));
                           },
                           [](const std::string&) { return std::int64_t{0}; }});
}

TrainConfig toy_config(std::size_t workers) {
  TrainConfig c;
  c.model = "toy:10";
  c.workers = workers;
  c.batch = 64;
  c.steps = 12;
  c.seed = 31;
  c.optimizer.kind = optim::Kind::kSgd;
  c.optimizer.lr = 0.05f;
  c.roofline = true;  // the roofline times the kind's executor too
  return c;
}

// The engine trains the toy: its default leaf from the kind (16 rows), the same digest for 1
// and 2 workers, its loss falling, its accuracy above chance (10%) on the held-out split.
TEST(ToyModelKind, TrainsThroughTheEngineWithOneDigestForAnyWorkers) {
  register_toy();
  std::string digest;
  for (const std::size_t workers : {1u, 2u}) {
    SCOPED_TRACE("seed 31, workers " + std::to_string(workers));
    const int calls_before = ToyExecutor::calls_;
    Trainer t(toy_config(workers), testing::fixture());
    EXPECT_EQ(t.config().micro_batch, 16u);
    testing::Recorder rec;
    const Summary s = t.run(rec);
    EXPECT_GE(ToyExecutor::calls_ - calls_before, 12 * 4 + 6)
        << "12 steps of 4 leaves, and the roofline's warm-up and at least 5 timed runs";
    ASSERT_EQ(rec.losses.size(), 12u);
    EXPECT_LT(rec.losses.back(), rec.losses.front());
    EXPECT_GT(s.test_accuracy, 0.3);
    if (digest.empty()) digest = s.weights_digest;
    EXPECT_EQ(s.weights_digest, digest);
  }
}

// Validation asks the kind for its classes, like any other: a toy of 7 classes on 10 is refused
// before any work, naming --model.
TEST(ToyModelKind, ValidationRefusesAMismatchNamingTheFlag) {
  register_toy();
  TrainConfig c = toy_config(1);
  c.model = "toy:7";
  try {
    Trainer t(c, testing::fixture());
    FAIL() << "toy:7 was accepted for 10 classes";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--model: expected an output size of 10"),
              std::string::npos)
        << e.what();
  }
}

// Export writes the kind's state_dict under its names; ONNX, which has no graph for the kind,
// is refused naming the format and the kind.
TEST(ToyModelKind, ExportWritesItsStateDictAndRefusesAnOnnxGraph) {
  register_toy();
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / "toy_model_kind_export";
  std::filesystem::create_directories(dir);
  TrainConfig c = toy_config(1);
  c.steps = 2;
  c.roofline = false;
  Trainer t(c, testing::fixture());
  testing::Recorder rec;
  t.run(rec);
  checkpoint::save_checkpoint(dir / "toy.ckpt", t.checkpoint("{}"));
  exporting::export_checkpoint(dir / "toy.ckpt", exporting::Format::kSafetensors,
                               dir / "toy.safetensors");
  std::ifstream in(dir / "toy.safetensors", std::ios::binary);
  const std::string file((std::istreambuf_iterator<char>(in)), {});
  EXPECT_NE(file.find("\"fc.weight\":{\"dtype\":\"F32\",\"shape\":[10,784]"), std::string::npos)
      << file.substr(0, 200);
  EXPECT_NE(file.find("\"fc.bias\":{\"dtype\":\"F32\",\"shape\":[10]"), std::string::npos);
  try {
    exporting::export_checkpoint(dir / "toy.ckpt", exporting::Format::kOnnx, dir / "toy.onnx");
    FAIL() << "an ONNX graph was written for the toy";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--format onnx: expected a model kind with an ONNX graph"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("of the kind toy"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "toy.onnx"));
}

}  // namespace
}  // namespace cohort::train
