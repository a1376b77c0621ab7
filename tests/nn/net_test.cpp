// Net (oneDNN) against the float64 reference: logits, summed loss and every parameter's gradient;
// the reference against finite differences; plan reuse and pointer rebinding.
#include "cohort/nn/net.hpp"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "cohort/nn/batch_grad.hpp"
#include "cohort/tensor/buffer.hpp"
#include "net_reference.hpp"
#include "nn_test_util.hpp"

namespace cohort::nn {
namespace net_test {

using testing::Inputs;
using testing::make_inputs;
using testing::spec_case_name;

constexpr std::uint64_t kSeed = 20261130;

struct Case {
  const char* spec;
  std::int64_t N;
  SampleShape input = {1, 28, 28};  // ignored by mlp: specs
};

// How gtest prints a Case (in --gtest_list_tests and failures): not as a byte dump.
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.spec;
  if (std::string_view(c.spec).substr(0, 4) != "mlp:") *os << " on " << c.input.str();
  *os << ", N " << c.N;
}

std::vector<double> to_double(const AlignedBuffer<float>& b) {
  return std::vector<double>(b.data(), b.data() + b.size());
}

// Per tensor: the error relative to the tensor's largest reference gradient (float32 sums of
// up to 784 * N products) stays within 2e-5.
void expect_gradients_match(const Model& m, const AlignedBuffer<float>& grad,
                            const std::vector<double>& ref, const char* what) {
  for (const auto& e : m.layout().entries()) {
    double scale = 1e-12;
    for (std::size_t i = 0; i < e.shape.numel(); ++i)
      scale = std::max(scale, std::abs(ref[e.offset + i]));
    for (std::size_t i = 0; i < e.shape.numel(); ++i)
      ASSERT_NEAR(grad[e.offset + i], ref[e.offset + i], 2e-5 * scale)
          << e.name << " element " << i << " " << what;
  }
}

// The case's model, random inputs and the float64 reference's results (printed seed).
class NetVsReference : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    omp_set_num_threads(1);
    std::printf("seed %llu, model %s, N %lld\n", static_cast<unsigned long long>(kSeed),
                GetParam().spec, static_cast<long long>(GetParam().N));
  }
  const std::int64_t N = GetParam().N;
  const Model m = Model::parse(GetParam().spec, GetParam().input);
  Inputs in = make_inputs(m, N, kSeed);
  const StreamKey key{kSeed, 3, 1};  // dropout streams of step 3, leaf 1
  const reference::NetResult ref =
      reference::net_forward_backward(m, to_double(in.params), to_double(in.x), in.labels, N, key);
};

TEST_P(NetVsReference, LogitsLossAndEveryGradientMatch) {
  Net net(m);
  AlignedBuffer<float> grad(m.layout().total());
  const std::vector<float> x_before(in.x.data(), in.x.data() + in.x.size());
  double loss =
      net.forward_backward(in.params.data(), in.x.data(), in.labels.data(), N, grad.data(), key);
  EXPECT_NEAR(loss, ref.loss, 1e-5 * std::max(1.0, std::abs(ref.loss)));
  // The input is the caller's (const): a first ReLU or dropout must not change it.
  ASSERT_TRUE(std::equal(x_before.begin(), x_before.end(), in.x.data()));

  if (!m.has_dropout()) {  // inference has no dropout, so its logits differ from training's
    const float* logits = net.forward(in.params.data(), in.x.data(), N);
    for (std::size_t i = 0; i < ref.logits.size(); ++i)
      ASSERT_NEAR(logits[i], ref.logits[i], 1e-5 * std::max(1.0, std::abs(ref.logits[i]))) << i;
  }

  expect_gradients_match(m, grad, ref.grad, "");
}

// Batch weight gradients: the Net keeps each linear layer's input and output-gradient rows and
// leaves the layer's gradient ranges untouched; linear_weight_grad / linear_bias_grad over those
// rows (split into row ranges that do not divide the layer evenly, as root chunks may) give the
// reference gradient; every other tensor's gradient is the Net's own.
TEST_P(NetVsReference, BatchWeightGradientsFromTheKeptRowsMatch) {
  std::vector<const LayerSpec*> linear;
  for (const auto& l : m.layers())
    if (l.kind == LayerSpec::Kind::kLinear) linear.push_back(&l);
  std::vector<AlignedBuffer<float>> xs, dys;
  std::vector<LinearRows> rows;
  for (const LayerSpec* l : linear) {
    const bool first = l == &m.layers().front();
    xs.emplace_back(first ? 0 : static_cast<std::size_t>(N * l->in.C));
    dys.emplace_back(static_cast<std::size_t>(N * l->out.C));
    rows.push_back({first ? nullptr : xs.back().data(), dys.back().data()});
  }
  Net net(m);
  AlignedBuffer<float> grad(m.layout().total());
  constexpr float kSentinel = 12345.0f;
  for (std::size_t i = 0; i < grad.size(); ++i) grad[i] = kSentinel;
  const double loss = net.forward_backward(in.params.data(), in.x.data(), in.labels.data(), N,
                                           grad.data(), key, rows);
  EXPECT_NEAR(loss, ref.loss, 1e-5 * std::max(1.0, std::abs(ref.loss)));
  for (std::size_t k = 0; k < linear.size(); ++k) {
    const LayerSpec& l = *linear[k];
    const std::int64_t IC = l.in.C, OC = l.out.C;
    for (std::int64_t i = 0; i < IC * OC; ++i)
      ASSERT_EQ(grad[l.weight + static_cast<std::size_t>(i)], kSentinel) << l.name << " " << i;
    const float* x = rows[k].x ? static_cast<const float*>(rows[k].x) : in.x.data();
    const float* dy = static_cast<const float*>(rows[k].dy);
    // Row ranges of 1, 2, 3, ... rows, so range ends fall anywhere.
    for (std::int64_t i0 = 0, len = 1; i0 < IC; i0 += len, ++len) {
      const std::int64_t i1 = std::min(IC, i0 + len);
      linear_weight_grad(x, dy, N, IC, OC, i0, i1, grad.data() + l.weight + i0 * OC);
    }
    for (std::int64_t o0 = 0; o0 < OC; o0 += 3)
      linear_bias_grad(dy, N, OC, o0, std::min(OC, o0 + 3), grad.data() + l.bias + o0);
  }
  expect_gradients_match(m, grad, ref.grad, "(batch weight gradients)");
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, NetVsReference,
    ::testing::Values(
        Case{"mlp:13-10", 1}, Case{"mlp:13-10", 5}, Case{"mlp:17-9-5", 7},
        Case{"mlp:31-64-33-10", 32}, Case{"mlp:784-512-256-10", 3}, Case{"mlp:784-512-256-10", 64},
        Case{"conv(4,3)-relu-maxpool(2)-flatten-linear(10)", 3, {1, 12, 12}},
        Case{"conv(3,3,2,1)-relu-avgpool(2)-flatten-linear(5)", 2, {2, 11, 11}},
        Case{"conv(5,4,3,2)-maxpool(3,2)-flatten-linear(6)", 2, {3, 13, 13}},
        Case{"conv(16,3)-dropout(0.5)-relu-flatten-linear(4)", 2, {1, 8, 8}},
        Case{"conv(8,5)-relu-maxpool(2)-conv(16,3,1,1)-relu-maxpool(2)-flatten-dropout(0.3)-"
             "linear(12)-relu-linear(10)",
             4,
             {1, 20, 20}},
        Case{"cnn", 2, {1, 28, 28}}, Case{"cnn", 16, {1, 28, 28}},
        // First layers that work in place or view their input: the plan copies the input.
        Case{"flatten-linear(10)", 3, {1, 8, 8}}, Case{"relu-flatten-linear(5)", 2, {2, 6, 6}},
        Case{"dropout(0.5)-flatten-linear(4)", 3, {1, 8, 8}},
        Case{"flatten-dropout(0.3)-linear(6)", 2, {1, 8, 8}},
        Case{"relu-conv(4,3)-flatten-linear(10)", 2, {1, 8, 8}}),
    spec_case_name<Case>);

TEST(Reference, GradientMatchesFiniteDifferences) {
  // Central differences in float64 on a small MLP: validates the oracle itself.
  Model m = Model::parse("mlp:6-5-4-3");
  const std::int64_t N = 4;
  Inputs in = make_inputs(m, N, kSeed);
  auto params = to_double(in.params);
  auto x = to_double(in.x);
  auto ref = reference::net_forward_backward(m, params, x, in.labels, N);
  const double h = 1e-6;
  for (const auto& e : m.layout().entries())
    for (std::size_t i = 0; i < e.shape.numel(); ++i) {
      auto p = params;
      p[e.offset + i] += h;
      double up = reference::net_forward_backward(m, p, x, in.labels, N).loss;
      p[e.offset + i] -= 2 * h;
      double down = reference::net_forward_backward(m, p, x, in.labels, N).loss;
      ASSERT_NEAR(ref.grad[e.offset + i], (up - down) / (2 * h), 1e-6) << e.name << " " << i;
    }
}

// Differentiates the Net's own float32 loss numerically, one parameter at a time, and compares
// with its gradient. Valid only where no ReLU input or pooled maximum sits within h of a kink or
// a tie; with the fixed seeds below none does (a crossing would show up as a large error).
void expect_finite_differences_match(const Model& m, std::int64_t N, std::uint64_t seed) {
  omp_set_num_threads(1);
  Inputs in = make_inputs(m, N, seed);
  Net net(m);
  AlignedBuffer<float> grad(m.layout().total()), scratch(m.layout().total());
  net.forward_backward(in.params.data(), in.x.data(), in.labels.data(), N, grad.data());
  AlignedBuffer<float> p(m.layout().total());
  std::copy(in.params.data(), in.params.data() + p.size(), p.data());
  const float h = 1e-3f;
  auto loss_at = [&] {
    return net.forward_backward(p.data(), in.x.data(), in.labels.data(), N, scratch.data());
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

TEST(Net, EveryParameterGradientMatchesFiniteDifferences) {
  expect_finite_differences_match(Model::parse("mlp:8-6-5-3"), 4, kSeed + 1);
}

TEST(Net, SmallCnnGradientMatchesFiniteDifferences) {
  // Convolution with padding, ReLU, max pooling, flatten and a linear layer.
  expect_finite_differences_match(
      Model::parse("conv(3,3,1,1)-relu-maxpool(2)-flatten-linear(4)", {2, 6, 6}), 2, kSeed + 2);
}

TEST(Net, PlainLayoutsComputeTheSameNetwork) {
  // The layout choice is a performance choice: plain nchw gives the reference's numbers too.
  omp_set_num_threads(1);
  Model m = Model::parse("cnn");
  const std::int64_t N = 3;
  Inputs in = make_inputs(m, N, kSeed + 3);
  auto ref =
      reference::net_forward_backward(m, to_double(in.params), to_double(in.x), in.labels, N);
  for (bool blocked : {true, false}) {
    Net net(m, blocked);
    AlignedBuffer<float> grad(m.layout().total());
    double loss =
        net.forward_backward(in.params.data(), in.x.data(), in.labels.data(), N, grad.data());
    EXPECT_NEAR(loss, ref.loss, 1e-5 * std::abs(ref.loss)) << "blocked " << blocked;
    expect_gradients_match(m, grad, ref.grad, blocked ? "blocked" : "plain");
  }
}

TEST(Net, PlansAreReusedAndRebindToNewPointers) {
  omp_set_num_threads(1);
  Model m = Model::parse("mlp:31-16-10");
  Inputs a = make_inputs(m, 8, 1), b = make_inputs(m, 3, 2);
  Net net(m);
  AlignedBuffer<float> g1(m.layout().total()), g2(m.layout().total()), g3(m.layout().total());
  double l1 = net.forward_backward(a.params.data(), a.x.data(), a.labels.data(), 8, g1.data());
  net.forward_backward(b.params.data(), b.x.data(), b.labels.data(), 3, g3.data());  // other N
  // Same inputs at other addresses: bitwise the same result.
  AlignedBuffer<float> params_copy(a.params.size()), x_copy(a.x.size());
  std::copy(a.params.data(), a.params.data() + a.params.size(), params_copy.data());
  std::copy(a.x.data(), a.x.data() + a.x.size(), x_copy.data());
  double l2 =
      net.forward_backward(params_copy.data(), x_copy.data(), a.labels.data(), 8, g2.data());
  EXPECT_EQ(l1, l2);
  for (std::size_t i = 0; i < g1.size(); ++i) ASSERT_EQ(g1[i], g2[i]) << i;
  // Other values at other addresses through the same plan: a fresh Net's result, not a's (equal
  // values above cannot tell a rebound pointer from a stale one).
  Inputs c = make_inputs(m, 8, 3);
  AlignedBuffer<float> g4(m.layout().total()), want(m.layout().total());
  const double l4 =
      net.forward_backward(c.params.data(), c.x.data(), c.labels.data(), 8, g4.data());
  const double l_want =
      Net(m).forward_backward(c.params.data(), c.x.data(), c.labels.data(), 8, want.data());
  EXPECT_NE(l4, l1);
  EXPECT_EQ(l4, l_want);
  EXPECT_TRUE(testing::same_bits(g4.span(), want.span()));
  EXPECT_GT(net.times().matmul, 0.0);
}

}  // namespace net_test
}  // namespace cohort::nn
