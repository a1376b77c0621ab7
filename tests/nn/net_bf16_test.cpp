// A bf16 Net (Precision::kBf16) against the float64 reference given the same bf16-rounded
// parameters and inputs, so the tolerance covers only what bf16 adds inside the Net: activations
// (and the logits' gradient) rounded to bf16 between layers, and f32 accumulation. Also: batch
// weight gradients from bf16 rows (Net and nn::linear_weight_grad / linear_bias_grad against a
// float64 loop), determinism across calls and replicas, the precision checks, the ISA report.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ostream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "cohort/core/error.hpp"
#include "cohort/core/rng.hpp"
#include "cohort/nn/batch_grad.hpp"
#include "cohort/nn/linear_floor.hpp"
#include "cohort/nn/net.hpp"
#include "cohort/nn/version.hpp"
#include "cohort/tensor/bf16.hpp"
#include "cohort/tensor/buffer.hpp"
#include "net_reference.hpp"
#include "nn_test_util.hpp"

namespace cohort::nn {
namespace net_bf16_test {

using testing::expect_within;
using testing::Inputs;
using testing::longest_dot_product;
using testing::make_inputs;
using testing::round_to_bf16;
using testing::Rounded;
using testing::same_bits;
using testing::spec_case_name;

constexpr std::uint64_t kSeed = 20261202;

// The tolerance. bf16 keeps 8 significant bits, so one rounding has relative error <= 2^-9 and
// a dot product of length K over values each off by that much is off by at most about
// 2^-8 * K relative to the largest of its terms' sizes. Each checked tensor must satisfy
//     max_i |got_i - ref_i|  <=  c * 2^-8 * K * max_i |ref_i|
// with K the model's longest forward dot product (the largest IC * KH * KW of its linear and
// conv layers) and c picked from measurement (each test prints its worst c; seed kSeed):
//  * Logits and loss, against the float64 reference on the same bf16 parameters and inputs:
//    worst measured c 0.045 (linear(16)-relu-linear(10)), the others <= 0.015. kCLogits = 0.1.
//  * Gradients cannot use that reference: the derivatives of ReLU and max pooling jump, and bf16
//    activations move values across ReLU's kink and make max-pooling ties (8-bit mantissas), so
//    a few gradient entries take another path — measured up to c = 0.12 (15% of the largest
//    gradient on cnn, N 3), which a bound loose enough to pass would not catch real bugs. So
//    gradients are checked against the reference that also stores activations and their
//    gradients in bf16 (reference::net_forward_backward(..., bf16_activations = true)): it takes
//    the Net's decisions and leaves accumulation order and rare one-step rounding differences:
//    worst measured c 2.5e-3 (conv(10,3)-avgpool(3,2): overlapping average pooling), the others
//    <= 7e-7. kCGrad = 0.01.
// Rounding errors add up at random, so errors grow more like sqrt(K) than K; small K sets c.
constexpr double kCLogits = 0.1;
constexpr double kCGrad = 0.01;

struct Case {
  const char* spec;
  std::int64_t N;
  SampleShape input = {1, 28, 28};  // ignored by mlp: specs
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.spec;
  if (std::string_view(c.spec).substr(0, 4) != "mlp:") *os << " on " << c.input.str();
  *os << ", N " << c.N;
}

// The gradient of every parameter tensor; returns the worst observed c.
double expect_gradients_within(const Model& m, std::span<const float> grad,
                               const std::vector<double>& ref, std::int64_t K, const char* what) {
  double worst = 0;
  for (const auto& e : m.layout().entries())
    worst = std::max(worst, expect_within(grad.subspan(e.offset, e.shape.numel()),
                                          std::span(ref).subspan(e.offset, e.shape.numel()), K,
                                          kCGrad, e.name + " gradient " + what));
  return worst;
}

class NetBf16VsReference : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (!cpu_has_bf16())
      GTEST_SKIP() << "no AVX512_BF16 on this CPU (oneDNN " << onednn_isa()
                   << "): bf16 primitives are not native";
    omp_set_num_threads(1);
    std::printf("seed %llu, model %s, N %lld, K %lld\n", static_cast<unsigned long long>(kSeed),
                GetParam().spec, static_cast<long long>(N), static_cast<long long>(K));
  }
  const std::int64_t N = GetParam().N;
  const Model m = Model::parse(GetParam().spec, GetParam().input);
  const std::int64_t K = longest_dot_product(m);
  Inputs in = make_inputs(m, N, kSeed);
  Rounded r = round_to_bf16(in);
  const StreamKey key{kSeed, 5, 2};  // dropout streams of step 5, leaf 2
  // The float64 reference on the same (bf16) values: for the logits and the loss.
  const reference::NetResult ref =
      reference::net_forward_backward(m, r.params64, r.x64, in.labels, N, key);
  // The same, with activations and their gradients stored in bf16 as the Net does: for the
  // gradients (see kCGrad).
  const reference::NetResult ref_bf16 = reference::net_forward_backward(
      m, r.params64, r.x64, in.labels, N, key, /*bf16_activations=*/true);
  // The loss is a sum over N rows of terms each moved by at most twice its row's largest logit
  // error.
  double loss_tolerance() const {
    double scale = 1e-30;
    for (double v : ref.logits) scale = std::max(scale, std::abs(v));
    return 2.0 * double(N) * kCLogits * std::ldexp(1.0, -8) * double(K) * scale;
  }
};

TEST_P(NetBf16VsReference, LogitsLossAndEveryGradientMatch) {
  Net net(m, /*blocked_layouts=*/true, Precision::kBf16);
  ASSERT_EQ(net.precision(), Precision::kBf16);
  AlignedBuffer<float> grad(m.layout().total());
  const double loss =
      net.forward_backward(r.params.data(), r.x.data(), in.labels.data(), N, grad.data(), key);
  EXPECT_NEAR(loss, ref.loss, loss_tolerance());
  const double worst = expect_gradients_within(m, grad.span(), ref_bf16.grad, K, "");
  double worst_logits = 0;
  if (!m.has_dropout()) {  // inference has no dropout, so its logits differ from training's
    const float* logits = net.forward(r.params.data(), r.x.data(), N);
    worst_logits = expect_within({logits, ref.logits.size()}, ref.logits, K, kCLogits, "logits");
  }
  std::printf("worst c: logits %.2e (bound %.3g), gradients %.2e (bound %.3g)\n", worst_logits,
              kCLogits, worst, kCGrad);
}

// The bf16 Net really computes in bf16: an f32 Net given the same (rounded) values differs, and
// (a bf16 Net that silently ran f32
// primitives on converted copies would pass the tests above).
TEST_P(NetBf16VsReference, DiffersFromTheF32NetOnTheSameValues) {
  if (longest_dot_product(m) < 16) GTEST_SKIP() << "too few roundings to tell";
  Net net(m, true, Precision::kBf16), net32(m);
  AlignedBuffer<float> grad(m.layout().total()), grad32(m.layout().total());
  AlignedBuffer<float> p32(r.params.size()), x32(r.x.size());
  to_float(r.params.data(), p32.data(), p32.size());
  to_float(r.x.data(), x32.data(), x32.size());
  net.forward_backward(r.params.data(), r.x.data(), in.labels.data(), N, grad.data(), key);
  net32.forward_backward(p32.data(), x32.data(), in.labels.data(), N, grad32.data(), key);
  EXPECT_FALSE(same_bits(grad.span(), grad32.span()));
}

// Batch weight gradients: the Net keeps each linear layer's rows in bf16; linear_weight_grad
// and linear_bias_grad on them (in uneven row ranges) give the reference gradient within the
// same bound, and the Net leaves the linear layers' ranges of grad untouched.
TEST_P(NetBf16VsReference, BatchWeightGradientsFromTheKeptRowsMatch) {
  std::vector<const LayerSpec*> linear;
  for (const auto& l : m.layers())
    if (l.kind == LayerSpec::Kind::kLinear) linear.push_back(&l);
  std::vector<AlignedBuffer<bf16>> xs, dys;
  std::vector<LinearRows> rows;
  for (const LayerSpec* l : linear) {
    const bool first = l == &m.layers().front();
    xs.emplace_back(first ? 0 : static_cast<std::size_t>(N * l->in.C));
    dys.emplace_back(static_cast<std::size_t>(N * l->out.C));
    rows.push_back({first ? nullptr : xs.back().data(), dys.back().data()});
  }
  Net net(m, true, Precision::kBf16);
  AlignedBuffer<float> grad(m.layout().total());
  constexpr float kSentinel = 12345.0f;
  for (std::size_t i = 0; i < grad.size(); ++i) grad[i] = kSentinel;
  const double loss = net.forward_backward(r.params.data(), r.x.data(), in.labels.data(), N,
                                           grad.data(), key, rows);
  EXPECT_NEAR(loss, ref.loss, loss_tolerance());
  for (std::size_t k = 0; k < linear.size(); ++k) {
    const LayerSpec& l = *linear[k];
    const std::int64_t IC = l.in.C, OC = l.out.C;
    for (std::int64_t i = 0; i < IC * OC; ++i)
      ASSERT_EQ(grad[l.weight + static_cast<std::size_t>(i)], kSentinel) << l.name << " " << i;
    const bf16* x = rows[k].x ? static_cast<const bf16*>(rows[k].x) : r.x.data();
    const bf16* dy = static_cast<const bf16*>(rows[k].dy);
    for (std::int64_t i0 = 0, len = 1; i0 < IC; i0 += len, ++len) {
      const std::int64_t i1 = std::min(IC, i0 + len);
      linear_weight_grad(x, dy, N, IC, OC, i0, i1, grad.data() + l.weight + i0 * OC);
    }
    for (std::int64_t o0 = 0; o0 < OC; o0 += 3)
      linear_bias_grad(dy, N, OC, o0, std::min(OC, o0 + 3), grad.data() + l.bias + o0);
  }
  const double worst =
      expect_gradients_within(m, grad.span(), ref_bf16.grad, K, "(batch weight gradients)");
  std::printf("worst c %.2e (bound %.3g)\n", worst, kCGrad);
}

// A leaf's result is a function of its inputs only: the same call twice on one Net, on a Net
// that ran other batch sizes and keys in between, and on another Net (replica), on this thread
// or another, give the same bits.
TEST_P(NetBf16VsReference, DeterministicAcrossCallsAndReplicas) {
  auto run = [&](Net& net, AlignedBuffer<float>& grad) {
    return net.forward_backward(r.params.data(), r.x.data(), in.labels.data(), N, grad.data(), key);
  };
  Net a(m, true, Precision::kBf16), b(m, true, Precision::kBf16);
  AlignedBuffer<float> g1(m.layout().total()), g2(m.layout().total()), g3(m.layout().total());
  const double l1 = run(a, g1);
  // Other work in between: another batch size and another key on a.
  Inputs other = make_inputs(m, N + 1, kSeed + 1);
  Rounded ro = round_to_bf16(other);
  AlignedBuffer<float> scratch(m.layout().total());
  a.forward_backward(ro.params.data(), ro.x.data(), other.labels.data(), N + 1, scratch.data(),
                     {kSeed, 6, 0});
  a.forward_backward(ro.params.data(), r.x.data(), in.labels.data(), N, scratch.data(),
                     {kSeed, 6, 0});
  const double l2 = run(a, g2);
  const double l3 = run(b, g3);
  EXPECT_EQ(l1, l2);
  EXPECT_EQ(l1, l3);
  EXPECT_TRUE(same_bits(g1.span(), g2.span())) << "same Net";
  EXPECT_TRUE(same_bits(g1.span(), g3.span())) << "another Net";
  EXPECT_FALSE(same_bits(g1.span(), scratch.span())) << "the other work must differ";
  // Another Net on another thread (as replicas run), which must set OpenMP to one thread too.
  AlignedBuffer<float> g4(m.layout().total());
  double l4 = 0;
  std::thread([&] {
    omp_set_num_threads(1);
    Net c(m, true, Precision::kBf16);
    l4 = run(c, g4);
  }).join();
  EXPECT_EQ(l1, l4);
  EXPECT_TRUE(same_bits(g1.span(), g4.span())) << "another Net on another thread";
}

// Every layer kind (linear, conv with stride and padding, max and average pooling, ReLU,
// flatten, dropout on flat and on conv outputs), first layers that copy the input, a last layer
// that is not linear, and the two default models.
INSTANTIATE_TEST_SUITE_P(
    Shapes, NetBf16VsReference,
    ::testing::Values(
        Case{"mlp:13-10", 5}, Case{"mlp:31-64-33-10", 32}, Case{"mlp:784-512-256-10", 8},
        Case{"conv(4,3)-relu-maxpool(2)-flatten-linear(10)", 3, {1, 12, 12}},
        Case{"conv(3,3,2,1)-relu-avgpool(2)-flatten-linear(5)", 2, {2, 11, 11}},
        Case{"conv(5,4,3,2)-maxpool(3,2)-flatten-linear(6)", 2, {3, 13, 13}},
        Case{"conv(16,3)-dropout(0.5)-relu-flatten-linear(4)", 2, {1, 8, 8}},
        Case{"conv(8,5)-relu-maxpool(2)-conv(16,3,1,1)-relu-maxpool(2)-flatten-dropout(0.3)-"
             "linear(12)-relu-linear(10)",
             4,
             {1, 20, 20}},
        Case{"cnn", 4, {1, 28, 28}}, Case{"relu-flatten-linear(5)", 2, {2, 6, 6}},
        Case{"dropout(0.5)-flatten-linear(4)", 3, {1, 8, 8}},
        Case{"linear(16)-relu-linear(10)", 4, {20, 1, 1}},
        Case{"conv(10,3)-avgpool(3,2)-flatten-linear(7)", 3, {2, 9, 9}}),
    spec_case_name<Case>);

TEST(NetBf16, PlainLayoutsComputeTheSameNetwork) {
  if (!cpu_has_bf16()) GTEST_SKIP() << "no AVX512_BF16";
  omp_set_num_threads(1);
  const Model m = Model::parse("cnn");
  const std::int64_t N = 3;
  Inputs in = make_inputs(m, N, kSeed + 3);
  Rounded r = round_to_bf16(in);
  auto ref = reference::net_forward_backward(m, r.params64, r.x64, in.labels, N, {}, true);
  for (bool blocked : {true, false}) {
    Net net(m, blocked, Precision::kBf16);
    AlignedBuffer<float> grad(m.layout().total());
    net.forward_backward(r.params.data(), r.x.data(), in.labels.data(), N, grad.data());
    expect_gradients_within(m, grad.span(), ref.grad, longest_dot_product(m),
                            blocked ? "blocked" : "plain");
  }
}

// Net::weights_changed on a layer list: its bf16 inner products' weights are reordered into the
// primitives' layouts once after each call. Until the first call every run
// reorders them, so a run on values changed in place (same array) equals a fresh net's; after
// it, a plan reorders them once, on its next run (training and inference plans alike), and
// reuses that copy until the next call. Nets sharing their copies (share_weight_copies, as the
// trainer's replicas do) give a lone net's results, from two threads at once, and only the
// owner counts the copies.
TEST(NetBf16, WeightsChangedReordersTheWeightsOnceAfterEachCall) {
  if (!plans_choose_layout(Precision::kBf16, true))
    GTEST_SKIP() << "the plans keep plain inner-product weights here (plans_choose_layout)";
  omp_set_num_threads(1);
  const Model m = Model::parse("conv(8,3,1,1)-relu-flatten-linear(32)-relu-linear(10)", {1, 8, 8});
  const std::int64_t N = 4;
  const Inputs in = make_inputs(m, N, kSeed + 5);
  const Rounded r = round_to_bf16(in);
  const std::size_t n = m.layout().total();
  std::vector<bf16> changed(n);
  for (std::size_t i = 0; i < n; ++i) changed[i] = to_bf16(1.25f * to_float(r.params[i]));
  AlignedBuffer<float> g(n), want(n);
  const std::int32_t* y = in.labels.data();
  Net fresh(m, true, Precision::kBf16);
  const double want_loss = fresh.forward_backward(changed.data(), r.x.data(), y, N, want.data());
  const double want_eval = fresh.evaluate(changed.data(), r.x.data(), y, N).loss;
  ASSERT_GT(fresh.memory().weight_copies, 0u) << "no weight in a blocked layout: nothing to test";
  auto same_as_fresh = [&](double loss) {
    return loss == want_loss && std::memcmp(g.data(), want.data(), n * sizeof(float)) == 0;
  };
  AlignedBuffer<bf16> array(n);  // one array whose values the caller changes in place
  auto set = [&](const bf16* values) { std::copy(values, values + n, array.data()); };

  set(r.params.data());
  Net never(m, true, Precision::kBf16);  // weights_changed never called
  never.forward_backward(array.data(), r.x.data(), y, N, g.data());
  never.evaluate(array.data(), r.x.data(), y, N);
  set(changed.data());
  EXPECT_TRUE(same_as_fresh(never.forward_backward(array.data(), r.x.data(), y, N, g.data())));
  EXPECT_EQ(never.evaluate(array.data(), r.x.data(), y, N).loss, want_eval);

  set(r.params.data());
  Net net(m, true, Precision::kBf16);
  net.weights_changed();
  net.forward_backward(array.data(), r.x.data(), y, N, g.data());
  const double before_eval = net.evaluate(array.data(), r.x.data(), y, N).loss;
  set(changed.data());
  // Not told: the copies of the old values are reused (the results differ from the fresh net's).
  EXPECT_FALSE(same_as_fresh(net.forward_backward(array.data(), r.x.data(), y, N, g.data())));
  EXPECT_NE(net.evaluate(array.data(), r.x.data(), y, N).loss, want_eval);
  net.weights_changed();
  EXPECT_TRUE(same_as_fresh(net.forward_backward(array.data(), r.x.data(), y, N, g.data())));
  EXPECT_EQ(net.evaluate(array.data(), r.x.data(), y, N).loss, want_eval);
  EXPECT_NE(want_eval, before_eval);

  // Two nets on one set of copies, told of each change as the trainer tells its replicas.
  set(r.params.data());
  Net a(m, true, Precision::kBf16), b(m, true, Precision::kBf16);
  b.share_weight_copies(a);
  a.weights_changed();
  b.weights_changed();
  a.forward_backward(array.data(), r.x.data(), y, N, g.data());
  set(changed.data());
  a.weights_changed();
  b.weights_changed();
  EXPECT_TRUE(same_as_fresh(b.forward_backward(array.data(), r.x.data(), y, N, g.data())));
  a.weights_changed();
  b.weights_changed();
  AlignedBuffer<float> ga(n), gb(n);
  double la = 0, lb = 0;
  std::thread t([&] {
    omp_set_num_threads(1);
    la = a.forward_backward(array.data(), r.x.data(), y, N, ga.data());
  });
  lb = b.forward_backward(array.data(), r.x.data(), y, N, gb.data());
  t.join();
  EXPECT_EQ(la, want_loss);
  EXPECT_EQ(lb, want_loss);
  EXPECT_EQ(std::memcmp(ga.data(), want.data(), n * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(gb.data(), want.data(), n * sizeof(float)), 0);
  EXPECT_EQ(b.memory().weight_copies, 0u);
  EXPECT_EQ(a.memory().weight_copies, fresh.memory().weight_copies);
}

// Net::keep_weight_copies: the inner products' copies follow the ranges the caller reports
// (cutting rows and row pairs anywhere, from two threads at once, on either of two nets sharing
// the copies) and are not reordered by weights_changed, so weights changed without being reported
// are not seen; a run on another parameter array reorders from it, and the next run on the kept
// array from that.
TEST(NetBf16, KeptWeightCopiesFollowTheReportedRangesAndAreNotReordered) {
  if (!plans_choose_layout(Precision::kBf16, true))
    GTEST_SKIP() << "the plans keep plain inner-product weights here (plans_choose_layout)";
  omp_set_num_threads(1);
  const Model m = Model::parse("flatten-linear(48)-relu-linear(10)", {1, 8, 8});
  const std::int64_t N = 6;
  const Inputs in = make_inputs(m, N, kSeed + 6);
  const Rounded r = round_to_bf16(in);
  const std::size_t n = m.layout().total();
  std::vector<bf16> changed(n);
  for (std::size_t i = 0; i < n; ++i) changed[i] = to_bf16(1.25f * to_float(r.params[i]));
  const std::int32_t* y = in.labels.data();
  struct Result {
    double loss, eval;
    std::vector<float> grad;
    bool operator==(const Result&) const = default;
  };
  auto run = [&](Net& net, const bf16* params) {
    AlignedBuffer<float> g(n);
    Result res{net.forward_backward(params, r.x.data(), y, N, g.data()), 0, {}};
    res.eval = net.evaluate(params, r.x.data(), y, N).loss;
    res.grad.assign(g.data(), g.data() + n);
    return res;
  };
  Net fresh(m, true, Precision::kBf16);
  const Result original = run(fresh, r.params.data()), scaled = run(fresh, changed.data());
  ASSERT_GT(fresh.memory().weight_copies, 0u) << "no weight in a blocked layout: nothing to test";
  ASSERT_NE(original, scaled);

  AlignedBuffer<bf16> array(n);  // the kept array, changed in place
  auto set = [&](const bf16* values) { std::copy(values, values + n, array.data()); };
  set(r.params.data());
  Net a(m, true, Precision::kBf16), b(m, true, Precision::kBf16);
  b.share_weight_copies(a);
  b.keep_weight_copies(array.data());  // holds for a too
  auto changed_between_runs = [&] {
    a.weights_changed();
    b.weights_changed();
  };
  changed_between_runs();
  EXPECT_EQ(run(a, array.data()), original);  // the first run writes the copies whole

  SCOPED_TRACE("seed " + std::to_string(kSeed + 7));
  Rng rng({kSeed + 7});
  std::vector<std::size_t> cuts{0, n};
  for (int k = 0; k < 11; ++k) cuts.push_back(static_cast<std::size_t>(rng.next_u64() % (n + 1)));
  std::sort(cuts.begin(), cuts.end());
  set(changed.data());
  auto report = [&](Net& net, std::size_t parity) {
    for (std::size_t k = parity; k + 1 < cuts.size(); k += 2)
      net.weights_written(cuts[k], cuts[k + 1]);
  };
  std::thread other([&] { report(b, 1); });
  report(a, 0);
  other.join();
  changed_between_runs();
  EXPECT_EQ(run(b, array.data()), scaled);
  EXPECT_EQ(run(a, array.data()), scaled);

  set(r.params.data());    // not reported: the copies keep the scaled weights (the biases, read
  changed_between_runs();  // from the array, are the original ones)
  EXPECT_NE(run(a, array.data()), original);
  a.weights_written(0, n);
  changed_between_runs();
  EXPECT_EQ(run(b, array.data()), original);

  changed_between_runs();
  EXPECT_EQ(run(a, changed.data()), scaled);  // another array: reordered from it
  changed_between_runs();
  EXPECT_EQ(run(a, array.data()), original);  // and back from the kept one
}

TEST(NetBf16, TheOtherPrecisionsFunctionsThrow) {
  omp_set_num_threads(1);
  const Model m = Model::parse("mlp:8-4");
  AlignedBuffer<float> p(m.layout().total()), x(8), grad(m.layout().total());
  AlignedBuffer<bf16> pb(m.layout().total()), xb(8);
  const std::int32_t labels[1] = {0};
  Net f32(m), b16(m, true, Precision::kBf16);
  EXPECT_EQ(f32.precision(), Precision::kF32);
  EXPECT_THROW(f32.forward_backward(pb.data(), xb.data(), labels, 1, grad.data()), InternalError);
  EXPECT_THROW(f32.forward(pb.data(), xb.data(), 1), InternalError);
  EXPECT_THROW(b16.forward_backward(p.data(), x.data(), labels, 1, grad.data()), InternalError);
  EXPECT_THROW(b16.forward(p.data(), x.data(), 1), InternalError);
}

// linear_weight_grad on bf16 rows against a float64 loop: the products of two bf16 values are
// exact in f32, so only f32 accumulation differs: |dw - ref| <= rows * 2^-24 * sum |x dy|
// (the classical bound for a sum of `rows` terms). The bias is a float sum in row order:
// bitwise the plain loop's.
TEST(BatchGradBf16, WeightAndBiasGradientsMatchAFloat64Loop) {
  if (bf16_support() == Bf16Support::kNone)
    GTEST_SKIP() << "oneDNN has no bf16 GEMM on this CPU (it dispatches " << onednn_isa() << ")";
  omp_set_num_threads(1);
  for (const auto& [rows, in, out] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{1, 1, 1},
                                      {7, 13, 5},
                                      {64, 65, 63},
                                      {128, 784, 512},
                                      {33, 256, 10}}) {
    Rng rng({kSeed, static_cast<std::uint64_t>(rows * 1000 + in)});
    AlignedBuffer<bf16> x(static_cast<std::size_t>(rows * in)),
        dy(static_cast<std::size_t>(rows * out));
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = to_bf16(rng.uniform(-1.0f, 1.0f));
    for (std::size_t i = 0; i < dy.size(); ++i) dy[i] = to_bf16(rng.uniform(-1.0f, 1.0f));
    AlignedBuffer<float> dw(static_cast<std::size_t>(in * out)), db(static_cast<std::size_t>(out));
    for (std::int64_t i0 = 0, len = 1; i0 < in; i0 += len, len = len * 2 + 1) {
      const std::int64_t i1 = std::min(in, i0 + len);
      linear_weight_grad(x.data(), dy.data(), rows, in, out, i0, i1, dw.data() + i0 * out);
    }
    for (std::int64_t o0 = 0; o0 < out; o0 += 7)
      linear_bias_grad(dy.data(), rows, out, o0, std::min(out, o0 + 7), db.data() + o0);
    for (std::int64_t i = 0; i < in; ++i)
      for (std::int64_t o = 0; o < out; ++o) {
        double s = 0, abs_sum = 0;
        for (std::int64_t r = 0; r < rows; ++r) {
          const double t = double(to_float(x[r * in + i])) * to_float(dy[r * out + o]);
          s += t;
          abs_sum += std::abs(t);
        }
        ASSERT_NEAR(dw[i * out + o], s, double(rows) * std::ldexp(1.0, -24) * abs_sum)
            << "rows " << rows << " in " << in << " out " << out << " at (" << i << ", " << o
            << ")";
      }
    for (std::int64_t o = 0; o < out; ++o) {
      float s = 0;
      for (std::int64_t r = 0; r < rows; ++r) s += to_float(dy[r * out + o]);
      ASSERT_EQ(std::bit_cast<std::uint32_t>(db[o]), std::bit_cast<std::uint32_t>(s))
          << "bias " << o << " rows " << rows;
    }
  }
}

TEST(Version, ReportsTheDispatchedIsaAndBf16Support) {
  const std::string isa = onednn_isa();
  std::printf("oneDNN %s, ISA %s, cpu_has_bf16 %d\n", onednn_version().c_str(), isa.c_str(),
              int(cpu_has_bf16()));
  EXPECT_FALSE(isa.empty());
  EXPECT_EQ(isa.find("unknown"), std::string::npos);
  // oneDNN dispatches bf16 kernels exactly when the CPU has them (or AMX, which implies them).
  if (cpu_has_bf16())
    EXPECT_TRUE(isa == "avx512_core_bf16" || isa == "avx512_core_amx") << isa;
  else
    EXPECT_TRUE(isa != "avx512_core_bf16" && isa != "avx512_core_amx") << isa;
  // The probe: a bf16 primitive is created exactly on AVX-512 (oneDNN 2.6 has no bf16 kernels
  // below it), natively where the CPU has AVX512_BF16.
  const Bf16Support bf16 = bf16_support();
  const std::string name(name_of(kBf16SupportNames, bf16));
  std::printf("bf16 %s\n", name.c_str());
  const bool avx512 = isa.rfind("avx512_core", 0) == 0;
  EXPECT_EQ(bf16 != Bf16Support::kNone, avx512) << isa << ", bf16 " << name;
  if (bf16 != Bf16Support::kNone) {
    EXPECT_EQ(bf16 == Bf16Support::kNative, cpu_has_bf16()) << name;
  }
}

}  // namespace net_bf16_test
}  // namespace cohort::nn
