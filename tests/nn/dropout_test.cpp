// Dropout seen through nn::Net, with one set of weights and one batch throughout: each field of
// the stream key (seed, step, leaf) changes the mask, and so does the layer; one key gives the
// same bits on any Net (replica) and after other keys; about p of the activations are zeroed and
// the rest scaled by 1 / (1 - p); inference is the identity. The mask function's agreement with
// the float64 reference is net_test.cpp's; the trainer's keys are trainer_test.cpp's.
#include "cohort/nn/dropout.hpp"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include "cohort/core/rng.hpp"
#include "cohort/nn/net.hpp"
#include "nn_test_util.hpp"

namespace cohort::nn {
namespace dropout_test {

using testing::Inputs;
using testing::make_inputs;
using testing::same_bits;

constexpr std::uint64_t kSeed = 20261201;

std::string str(const StreamKey& k) {
  return "key (" + std::to_string(k.seed) + ", " + std::to_string(k.step) + ", " +
         std::to_string(k.leaf) + ")";
}

struct Case {
  const char* name;     // the test's parameter name
  const char* spec;     // a model with dropout
  const char* without;  // the same model without its dropout layers: the same parameter layout
  SampleShape input;
  std::int64_t N;
  bool blocked = true;  // Net's blocked_layouts
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.spec << " on " << c.input.str() << ", N " << c.N
      << (c.blocked ? ", blocked" : ", plain");
}

const Case kCases[] = {
    {"cnn",
     "conv(4,5)-relu-maxpool(2)-flatten-dropout(0.5)-linear(10)",
     "conv(4,5)-relu-maxpool(2)-flatten-linear(10)",
     {1, 28, 28},
     8},
    // An MLP as a layer list, on flat samples.
    {"mlp",
     "linear(64)-relu-dropout(0.5)-linear(10)",
     "linear(64)-relu-linear(10)",
     {784, 1, 1},
     8},
    // On a convolution's output: the mask is drawn in (N, C, H, W) order and reordered into the
    // layout oneDNN chose for the activation (blocked), or used as it is (plain).
    {"conv_output_blocked",
     "conv(8,3)-dropout(0.3)-relu-maxpool(2)-flatten-linear(10)",
     "conv(8,3)-relu-maxpool(2)-flatten-linear(10)",
     {1, 12, 12},
     4,
     true},
    {"conv_output_plain",
     "conv(8,3)-dropout(0.3)-relu-maxpool(2)-flatten-linear(10)",
     "conv(8,3)-relu-maxpool(2)-flatten-linear(10)",
     {1, 12, 12},
     4,
     false},
};

struct Result {
  double loss = 0;
  std::vector<float> grad;
};

Result train_step(Net& net, const Model& m, const Inputs& in, std::int64_t N,
                  const StreamKey& key) {
  Result r{0, std::vector<float>(m.layout().total())};
  r.loss =
      net.forward_backward(in.params.data(), in.x.data(), in.labels.data(), N, r.grad.data(), key);
  return r;
}

// The case's model, its twin without dropout, and one set of weights and inputs for both.
class DropoutNet : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    omp_set_num_threads(1);
    std::printf("seed %llu, model %s, N %lld, %s layouts\n", static_cast<unsigned long long>(kSeed),
                GetParam().spec, static_cast<long long>(N),
                GetParam().blocked ? "blocked" : "plain");
    ASSERT_TRUE(m.has_dropout());
    ASSERT_FALSE(plain.has_dropout());
    ASSERT_EQ(m.layout().total(), plain.layout().total());  // dropout has no parameters
  }
  Net net() const { return Net(m, GetParam().blocked); }
  Result train(Net& net, const StreamKey& k) const { return train_step(net, m, in, N, k); }

  const std::int64_t N = GetParam().N;
  const Model m = Model::parse(GetParam().spec, GetParam().input);
  const Model plain = Model::parse(GetParam().without, GetParam().input);
  const Inputs in = make_inputs(m, N, kSeed);
  const StreamKey key{kSeed, 3, 1};
};

// A mask that ignored a field of the key (or hashed step and leaf symmetrically) would leave the
// gradient as it was.
TEST_P(DropoutNet, EachFieldOfTheKeyChangesTheGradient) {
  Net n = net();
  const Result base = train(n, key);
  const StreamKey others[] = {{kSeed + 1, 3, 1}, {kSeed, 4, 1}, {kSeed, 3, 2}, {kSeed, 1, 3}};
  for (const StreamKey& k : others) {
    const Result r = train(n, k);
    EXPECT_FALSE(same_bits(r.grad, base.grad)) << str(k) << " gives " << str(key) << "'s gradient";
    EXPECT_NE(r.loss, base.loss) << str(k);
  }
}

// The same key on the same Net after other keys, and on a second Net (another replica) that first
// ran another batch size: the same loss and gradient, bit for bit.
TEST_P(DropoutNet, SameKeySameBitsOnAnyReplicaAndAfterOtherKeys) {
  Net a = net(), b = net();
  const Result first = train(a, key);
  train(a, {kSeed, 4, 1});
  train(a, {kSeed + 1, 3, 1});
  const Result again = train(a, key);
  EXPECT_EQ(again.loss, first.loss);
  EXPECT_TRUE(same_bits(again.grad, first.grad)) << "the same Net";

  std::vector<float> scratch(m.layout().total());
  b.forward_backward(in.params.data(), in.x.data(), in.labels.data(), N - 1, scratch.data(),
                     {kSeed, 9, 9});
  const Result replica = train(b, key);
  EXPECT_EQ(replica.loss, first.loss);
  EXPECT_TRUE(same_bits(replica.grad, first.grad)) << "another Net";
}

// Inference gives the logits of the model without dropout (same weights, same primitives), before
// and after training calls with several keys; training with dropout gives another loss.
TEST_P(DropoutNet, InferenceIsTheIdentity) {
  Net with = net(), without(plain, GetParam().blocked);
  const std::size_t count = static_cast<std::size_t>(N * m.num_classes());
  const float* p = without.forward(in.params.data(), in.x.data(), N);
  const std::vector<float> want(p, p + count);
  auto logits = [&] {
    const float* q = with.forward(in.params.data(), in.x.data(), N);
    return std::vector<float>(q, q + count);
  };
  EXPECT_TRUE(same_bits(logits(), want)) << "before training";
  const double with_dropout = train(with, key).loss;
  train(with, {kSeed, 4, 2});
  EXPECT_TRUE(same_bits(logits(), want)) << "after training with two keys";
  const double without_dropout = train_step(without, plain, in, N, key).loss;
  EXPECT_NE(with_dropout, without_dropout) << "dropout changed nothing in training";
}

INSTANTIATE_TEST_SUITE_P(Models, DropoutNet, ::testing::ValuesIn(kCases),
                         [](const auto& test) { return std::string(test.param.name); });

// The input rows (N, IC) of each linear layer as the Net keeps them for batch weight gradients,
// one vector per linear layer (empty for a first layer: its input is the caller's).
std::vector<std::vector<float>> linear_inputs(const Model& m, const Inputs& in, std::int64_t N,
                                              const StreamKey& key) {
  std::vector<std::vector<float>> xs, dys;
  std::vector<LinearRows> rows;
  for (const auto& l : m.layers()) {
    if (l.kind != LayerSpec::Kind::kLinear) continue;
    const bool first = &l == &m.layers().front();
    xs.emplace_back(first ? 0 : static_cast<std::size_t>(N * l.in.C));
    dys.emplace_back(static_cast<std::size_t>(N * l.out.C));
  }
  for (std::size_t k = 0; k < xs.size(); ++k)
    rows.push_back({xs[k].empty() ? nullptr : xs[k].data(), dys[k].data()});
  Net net(m);
  std::vector<float> grad(m.layout().total());
  net.forward_backward(in.params.data(), in.x.data(), in.labels.data(), N, grad.data(), key, rows);
  return xs;
}

// Within 5 standard deviations of p: `dropped` of `n` Bernoulli(p) draws.
void expect_fraction_near(std::size_t dropped, std::size_t n, float p, const std::string& what) {
  ASSERT_GT(n, 100u) << what;
  const double fraction = double(dropped) / double(n);
  std::printf("%s: %zu of %zu dropped (%.4f, p %.2f)\n", what.c_str(), dropped, n, fraction, p);
  EXPECT_NEAR(fraction, p, 5 * std::sqrt(p * (1 - p) / double(n))) << what;
}

// The dropout layer's output, seen as the next linear layer's input rows, against the same rows
// of the model without dropout: each is 0 (dropped) or the activation times 1 / (1 - p), exactly;
// about p of the non-zero activations are dropped. p = 0.2 tells p from 1 - p.
TEST(Dropout, ZeroesAboutPOfTheActivationsAndScalesTheRest) {
  omp_set_num_threads(1);
  struct {
    const char *spec, *without;
    SampleShape input;
    std::int64_t N;
    float p;
  } const cases[] = {
      {"linear(64)-relu-dropout(0.2)-linear(10)",
       "linear(64)-relu-linear(10)",
       {784, 1, 1},
       32,
       0.2f},
      {"conv(4,5)-relu-maxpool(2)-flatten-dropout(0.5)-linear(10)",
       "conv(4,5)-relu-maxpool(2)-flatten-linear(10)",
       {1, 28, 28},
       8,
       0.5f},
  };
  for (const auto& c : cases) {
    std::printf("seed %llu, model %s, N %lld\n", static_cast<unsigned long long>(kSeed), c.spec,
                static_cast<long long>(c.N));
    const Model m = Model::parse(c.spec, c.input), plain = Model::parse(c.without, c.input);
    const Inputs in = make_inputs(m, c.N, kSeed);
    const std::vector<float> got = linear_inputs(m, in, c.N, {kSeed, 2, 5}).back();
    const std::vector<float> h = linear_inputs(plain, in, c.N, {}).back();
    ASSERT_EQ(got.size(), h.size());
    const float keep = 1.0f / (1.0f - c.p);
    std::size_t dropped = 0, nonzero = 0;
    for (std::size_t i = 0; i < h.size(); ++i) {
      if (h[i] == 0.0f) {  // a ReLU's zero stays zero, dropped or not
        ASSERT_EQ(got[i], 0.0f) << c.spec << " element " << i;
        continue;
      }
      ++nonzero;
      if (got[i] == 0.0f)
        ++dropped;
      else
        ASSERT_EQ(got[i], h[i] * keep) << c.spec << " element " << i;
    }
    expect_fraction_near(dropped, nonzero, c.p, c.spec);
  }
}

// Two dropout layers of one width, no ReLU (so zeros come from masks only): the layer is part of
// the stream's name, and every row draws its own mask.
TEST(Dropout, EachLayerAndEachRowDrawsItsOwnMask) {
  omp_set_num_threads(1);
  const std::int64_t N = 4, C = 64;
  const Model m =
      Model::parse("linear(64)-dropout(0.5)-linear(64)-dropout(0.5)-linear(10)", {32, 1, 1});
  std::printf("seed %llu, model %s, N %lld\n", static_cast<unsigned long long>(kSeed),
              m.spec().c_str(), static_cast<long long>(N));
  const Inputs in = make_inputs(m, N, kSeed);
  const auto xs = linear_inputs(m, in, N, {kSeed, 1, 0});
  ASSERT_EQ(xs.size(), 3u);
  // zeros[layer][row]: which of the row's C activations were dropped
  std::vector<std::vector<std::vector<bool>>> zeros(2);
  for (std::size_t layer = 0; layer < 2; ++layer) {
    const std::vector<float>& x = xs[layer + 1];
    ASSERT_EQ(x.size(), static_cast<std::size_t>(N * C));
    std::size_t dropped = 0;
    for (std::int64_t r = 0; r < N; ++r) {
      zeros[layer].emplace_back();
      for (std::int64_t i = 0; i < C; ++i) {
        const bool zero = x[static_cast<std::size_t>(r * C + i)] == 0.0f;
        zeros[layer].back().push_back(zero);
        dropped += zero;
      }
    }
    expect_fraction_near(dropped, x.size(), 0.5f, "dropout layer " + std::to_string(layer + 1));
    for (std::int64_t r = 1; r < N; ++r)
      EXPECT_NE(zeros[layer][r], zeros[layer][0]) << "layer " << layer + 1 << " row " << r;
  }
  for (std::int64_t r = 0; r < N; ++r)
    EXPECT_NE(zeros[0][r], zeros[1][r]) << "row " << r << ": both layers drew one mask";
}

}  // namespace dropout_test
}  // namespace cohort::nn

namespace cohort::nn {
namespace dropout_test {
// The mask is the keyed stream's draws in order (Rng::next_unit, one per element), however the
// loop computes them: a mask of an odd length, against the stream drawn one by one.
TEST(DropoutMask, IsTheKeyedStreamsDrawsInOrder) {
  const StreamKey key{kSeed, 7, 3};
  for (const float p : {0.1f, 0.5f}) {
    std::vector<float> mask(100003);
    dropout_mask(key, 11, p, mask.size(), mask.data());
    Rng rng({key.seed, 0xd809ull, key.step, key.leaf, 11});
    const float keep = 1.0f / (1.0f - p);
    for (std::size_t i = 0; i < mask.size(); ++i)
      ASSERT_EQ(mask[i], rng.next_unit() < p ? 0.0f : keep) << "p " << p << " element " << i;
  }
}

// The causal form: each (T, T) matrix's entries up to the diagonal are the full mask's, the
// others untouched (T odd and past a vector's lanes, three matrices).
TEST(DropoutMask, CausalEntriesAreTheFullMasksAndNoOthersAreWritten) {
  const StreamKey key{kSeed, 5, 2};
  const std::size_t mats = 3, T = 37;
  std::vector<float> full(mats * T * T), causal(full.size(), -1.0f);
  dropout_mask(key, 4, 0.2f, full.size(), full.data());
  causal_dropout_mask(key, 4, 0.2f, mats, T, causal.data());
  for (std::size_t i = 0; i < full.size(); ++i) {
    const std::size_t row = i / T, j = i % T;
    ASSERT_EQ(causal[i], j <= row % T ? full[i] : -1.0f) << "row " << row << ", column " << j;
  }
}
}  // namespace dropout_test
}  // namespace cohort::nn
