// The layers of residual networks in a Net (plan_resnet.cpp): batch normalization on images
// (blocked and plain layouts) and on flat features, global average pooling, residual blocks
// (identity and projection shortcuts, stride 1 and 2), conv without bias, and the resnet20
// preset — against the float64 reference (logits, loss, every gradient, the batch statistics,
// inference with running statistics) and finite differences, in f32 and bf16.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include "cohort/core/error.hpp"
#include "cohort/core/rng.hpp"
#include "cohort/nn/net.hpp"
#include "cohort/nn/version.hpp"
#include "cohort/tensor/buffer.hpp"
#include "net_reference.hpp"
#include "nn_test_util.hpp"

namespace cohort::nn {
namespace net_resnet_test {

using testing::expect_within;
using testing::Inputs;
using testing::longest_dot_product;
using testing::make_inputs;
using testing::round_to_bf16;
using testing::Rounded;
using testing::spec_case_name;

constexpr std::uint64_t kSeed = 20261203;

struct Case {
  const char* spec;
  std::int64_t N;
  SampleShape input;
  bool blocked = true;  // Net's blocked_layouts
  bool deep = false;    // bf16: see kCGradDeep
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.spec << " on " << c.input.str() << ", N " << c.N << (c.blocked ? "" : ", plain");
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return spec_case_name(info) + (info.param.blocked ? "" : "_plain");
}

std::vector<double> to_double(const float* p, std::size_t n) {
  return std::vector<double>(p, p + n);
}

// bn scales and shifts away from PyTorch's initial 1 and 0, so that a scale and shift swapped
// or ignored shows: scale U(0.5, 1.5), shift U(-0.5, 0.5).
void randomize_bn(const Model& m, float* params, std::uint64_t seed) {
  Rng rng({seed, 7});
  for (const LayerSpec* l : m.batchnorm_layers())
    for (std::int64_t c = 0; c < l->in.C; ++c) {
      params[l->weight + c] = rng.uniform(0.5f, 1.5f);
      params[l->bias + c] = rng.uniform(-0.5f, 0.5f);
    }
}

// Running statistics as after some training: mean U(-0.5, 0.5), variance U(0.5, 2).
AlignedBuffer<float> some_running_stats(const Model& m, std::uint64_t seed) {
  AlignedBuffer<float> stats(m.stats_layout().total());
  m.init_stats(stats.data());
  Rng rng({seed, 8});
  for (const LayerSpec* l : m.batchnorm_layers())
    for (std::int64_t c = 0; c < l->in.C; ++c) {
      stats[l->running_mean + c] = rng.uniform(-0.5f, 0.5f);
      stats[l->running_var + c] = rng.uniform(0.5f, 2.0f);
    }
  return stats;
}

// Per tensor of `layout`: |got - ref| <= tol * (largest |ref| of the tensor, at least `floor`
// times the largest |ref| of all tensors, times the element's `gain` where given). The floor is
// for tensors whose reference is zero up to rounding: a bias right before bn (bn removes any
// constant) gets f32 sums of terms that cancel. Prints the worst |got - ref| / scale.
void expect_tensors_near(const ParamLayout& layout, const float* got,
                         const std::vector<double>& ref, double tol, double floor, const char* what,
                         const std::vector<double>* gain = nullptr) {
  double largest = 1e-30, worst = 0;
  for (const auto& e : layout.entries())
    for (std::size_t i = 0; i < e.shape.numel(); ++i)
      largest = std::max(largest, std::abs(ref[e.offset + i]));
  floor *= largest;
  for (const auto& e : layout.entries()) {
    double tensor_scale = floor;
    for (std::size_t i = 0; i < e.shape.numel(); ++i)
      tensor_scale = std::max(tensor_scale, std::abs(ref[e.offset + i]));
    for (std::size_t i = 0; i < e.shape.numel(); ++i) {
      const std::size_t at = e.offset + i;
      const double scale = gain ? std::max(tensor_scale, floor * (*gain)[at]) : tensor_scale;
      const double err = std::abs(got[at] - ref[at]);
      worst = std::max(worst, err / scale);
      ASSERT_LE(err, tol * scale) << e.name << " element " << i << " " << what << ": " << got[at]
                                  << ", reference " << ref[at] << " (scale " << scale << ")";
    }
  }
  std::printf("%s: worst error %.2e of the tensor's scale (bound %.2g)\n", what, worst, tol);
}

// Per element of the flat array, the gain of expect_tensors_near's floor: 1, but for the bias of
// a layer right before bn, 1 + mean^2 / var of its feature's batch statistics. That bias's
// gradient is a sum of the rows' terms that cancel; f32 batch statistics of a feature whose
// variance is small beside its squared mean carry relative errors near eps * mean^2 / var, and
// the sum inherits them. Measured on AVX2 (linear(12)-bn, N 2): the errors of the 12 features
// followed mean^2 / var (1190: 3.5e-5, 70 times the plain floor's bound; 29: 1.2e-6; below 5:
// 1e-7 and less); AVX-512's kernels had stayed under the plain floor.
std::vector<double> bn_conditioning(const Model& m, const std::vector<double>& batch_stats) {
  std::vector<double> gain(m.layout().total(), 1.0);
  const auto& layers = m.layers();
  for (std::size_t i = 0; i + 1 < layers.size(); ++i) {
    const LayerSpec &l = layers[i], &bn = layers[i + 1];
    const bool biased =
        (l.kind == LayerSpec::Kind::kLinear || l.kind == LayerSpec::Kind::kConv) && l.has_bias;
    if (!biased || bn.kind != LayerSpec::Kind::kBatchNorm) continue;
    for (std::int64_t c = 0; c < bn.in.C; ++c) {
      const double mean = batch_stats[bn.running_mean + c], var = batch_stats[bn.running_var + c];
      gain[l.bias + c] = 1.0 + mean * mean / std::max(var, 1e-30);
    }
  }
  return gain;
}

// Tolerances of the f32 Net against float64, relative to each tensor's largest value. The
// gradients of layers under bn take the batch-statistics path (M dy - sum dy - xhat sum dy xhat),
// a difference of terms up to M times larger than the result, so they get 1e-4 where plain
// layers get net_test.cpp's 2e-5; measured worst 3.1e-5 (linear(40)-bn, N 16; resnet20 5.5e-6).
constexpr double kGradTol = 1e-4;
constexpr double kZeroFloor = 0.01;  // see expect_tensors_near
constexpr double kStatsTol = 1e-5;   // batch mean and variance: f32 sums over N x H x W values
constexpr double kLogitTol = 1e-5;

class NetResnetVsReference : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    omp_set_num_threads(1);
    std::printf("seed %llu, model %s, N %lld, %s layouts\n", static_cast<unsigned long long>(kSeed),
                GetParam().spec, static_cast<long long>(N),
                GetParam().blocked ? "blocked" : "plain");
  }
  Inputs inputs() const {
    Inputs made = make_inputs(m, N, kSeed);
    randomize_bn(m, made.params.data(), kSeed);
    return made;
  }
  const std::int64_t N = GetParam().N;
  const Model m = Model::parse(GetParam().spec, GetParam().input);
  Inputs in = inputs();
  const std::vector<double> params64 = to_double(in.params.data(), in.params.size());
  const std::vector<double> x64 = to_double(in.x.data(), in.x.size());
  const reference::NetResult ref = reference::net_forward_backward(m, params64, x64, in.labels, N);
};

TEST_P(NetResnetVsReference, LogitsLossGradientsAndBatchStatisticsMatch) {
  Net net(m, GetParam().blocked);
  AlignedBuffer<float> grad(m.layout().total()), stats(m.stats_layout().total());
  std::fill(stats.data(), stats.data() + stats.size(), 12345.0f);  // every entry is written
  const std::vector<float> x_before(in.x.data(), in.x.data() + in.x.size());
  const double loss = net.forward_backward(in.params.data(), in.x.data(), in.labels.data(), N,
                                           grad.data(), {}, {}, stats.data());
  EXPECT_NEAR(loss, ref.loss, kLogitTol * std::max(1.0, std::abs(ref.loss)));
  ASSERT_TRUE(std::equal(x_before.begin(), x_before.end(), in.x.data()));  // the input is const
  const std::vector<double> gain = bn_conditioning(m, ref.batch_stats);
  expect_tensors_near(m.layout(), grad.data(), ref.grad, kGradTol, kZeroFloor, "gradient", &gain);
  expect_tensors_near(m.stats_layout(), stats.data(), ref.batch_stats, kStatsTol, 1.0,
                      "batch statistics");  // relative to the largest statistic
  // The same call again gives the same bits (the plan is reused, statistics rebound).
  AlignedBuffer<float> grad2(m.layout().total()), stats2(m.stats_layout().total());
  std::fill(stats2.data(), stats2.data() + stats2.size(), 12345.0f);  // padding stays
  EXPECT_EQ(loss, net.forward_backward(in.params.data(), in.x.data(), in.labels.data(), N,
                                       grad2.data(), {}, {}, stats2.data()));
  EXPECT_TRUE(testing::same_bits(grad.span(), grad2.span()));
  EXPECT_TRUE(testing::same_bits(stats.span(), stats2.span()));
}

TEST_P(NetResnetVsReference, InferenceNormalizesWithTheRunningStatistics) {
  Net net(m, GetParam().blocked);
  const AlignedBuffer<float> running = some_running_stats(m, kSeed);
  const std::vector<double> running64 = to_double(running.data(), running.size());
  const std::vector<double> want = reference::net_forward_inference(m, params64, x64, N, running64);
  const float* logits = net.forward(in.params.data(), in.x.data(), N, running.data());
  for (std::size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(logits[i], want[i], kLogitTol * std::max(1.0, std::abs(want[i]))) << i;
  // Other running statistics through the same plan: other logits (the pointer is rebound).
  if (!m.has_batchnorm()) return;
  AlignedBuffer<float> initial(m.stats_layout().total());
  m.init_stats(initial.data());
  const std::vector<double> want0 = reference::net_forward_inference(
      m, params64, x64, N, to_double(initial.data(), initial.size()));
  logits = net.forward(in.params.data(), in.x.data(), N, initial.data());
  for (std::size_t i = 0; i < want0.size(); ++i)
    ASSERT_NEAR(logits[i], want0[i], kLogitTol * std::max(1.0, std::abs(want0[i]))) << i;
}

// bn on images after a conv (blocked and plain) and on flat features after a linear layer, as the
// first layer (its input gradient is not needed) and on 2, 5 and 16 rows; gap; residual blocks
// with an identity shortcut, a projection for more channels (stride 1) and for stride 2 (same and
// more channels, odd sizes), as the first layer; the resnet20 preset.
INSTANTIATE_TEST_SUITE_P(
    Shapes, NetResnetVsReference,
    ::testing::Values(
        Case{"conv(6,3,1,1,nobias)-bn-relu-flatten-linear(5)", 2, {2, 6, 6}},
        Case{"conv(6,3,1,1,nobias)-bn-relu-flatten-linear(5)", 5, {2, 6, 6}},
        Case{"conv(6,3,1,1,nobias)-bn-relu-flatten-linear(5)", 16, {2, 6, 6}},
        Case{"conv(6,3,1,1,nobias)-bn-relu-flatten-linear(5)", 5, {2, 6, 6}, false},
        Case{"conv(20,3,1,1)-bn-relu-maxpool(2)-flatten-linear(5)", 3, {3, 8, 8}},
        Case{"conv(20,3,1,1)-bn-relu-maxpool(2)-flatten-linear(5)", 3, {3, 8, 8}, false},
        Case{"linear(12)-bn-relu-linear(4)", 2, {20, 1, 1}},
        Case{"linear(12)-bn-relu-linear(4)", 5, {20, 1, 1}},
        Case{"linear(40)-bn-relu-linear(4)", 16, {20, 1, 1}},
        Case{"bn-conv(4,3)-flatten-linear(3)", 4, {3, 6, 6}},
        // A flatten of an input that is flat already (after gap or a linear layer).
        Case{"conv(4,3,1,1)-gap-flatten-linear(3)", 3, {2, 5, 5}},
        Case{"conv(4,3,1,1)-flatten-linear(6)-flatten-linear(3)", 2, {1, 5, 5}},
        Case{"bn-conv(4,3)-flatten-linear(3)", 4, {3, 6, 6}, false},
        Case{"flatten-bn-linear(3)", 5, {2, 3, 3}},
        Case{"conv(8,3,1,1)-relu-gap-linear(5)", 3, {2, 7, 7}},
        Case{"conv(8,3,1,1)-relu-gap-linear(5)", 3, {2, 7, 7}, false},
        Case{"gap-linear(3)", 2, {5, 4, 4}},
        Case{"conv(8,3,1,1,nobias)-bn-relu-res(8)-gap-linear(4)", 3, {1, 8, 8}},
        Case{"conv(8,3,1,1,nobias)-bn-relu-res(8)-gap-linear(4)", 3, {1, 8, 8}, false},
        Case{"conv(4,3,1,1,nobias)-bn-relu-res(8)-gap-linear(4)", 2, {1, 8, 8}},
        Case{"conv(8,3,1,1,nobias)-bn-relu-res(8,2)-gap-linear(4)", 2, {1, 9, 9}},
        Case{"conv(8,3,1,1,nobias)-bn-relu-res(16,2)-res(16)-gap-linear(4)", 5, {1, 9, 9}},
        Case{"conv(8,3,1,1,nobias)-bn-relu-res(16,2)-res(16)-gap-linear(4)", 5, {1, 9, 9}, false},
        Case{"res(4)-gap-linear(3)", 2, {2, 6, 6}}, Case{"res(2,2)-gap-linear(3)", 3, {2, 7, 7}},
        Case{"res(3)-gap-linear(3)", 2, {3, 5, 5}}, Case{"resnet20", 4, {1, 28, 28}}),
    case_name);

TEST(Reference, BatchNormGapAndResidualGradientsMatchFiniteDifferences) {
  // Central differences in float64 (h 1e-6): validates the oracle's bn (through the batch
  // statistics, on images and flat features), gap, residual blocks and nobias convs.
  for (const auto& [spec, shape, N] :
       {std::tuple<const char*, SampleShape, std::int64_t>{
            "conv(3,3,1,1,nobias)-bn-relu-res(3)-res(4,2)-gap-bn-linear(3)", {2, 5, 5}, 3},
        {"bn-flatten-linear(5)-bn-relu-linear(3)", {2, 2, 2}, 4}}) {
    const Model m = Model::parse(spec, shape);
    Inputs in = make_inputs(m, N, kSeed);
    randomize_bn(m, in.params.data(), kSeed);
    auto params = to_double(in.params.data(), in.params.size());
    const auto x = to_double(in.x.data(), in.x.size());
    const auto ref = reference::net_forward_backward(m, params, x, in.labels, N);
    const double h = 1e-6;
    for (const auto& e : m.layout().entries())
      for (std::size_t i = 0; i < e.shape.numel(); ++i) {
        auto p = params;
        p[e.offset + i] += h;
        const double up = reference::net_forward_backward(m, p, x, in.labels, N).loss;
        p[e.offset + i] -= 2 * h;
        const double down = reference::net_forward_backward(m, p, x, in.labels, N).loss;
        ASSERT_NEAR(ref.grad[e.offset + i], (up - down) / (2 * h), 1e-6)
            << spec << ": " << e.name << " " << i;
      }
  }
}

// The Net's own float32 loss, differentiated numerically (h 1e-3) one parameter at a time, as
// net_test.cpp does, for models without ReLU: with ReLU, h 1e-3 moves some of the many
// pre-activations that bn centres on zero across the kink (measured: conv1.weight[54] of the
// first model below with a ReLU after bn: -0.4975 at h 1e-3, -0.5169 at h 1e-4 and below, the
// gradient -0.5169), and a smaller h drowns in the float32 loss's rounding.
void expect_finite_differences_match(const Model& m, std::int64_t N, std::uint64_t seed,
                                     bool blocked) {
  omp_set_num_threads(1);
  Inputs in = make_inputs(m, N, seed);
  randomize_bn(m, in.params.data(), seed);
  Net net(m, blocked);
  AlignedBuffer<float> grad(m.layout().total()), scratch(m.layout().total()),
      stats(m.stats_layout().total());
  net.forward_backward(in.params.data(), in.x.data(), in.labels.data(), N, grad.data(), {}, {},
                       stats.data());
  AlignedBuffer<float> p(m.layout().total());
  std::copy(in.params.data(), in.params.data() + p.size(), p.data());
  const float h = 1e-3f;
  auto loss_at = [&] {
    return net.forward_backward(p.data(), in.x.data(), in.labels.data(), N, scratch.data(), {}, {},
                                stats.data());
  };
  for (const auto& e : m.layout().entries())
    for (std::size_t i = e.offset; i < e.offset + e.shape.numel(); ++i) {
      const float saved = p[i];
      p[i] = saved + h;
      const double up = loss_at();
      p[i] = saved - h;
      const double down = loss_at();
      p[i] = saved;
      const double fd = (up - down) / (2.0 * h);
      ASSERT_NEAR(grad[i], fd, 1e-3 + 1e-2 * std::abs(fd)) << e.name << " " << i - e.offset;
    }
}

TEST(NetResnet, BatchNormGradientMatchesFiniteDifferences) {
  for (bool blocked : {true, false}) {
    expect_finite_differences_match(
        Model::parse("conv(4,3,1,1,nobias)-bn-flatten-linear(3)", {2, 4, 4}), 5, kSeed + 1,
        blocked);
    expect_finite_differences_match(Model::parse("bn-conv(3,3)-bn-gap-linear(3)", {2, 5, 5}), 2,
                                    kSeed + 2, blocked);
  }
  expect_finite_differences_match(Model::parse("linear(6)-bn-linear(3)", {5, 1, 1}), 5, kSeed + 3,
                                  true);
}

// Residual blocks hold ReLUs, so the Net's gradient is compared with central differences (step
// h) of the float64 reference's loss, where a small h puts no kink within reach: every parameter
// (or two of each tensor in `only`), within kGradTol of the tensor's largest gradient plus 1e-6.
// The reference's own gradient must match the same differences within 1e-6 first.
void expect_float64_differences_match(const Model& m, std::int64_t N, std::uint64_t seed,
                                      bool blocked, double h, std::span<const std::string> only) {
  omp_set_num_threads(1);
  Inputs in = make_inputs(m, N, seed);
  randomize_bn(m, in.params.data(), seed);
  Net net(m, blocked);
  AlignedBuffer<float> grad(m.layout().total()), stats(m.stats_layout().total());
  net.forward_backward(in.params.data(), in.x.data(), in.labels.data(), N, grad.data(), {}, {},
                       stats.data());
  auto params = to_double(in.params.data(), in.params.size());
  const auto x = to_double(in.x.data(), in.x.size());
  const auto ref = reference::net_forward_backward(m, params, x, in.labels, N);
  double worst_ref = 0;
  for (const auto& e : m.layout().entries()) {
    if (!only.empty() && std::find(only.begin(), only.end(), e.name) == only.end()) continue;
    std::vector<std::size_t> at;  // every element, or two of the tensors named in `only`
    for (std::size_t i = 0; i < e.shape.numel(); ++i)
      if (only.empty() || i == 0 || i == e.shape.numel() / 2 + 1) at.push_back(i);
    double scale = 0;
    for (std::size_t i : at) scale = std::max(scale, std::abs(ref.grad[e.offset + i]));
    for (std::size_t i : at) {
      auto p = params;
      p[e.offset + i] += h;
      const double up = reference::net_loss(m, p, x, in.labels, N);
      p[e.offset + i] -= 2 * h;
      const double down = reference::net_loss(m, p, x, in.labels, N);
      const double fd = (up - down) / (2 * h);
      worst_ref = std::max(worst_ref, std::abs(ref.grad[e.offset + i] - fd));
      EXPECT_NEAR(ref.grad[e.offset + i], fd, 1e-6)
          << m.spec() << ": " << e.name << " " << i << " (float64 reference)";
      EXPECT_NEAR(grad[e.offset + i], fd, kGradTol * scale + 1e-6)
          << m.spec() << ": " << e.name << " " << i << (blocked ? "" : " (plain)");
    }
  }
  std::printf("float64 gradient against the differences: worst %.2e (bound 1e-6)\n", worst_ref);
}

TEST(NetResnet, ResidualAndGapGradientMatchesFiniteDifferences) {
  // Identity, projection for more channels (stride 1) and for stride 2; h 1e-6.
  const Model m =
      Model::parse("conv(3,3,1,1,nobias)-bn-relu-res(3)-res(4)-res(4,2)-gap-linear(3)", {1, 6, 6});
  for (bool blocked : {true, false})
    expect_float64_differences_match(m, 3, kSeed + 4, blocked, 1e-6, {});
}

// resnet20 (N 4, 1x28x28): two parameters each of tensors across the network (the stem, an
// identity block, a projection shortcut, the last block, the fc) against central differences of
// the float64 reference's loss. h is 1e-8: bn keeps some of the ~580k ReLU inputs within 1e-5 of
// the kink, and measured at h 1e-5 the differences were off by up to 7e-4 (of 0.03) from the
// float64 gradient; at 1e-8 the float64 gradient matches them within 1e-6 (checked,
// measured 2.4e-7; the rounding of a loss of about 9 is 1e-15 / 1e-8 = 1e-7), so the tolerance,
// kGradTol of the tensor's largest sampled gradient plus 1e-6, is the f32 Net's.
TEST(NetResnet, Resnet20GradientMatchesFiniteDifferencesOfTheFloat64Loss) {
  const std::string only[] = {
      "conv1.weight",         "bn1.bias",      "res2.conv1.weight", "res4.short.conv.weight",
      "res4.short.bn.weight", "res9.bn2.bias", "fc1.weight"};
  expect_float64_differences_match(Model::parse("resnet20"), 4, kSeed + 5, true, 1e-8, only);
}

// A ReLU after a bn runs inside it (fuse_norm_relu), and a residual block's ReLU inside its sum
// (a binary add with a ReLU post-op): no standalone eltwise step is left in a model whose ReLUs
// all follow a bn, forward or backward (the results are the reference's: the tests above).
TEST(NetResnet, ReluAfterBatchNormRunsInsideIt) {
  omp_set_num_threads(1);
  const Model m =
      Model::parse("conv(4,3,1,1,nobias)-bn-relu-conv(4,3,1,1)-bn-relu-gap-linear(3)", {1, 6, 6});
  const std::int64_t N = 4;
  Inputs in = make_inputs(m, N, kSeed);
  AlignedBuffer<float> grad(m.layout().total()), stats(m.stats_layout().total());
  for (const Precision p : {Precision::kF32, Precision::kBf16}) {
    if (p == Precision::kBf16 && bf16_support() == Bf16Support::kNone) continue;
    Net net(m, true, p);
    if (p == Precision::kBf16) {
      Rounded r = round_to_bf16(in);
      net.forward_backward(r.params.data(), r.x.data(), in.labels.data(), N, grad.data(), {}, {},
                           stats.data());
    } else {
      net.forward_backward(in.params.data(), in.x.data(), in.labels.data(), N, grad.data(), {}, {},
                           stats.data());
    }
    EXPECT_EQ(net.times().eltwise, 0.0) << (p == Precision::kBf16 ? "bf16" : "f32");
  }
}

TEST(NetResnet, BatchNormModelsNeedStatistics) {
  omp_set_num_threads(1);
  const Model m = Model::parse("conv(4,3,1,1,nobias)-bn-relu-gap-linear(3)", {1, 5, 5});
  Inputs in = make_inputs(m, 2, kSeed);
  AlignedBuffer<float> grad(m.layout().total()), stats(m.stats_layout().total());
  Net net(m);
  EXPECT_THROW(
      net.forward_backward(in.params.data(), in.x.data(), in.labels.data(), 2, grad.data()),
      InternalError);
  EXPECT_THROW(net.forward(in.params.data(), in.x.data(), 2), InternalError);
  m.init_stats(stats.data());
  EXPECT_NO_THROW(net.forward(in.params.data(), in.x.data(), 2, stats.data()));
}

// bf16 (net_bf16_test.cpp's bound, |got - ref| <= c 2^-8 K max|ref| per tensor, K the longest
// dot product). The logits, the loss, the inference logits and the batch statistics are checked
// against the float64 reference on the same bf16 values: c 0.1 as there (measured worst 0.017,
// linear(40)-bn; resnet20 8.6e-4 logits, 5.8e-3 statistics).
// The gradients are checked against the reference that also stores activations and their
// gradients in bf16, which takes the Net's ReLU decisions: c 0.01 as there (measured worst
// 1.0e-3, two blocks on 16 rows; the 8-channel blocks on 4 rows in plain layouts 3.3e-6: every
// bf16 step of bn, gap and res, scale and shift converted from bf16, the sum of the two paths,
// is followed to f32 rounding). That reference
// cannot follow a deep network on few rows: a bn output computed in another order in f32 lands
// one bf16 step away now and then, and bn's backward on a few rows (M N x H x W values, the
// result a difference of terms M times larger) amplifies such steps layer after layer. There
// (`deep` cases: resnet20 and two blocks on 4 rows; both layouts alike, so not a layout matter)
// the bound is c 0.25 (measured worst 0.17-0.18), and the whole gradient must point where the
// float64 one does: cosine similarity at least 0.9 (measured 0.954-0.956 for resnet20, at
// least 0.996 for the others, whose bound is 0.99).
constexpr double kCLogits = 0.1;
constexpr double kCGrad = 0.01;
constexpr double kCGradDeep = 0.25;

double cosine(std::span<const float> a, const std::vector<double>& b) {
  double dot = 0, aa = 0, bb = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    dot += a[i] * b[i];
    aa += double(a[i]) * a[i];
    bb += b[i] * b[i];
  }
  return dot / std::sqrt(aa * bb);
}

class NetResnetBf16VsReference : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (!cpu_has_bf16())
      GTEST_SKIP() << "no AVX512_BF16 on this CPU (oneDNN " << onednn_isa()
                   << "): bf16 primitives are not native";
    omp_set_num_threads(1);
    std::printf("seed %llu, model %s, N %lld, K %lld, %s layouts\n",
                static_cast<unsigned long long>(kSeed), GetParam().spec, static_cast<long long>(N),
                static_cast<long long>(K), GetParam().blocked ? "blocked" : "plain");
  }
  Inputs inputs() const {
    Inputs made = make_inputs(m, N, kSeed);
    randomize_bn(m, made.params.data(), kSeed);
    return made;
  }
  const std::int64_t N = GetParam().N;
  const Model m = Model::parse(GetParam().spec, GetParam().input);
  const std::int64_t K = longest_dot_product(m);
  Inputs in = inputs();
  Rounded r = round_to_bf16(in);
};

TEST_P(NetResnetBf16VsReference, LogitsLossGradientsAndStatisticsMatch) {
  const auto ref = reference::net_forward_backward(m, r.params64, r.x64, in.labels, N);
  const auto ref_bf16 = reference::net_forward_backward(m, r.params64, r.x64, in.labels, N, {},
                                                        /*bf16_activations=*/true);
  Net net(m, GetParam().blocked, Precision::kBf16);
  AlignedBuffer<float> grad(m.layout().total()), stats(m.stats_layout().total());
  const double loss = net.forward_backward(r.params.data(), r.x.data(), in.labels.data(), N,
                                           grad.data(), {}, {}, stats.data());
  double scale = 1e-30;
  for (double v : ref.logits) scale = std::max(scale, std::abs(v));
  // The loss sums N rows, each moved by at most twice its row's largest logit error.
  EXPECT_NEAR(loss, ref.loss, 2.0 * double(N) * kCLogits * std::ldexp(1.0, -8) * double(K) * scale);
  const double c_grad = GetParam().deep ? kCGradDeep : kCGrad;
  double worst_grad = 0, worst_stats = 0;
  for (const auto& e : m.layout().entries())
    worst_grad = std::max(
        worst_grad, expect_within(grad.span().subspan(e.offset, e.shape.numel()),
                                  std::span(ref_bf16.grad).subspan(e.offset, e.shape.numel()), K,
                                  c_grad, e.name + " gradient"));
  const double cos = cosine(grad.span(), ref.grad);
  EXPECT_GE(cos, GetParam().deep ? 0.9 : 0.99) << "the gradient's direction";
  for (const auto& e : m.stats_layout().entries())
    worst_stats = std::max(
        worst_stats, expect_within(stats.span().subspan(e.offset, e.shape.numel()),
                                   std::span(ref.batch_stats).subspan(e.offset, e.shape.numel()), K,
                                   kCLogits, e.name));
  const AlignedBuffer<float> running = some_running_stats(m, kSeed);
  const auto want = reference::net_forward_inference(m, r.params64, r.x64, N,
                                                     to_double(running.data(), running.size()));
  const float* logits = net.forward(r.params.data(), r.x.data(), N, running.data());
  const double worst_logits =
      expect_within({logits, want.size()}, want, K, kCLogits, "inference logits");
  std::printf(
      "worst c: logits %.2e, statistics %.2e (bound %.3g), gradients %.2e (bound %.3g); "
      "cosine to the float64 gradient %.4f\n",
      worst_logits, worst_stats, kCLogits, worst_grad, c_grad, cos);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, NetResnetBf16VsReference,
    ::testing::Values(
        Case{"conv(16,3,1,1,nobias)-bn-relu-flatten-linear(5)", 5, {2, 6, 6}},
        Case{"conv(16,3,1,1,nobias)-bn-relu-flatten-linear(5)", 5, {2, 6, 6}, false},
        Case{"linear(40)-bn-relu-linear(4)", 16, {20, 1, 1}},
        Case{"conv(16,3,1,1,nobias)-bn-relu-res(16)-res(32,2)-gap-linear(4)", 16, {1, 9, 9}},
        Case{"conv(16,3,1,1,nobias)-bn-relu-res(16)-res(32,2)-gap-linear(4)", 16, {1, 9, 9}, false},
        Case{"conv(8,3,1,1,nobias)-bn-relu-res(8)-res(16,2)-gap-linear(4)", 4, {1, 9, 9}, false},
        Case{"conv(8,3,1,1,nobias)-bn-relu-res(8)-res(16,2)-gap-linear(4)",
             4,
             {1, 9, 9},
             true,
             /*deep=*/true},
        Case{"resnet20", 4, {1, 28, 28}, true, /*deep=*/true},
        Case{"resnet20", 4, {1, 28, 28}, false, /*deep=*/true}),
    case_name);

}  // namespace net_resnet_test
}  // namespace cohort::nn
