// Model spec parsing, layout and PyTorch-style initialisation; softmax cross-entropy.
#include "cohort/nn/model.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "cohort/core/error.hpp"
#include "cohort/core/rng.hpp"
#include "cohort/nn/loss.hpp"

namespace cohort::nn {
namespace model_test {

TEST(Model, DefaultMlpHasPyTorchsParameterCount) {
  Model m = Model::parse("mlp:784-512-256-10");
  EXPECT_EQ(m.layout().numel(), 535818u);  // as bench/peers/torch_peer.py's mlp
  ASSERT_EQ(m.layers().size(), 5u);
  EXPECT_EQ(m.layers()[1].kind, LayerSpec::Kind::kReLU);
  EXPECT_EQ(m.layers()[2].name, "fc2");
  EXPECT_EQ(m.layout().at("fc2.weight").shape, Shape({{512, 256}}));  // stored (IC, OC)
  EXPECT_EQ(m.input_features(), 784);
  EXPECT_EQ(m.num_classes(), 10);
}

TEST(Model, CnnPresetIsThePeersNetwork) {
  Model m = Model::parse("cnn");
  // bench/peers/torch_peer.py's CNN counts sum(p.numel()) = 317,066 in PyTorch itself (832 +
  // 51,264 + 262,400 + 2,570).
  EXPECT_EQ(m.layout().numel(), 317066u);
  EXPECT_EQ(m.layers().size(), 10u);
  EXPECT_EQ(m.layers()[2].out, (SampleShape{32, 12, 12}));
  EXPECT_EQ(m.layers()[5].out, (SampleShape{64, 4, 4}));
  EXPECT_EQ(m.layout().at("conv2.weight").shape, Shape({{64, 32, 5, 5}}));
  EXPECT_EQ(m.layout().at("fc1.weight").shape, Shape({{1024, 256}}));
  // Training FLOPs per sample: forward, backward-weights, backward-data except conv1's (the
  // input needs no gradient): 3 x 8.0046 M - 0.9216 M = 23.09 M, issue 5's 23.1 MFLOP.
  EXPECT_NEAR(m.forward_flops_per_sample() * 3 - 2.0 * 24 * 24 * 32 * 25, 23.1e6, 0.02e6);
  EXPECT_EQ(Model::parse(kCnnPreset).layout().numel(), 317066u);
}

TEST(Model, LayerListShapes) {
  Model m =
      Model::parse("conv(3,3,2,1)-relu-avgpool(2)-flatten-dropout(0.25)-linear(5)", {2, 11, 11});
  EXPECT_EQ(m.layers()[0].out, (SampleShape{3, 6, 6}));  // (11 + 2 - 3) / 2 + 1
  EXPECT_EQ(m.layers()[2].out, (SampleShape{3, 3, 3}));
  EXPECT_EQ(m.layers()[3].out, (SampleShape{27, 1, 1}));
  EXPECT_FLOAT_EQ(m.layers()[4].p, 0.25f);
  EXPECT_EQ(m.num_classes(), 5);
  EXPECT_TRUE(m.has_dropout());
}

// Sizes that would wrap around a 64-bit count are refused while parsing, naming the layer.
TEST(Model, OversizedSpecsAreRefusedBeforeAnythingIsSized) {
  auto message = [](const std::string& spec) {
    try {
      Model::parse(spec, {1, 28, 28});
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  std::string grow;  // 255 padded 1x1 convolutions: H and W grow by 128 each
  for (int i = 0; i < 255; ++i) grow += "conv(1,1,1,64)-";
  const std::string wraps = grow + "conv(16384,1,1,50)-flatten-linear(1048576)-linear(10)";
  EXPECT_NE(message(wraps).find("values per sample"), std::string::npos) << message(wraps);
  const std::string huge = "mlp:784-1048576-1048576-10";  // 1.1e12 parameters
  EXPECT_NE(message(huge).find("parameters up to fc2"), std::string::npos) << message(huge);
  EXPECT_EQ(message("mlp:784-512-256-10"), "accepted");
}

TEST(Model, BadSpecsAreRefusedNamingTheFlag) {
  for (const char* bad :
       {"", "mlp:", "mlp:784", "mlp:784--10", "mlp:784-x-10", "mlp:784-0-10", "mlp:-5-10",
        "cnn2:1-2", "mlp:784-10-", "mlp:99999999-10", "conv(32)-flatten-linear(10)",
        "conv(32,5)-linear(10)", "conv(32,5", "conv(32,40)-flatten-linear(10)", "pool(2)",
        "conv(8,3)-flatten-linear(10)-relu", "dropout(1.5)-flatten-linear(10)",
        "maxpool(30)-flatten-linear(10)", "conv(8,3)-relu(2)-flatten-linear(10)"}) {
    try {
      Model::parse(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("--model"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(std::string("'") + bad + "'"), std::string::npos);
    }
  }
}

TEST(Model, InitIsSeededAndWithinPyTorchsBounds) {
  Model m = Model::parse("mlp:784-512-256-10");
  std::vector<float> a(m.layout().total()), b(m.layout().total()), c(m.layout().total());
  m.init(a.data(), 1);
  m.init(b.data(), 1);
  m.init(c.data(), 2);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  for (const auto& l : m.layers()) {
    if (l.kind != LayerSpec::Kind::kLinear) continue;
    const float bound = 1.0f / std::sqrt(float(l.in.C));
    double sum_sq = 0;
    for (std::int64_t i = 0; i < l.in.C * l.out.C; ++i) {
      float w = a[l.weight + i];
      ASSERT_LE(std::abs(w), bound);
      sum_sq += double(w) * w;
    }
    // U(-b, b) has variance b^2 / 3.
    EXPECT_NEAR(sum_sq / double(l.in.C * l.out.C), bound * bound / 3.0, 0.05 * bound * bound / 3.0)
        << l.name;
  }
}

// Linear weights are stored (IC, OC); the canonical order is PyTorch's (OC, IC), and init draws
// in that order: element (o, i) is the (o * IC + i)-th draw of the tensor's stream.
TEST(Model, LinearWeightsAreStoredTransposedAndCanonicalIsPyTorchsOrder) {
  const Model m = Model::parse("mlp:6-4-3", {1, 2, 3});
  std::vector<float> stored(m.layout().total()), canonical(m.layout().total()),
      back(m.layout().total());
  m.init(stored.data(), 9);
  m.to_canonical(stored.data(), canonical.data());
  const auto& w = m.layout().at("fc1.weight");
  const float bound = 1.0f / std::sqrt(6.0f);
  Rng rng({9, 0x1417ull, 0});  // the init stream of tensor 0 (Model::init)
  for (std::size_t o = 0; o < 4; ++o)
    for (std::size_t i = 0; i < 6; ++i) {
      const float drawn = rng.uniform(-bound, bound);
      EXPECT_EQ(canonical[w.offset + o * 6 + i], drawn) << o << "," << i;
      EXPECT_EQ(stored[w.offset + i * 4 + o], drawn) << o << "," << i;
    }
  const auto& b = m.layout().at("fc1.bias");
  EXPECT_EQ(canonical[b.offset + 2], stored[b.offset + 2]);  // biases keep their order
  m.from_canonical(canonical.data(), back.data());
  EXPECT_EQ(back, stored);
}

// Model::init before bn, nobias convs and residual blocks existed (commit 5d66fe0), restated:
// every linear and conv layer draws its weight, then its bias, each from the stream of the next
// tensor index. The new layer kinds must not change a draw of the existing models.
std::vector<float> init_as_before(const Model& m, std::uint64_t seed) {
  std::vector<float> p(m.layout().total(), 0.0f);
  std::uint64_t tensor = 0;
  for (const auto& l : m.layers()) {
    if (l.kind != LayerSpec::Kind::kLinear && l.kind != LayerSpec::Kind::kConv) continue;
    const std::int64_t fan_in =
        l.kind == LayerSpec::Kind::kConv ? l.in.C * l.kernel * l.kernel : l.in.C;
    const float bound = 1.0f / std::sqrt(static_cast<float>(fan_in));
    const auto weights = static_cast<std::size_t>(l.out.C * fan_in);
    Rng w({seed, 0x1417ull, tensor++});
    for (std::size_t j = 0; j < weights; ++j) {
      // Linear weights stored (IC, OC): draw j is (o, i) in (OC, IC) order.
      const std::size_t at =
          l.kind == LayerSpec::Kind::kLinear
              ? (j % std::size_t(l.in.C)) * std::size_t(l.out.C) + j / std::size_t(l.in.C)
              : j;
      p[l.weight + at] = w.uniform(-bound, bound);
    }
    Rng b({seed, 0x1417ull, tensor++});
    for (std::int64_t j = 0; j < l.out.C; ++j) p[l.bias + j] = b.uniform(-bound, bound);
  }
  return p;
}

TEST(Model, ExistingModelsInitialiseAsBeforeBatchNorm) {
  for (const auto& [spec, shape] :
       {std::pair<std::string, SampleShape>{"mlp:784-512-256-10", {1, 28, 28}},
        {"cnn", {1, 28, 28}},
        {"conv(3,3,2,1)-relu-avgpool(2)-flatten-dropout(0.25)-linear(5)", {2, 11, 11}}}) {
    const Model m = Model::parse(spec, shape);
    std::vector<float> p(m.layout().total(), 5.0f);
    m.init(p.data(), 7);
    EXPECT_EQ(p, init_as_before(m, 7)) << spec;
  }
}

TEST(Model, Resnet20PresetIsThePeersNetwork) {
  const Model m = Model::parse("resnet20");
  EXPECT_EQ(m.layout().numel(), 272186u);  // sum(p.numel()) of bench/peers/torch_peer.py's ResNet20
  EXPECT_EQ(Model::parse(kResnet20Preset).layout().numel(), 272186u);
  EXPECT_EQ(m.spec(), "resnet20");
  ASSERT_EQ(m.layers().size(), 3u + 9u + 2u);  // conv-bn-relu, 9 blocks, gap, linear
  EXPECT_EQ(m.layers()[3].name, "res1");
  EXPECT_EQ(m.layers()[3].out, (SampleShape{16, 28, 28}));
  EXPECT_TRUE(m.layers()[3].shortcut.empty());  // identity: stride 1, 16 -> 16
  EXPECT_EQ(m.layers()[6].name, "res4");
  EXPECT_EQ(m.layers()[6].out, (SampleShape{32, 14, 14}));
  ASSERT_EQ(m.layers()[6].shortcut.size(), 2u);
  EXPECT_EQ(m.layers()[6].shortcut[0].name, "res4.short.conv");
  EXPECT_EQ(m.layers()[6].shortcut[0].kernel, 1);
  EXPECT_FALSE(m.layers()[6].shortcut[0].has_bias);
  EXPECT_EQ(m.layers()[9].out, (SampleShape{64, 7, 7}));
  EXPECT_EQ(m.layers()[12].name, "gap1");
  EXPECT_EQ(m.layers()[12].out, (SampleShape{64, 1, 1}));
  EXPECT_EQ(m.num_classes(), 10);
  EXPECT_TRUE(m.has_batchnorm());
  EXPECT_FALSE(Model::parse("cnn").has_batchnorm());

  // Parameters in PyTorch's state_dict order (stem, blocks, fc), under our names.
  std::vector<std::string> expect{"conv1.weight", "bn1.weight", "bn1.bias"};
  std::int64_t cin = 16;
  int block = 0;
  for (std::int64_t cout : {16, 32, 64})
    for (int i = 0; i < 3; ++i) {
      const std::string r = "res" + std::to_string(++block) + ".";
      for (const char* s :
           {"conv1.weight", "bn1.weight", "bn1.bias", "conv2.weight", "bn2.weight", "bn2.bias"})
        expect.push_back(r + s);
      if (cin != cout)
        for (const char* s : {"short.conv.weight", "short.bn.weight", "short.bn.bias"})
          expect.push_back(r + s);
      cin = cout;
    }
  expect.push_back("fc1.weight");
  expect.push_back("fc1.bias");
  std::vector<std::string> names;
  for (const auto& e : m.layout().entries()) names.push_back(e.name);
  EXPECT_EQ(names, expect);
  EXPECT_EQ(m.layout().at("res7.short.conv.weight").shape, Shape({{64, 32, 1, 1}}));
  EXPECT_EQ(m.layout().at("res5.conv1.weight").shape, Shape({{32, 32, 3, 3}}));
  EXPECT_EQ(m.layout().at("fc1.weight").shape, Shape({{64, 10}}));  // stored (IC, OC)

  // Running statistics: mean and variance of every bn layer, in the same order.
  const auto bns = m.batchnorm_layers();
  ASSERT_EQ(bns.size(), 1u + 9u * 2u + 2u);
  EXPECT_EQ(bns[1]->name, "res1.bn1");
  EXPECT_EQ(bns.back()->name, "res9.bn2");
  std::size_t channels = 0;
  std::vector<std::string> stats_expect;
  for (const LayerSpec* l : bns) {
    channels += static_cast<std::size_t>(l->in.C);
    stats_expect.push_back(l->name + ".running_mean");
    stats_expect.push_back(l->name + ".running_var");
    EXPECT_EQ(m.stats_layout().at(l->name + ".running_mean").offset, l->running_mean);
    EXPECT_EQ(m.stats_layout().at(l->name + ".running_var").offset, l->running_var);
  }
  EXPECT_EQ(channels, 784u);  // 16 + 6 x 16 + 7 x 32 + 7 x 64
  EXPECT_EQ(m.stats_layout().numel(), 2 * channels);
  std::vector<std::string> stats_names;
  for (const auto& e : m.stats_layout().entries()) stats_names.push_back(e.name);
  EXPECT_EQ(stats_names, stats_expect);

  // 2 x (sum over convs of OH OW OC IC K K + fc): the convs inside blocks count.
  EXPECT_DOUBLE_EQ(m.forward_flops_per_sample(), 62043904.0);
}

TEST(Model, BatchNormOnImagesIsPerChannelAndOnFlatInputsPerFeature) {
  const Model m =
      Model::parse("conv(4,3,1,1,nobias)-bn-relu-gap-bn-linear(3)-bn-linear(2)", {2, 5, 5});
  ASSERT_EQ(m.layers().size(), 8u);
  EXPECT_FALSE(m.layers()[0].has_bias);
  EXPECT_EQ(m.layers()[0].out, (SampleShape{4, 5, 5}));
  EXPECT_EQ(m.layers()[1].name, "bn1");
  EXPECT_EQ(m.layout().at("bn1.weight").shape, Shape({{4}}));
  EXPECT_EQ(m.layers()[4].name, "bn2");
  EXPECT_EQ(m.layers()[4].in, (SampleShape{4, 1, 1}));
  EXPECT_EQ(m.layout().at("bn3.bias").shape, Shape({{3}}));
  std::vector<std::string> names;
  for (const auto& e : m.layout().entries()) names.push_back(e.name);
  EXPECT_EQ(names, (std::vector<std::string>{"conv1.weight", "bn1.weight", "bn1.bias", "bn2.weight",
                                             "bn2.bias", "fc1.weight", "fc1.bias", "bn3.weight",
                                             "bn3.bias", "fc2.weight", "fc2.bias"}));
  EXPECT_EQ(m.stats_layout().numel(), 2u * (4 + 4 + 3));
  EXPECT_FALSE(m.has_dropout());
}

TEST(Model, NormAndBiasRangesAreTheBnTensorsAndEveryBias) {
  const Model m =
      Model::parse("conv(4,3)-bn-relu-conv(4,3,1,0,nobias)-flatten-linear(3)", {1, 6, 6});
  const auto& L = m.layout();
  using R = std::pair<std::size_t, std::size_t>;
  auto range = [&](const std::string& n) {
    const auto& e = L.at(n);
    return R{e.offset, e.offset + e.shape.numel()};
  };
  EXPECT_EQ(m.norm_and_bias_ranges(), (std::vector<R>{range("conv1.bias"), range("bn1.weight"),
                                                      range("bn1.bias"), range("fc1.bias")}));

  const Model r = Model::parse("resnet20");
  const auto ranges = r.norm_and_bias_ranges();
  EXPECT_EQ(ranges.size(), 21u * 2u + 1u);
  std::size_t covered = 0;
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    EXPECT_LT(ranges[i].first, ranges[i].second);
    if (i > 0) {
      EXPECT_LE(ranges[i - 1].second, ranges[i].first) << i;  // sorted, disjoint
    }
    covered += ranges[i].second - ranges[i].first;
  }
  EXPECT_EQ(covered, 2u * 784u + 10u);
  EXPECT_EQ(ranges.back(),
            (R{r.layout().at("fc1.bias").offset, r.layout().at("fc1.bias").offset + 10}));
  EXPECT_EQ(Model::parse("cnn").norm_and_bias_ranges().size(), 4u);
}

TEST(Model, InitSetsBatchNormToIdentityAndStatsToPyTorchs) {
  const Model m = Model::parse("resnet20");
  std::vector<float> p(m.layout().total(), 5.0f), stats(m.stats_layout().total(), 5.0f);
  m.init(p.data(), 3);
  m.init_stats(stats.data());
  for (const LayerSpec* l : m.batchnorm_layers())
    for (std::int64_t c = 0; c < l->in.C; ++c) {
      ASSERT_EQ(p[l->weight + c], 1.0f) << l->name;
      ASSERT_EQ(p[l->bias + c], 0.0f) << l->name;
      ASSERT_EQ(stats[l->running_mean + c], 0.0f) << l->name;
      ASSERT_EQ(stats[l->running_var + c], 1.0f) << l->name;
    }
  // Padding between tensors is zero in both arrays.
  double sum = 0;
  for (float v : stats) sum += v;
  EXPECT_EQ(sum, 784.0);
  // A nobias conv draws its weight from the stream of its layout index, within U(+-1/sqrt(fan_in))
  // (the stem's conv1.weight sits at offset 0, where a bias of 0 is no tensor).
  for (const auto& [name, fan_in] :
       {std::pair<std::string, float>{"conv1.weight", 9.0f}, {"res4.conv1.weight", 16.0f * 9.0f}}) {
    const auto& w = m.layout().at(name);
    std::uint64_t index = 0;
    while (m.layout().entries()[index].name != name) ++index;
    Rng rng({3, 0x1417ull, index});
    const float bound = 1.0f / std::sqrt(fan_in);
    for (std::size_t j = 0; j < w.shape.numel(); ++j)
      ASSERT_EQ(p[w.offset + j], rng.uniform(-bound, bound)) << name << " " << j;
  }
  // Canonical order transposes the fc only.
  std::vector<float> canonical(p.size()), back(p.size());
  m.to_canonical(p.data(), canonical.data());
  const auto& fc = m.layout().at("fc1.weight");            // stored (64, 10)
  EXPECT_EQ(canonical[fc.offset + 1], p[fc.offset + 10]);  // (o 0, i 1) <- (i 1, o 0)
  EXPECT_EQ(canonical[7], p[7]);                           // conv weights keep their order
  m.from_canonical(canonical.data(), back.data());
  EXPECT_EQ(back, p);
}

TEST(Model, BadBatchNormGapAndResidualSpecsAreRefusedNamingTheFlag) {
  for (const char* bad :
       {"bn(4)-flatten-linear(10)", "flatten-gap-linear(10)", "flatten-res(8)-linear(10)",
        "conv(8,3,1,1,bias)-flatten-linear(10)", "conv(8,3,1,1,nobias,1)-flatten-linear(10)",
        "res-gap-linear(10)", "res(8,2,1)-gap-linear(10)", "res(0)-gap-linear(10)",
        "res(8,0)-gap-linear(10)", "gap(2)-linear(10)", "res(8)-gap",
        "conv(8,3)-bn-relu-gap-res(8)-linear(10)"}) {
    try {
      Model::parse(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("--model"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(std::string("'") + bad + "'"), std::string::npos);
    }
  }
  try {
    Model::parse("flatten-gap-linear(10)");
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("gap1 needs an image input (C, H, W), found (784)"),
              std::string::npos)
        << e.what();
  }
  // Parameters inside residual blocks count against the bound.
  try {
    Model::parse("res(16384)-res(16384)-res(16384)-gap-linear(10)");
    ADD_FAILURE() << "accepted 3 x 2.4 G parameters";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("parameters up to res1.conv2"), std::string::npos)
        << e.what();
  }
}

TEST(Loss, MatchesFloat64AndIsStableForLargeLogits) {
  const std::int64_t N = 3, C = 4;
  std::vector<float> z{1, 2, 3, 4, 1000, -1000, 999, 0, -3, -3, -3, -3};
  std::vector<std::int32_t> y{3, 2, 0};
  std::vector<float> d(N * C);
  double loss = softmax_cross_entropy(z.data(), y.data(), N, C, d.data());
  double ref = 0;
  for (std::int64_t r = 0; r < N; ++r) {
    double mx = -1e300, s = 0;
    for (std::int64_t c = 0; c < C; ++c) mx = std::max(mx, double(z[r * C + c]));
    for (std::int64_t c = 0; c < C; ++c) s += std::exp(double(z[r * C + c]) - mx);
    ref += std::log(s) + mx - z[r * C + y[r]];
    for (std::int64_t c = 0; c < C; ++c) {
      double expect = std::exp(double(z[r * C + c]) - mx) / s - (c == y[r]);
      EXPECT_NEAR(d[r * C + c], expect, 1e-6) << r << "," << c;
    }
  }
  EXPECT_TRUE(std::isfinite(loss));
  EXPECT_NEAR(loss, ref, 1e-5);
  // Row 0 right; row 1 wrong; row 2 is a four-way tie, resolved to class 0, its label.
  EXPECT_EQ(count_correct(z.data(), y.data(), N, C), 2);
}

}  // namespace model_test
}  // namespace cohort::nn
