// The GPT: GptModel's spec, parameter counts and names (nanoGPT's), refusals and initialisation;
// the float64 reference (tests/reference/gpt_reference.hpp) against finite differences; GptNet
// against the reference in f32 (loss and every parameter's gradient, with and without dropout,
// one head or several, a window of one token, windows long enough for attention's row blocks) and
// in bf16 (within bf16's rounding), inference against training's loss, plans reused with other
// arrays, and the weights' reordered copies redone after weights_changed only.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <numeric>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "cohort/core/error.hpp"
#include "cohort/core/rng.hpp"
#include "cohort/nn/gpt/gpt.hpp"
#include "cohort/nn/gpt/gpt_attention.hpp"
#include "cohort/nn/version.hpp"
#include "cohort/tensor/bf16.hpp"
#include "cohort/tensor/buffer.hpp"
#include "gpt_reference.hpp"

namespace cohort::nn {
namespace gpt_test {

constexpr std::uint64_t kSeed = 20261203;

TEST(GptModel, ParameterCountsAreNanoGptsWithThePositionTable) {
  EXPECT_EQ(GptModel::parse("gpt:4-4-128-64", 65).layout().numel(), 804'096u);
  EXPECT_EQ(GptModel::parse("gpt:6-6-384-256-0.2", 65).layout().numel(), 10'745'088u);
}

TEST(GptModel, NamesAndShapesAreNanoGpts) {
  const GptModel m = GptModel::parse("gpt:2-2-8-5", 7);
  std::vector<std::string> names;
  for (const auto& e : m.layout().entries()) names.push_back(e.name + " " + e.shape.str());
  const std::vector<std::string> want = {"transformer.wte.weight (7, 8)",
                                         "transformer.wpe.weight (5, 8)",
                                         "transformer.h.0.ln_1.weight (8)",
                                         "transformer.h.0.attn.c_attn.weight (24, 8)",
                                         "transformer.h.0.attn.c_proj.weight (8, 8)",
                                         "transformer.h.0.ln_2.weight (8)",
                                         "transformer.h.0.mlp.c_fc.weight (32, 8)",
                                         "transformer.h.0.mlp.c_proj.weight (8, 32)",
                                         "transformer.h.1.ln_1.weight (8)",
                                         "transformer.h.1.attn.c_attn.weight (24, 8)",
                                         "transformer.h.1.attn.c_proj.weight (8, 8)",
                                         "transformer.h.1.ln_2.weight (8)",
                                         "transformer.h.1.mlp.c_fc.weight (32, 8)",
                                         "transformer.h.1.mlp.c_proj.weight (8, 32)",
                                         "transformer.ln_f.weight (8)"};
  EXPECT_EQ(names, want);
  EXPECT_EQ(m.shape().dropout, 0.0f);
  EXPECT_EQ(GptModel::parse("gpt:2-2-8-5-0.25", 7).shape().dropout, 0.25f);
  const auto ranges = m.norm_ranges();
  ASSERT_EQ(ranges.size(), 5u);
  EXPECT_EQ(ranges.front().first, m.block(0).ln_1);
  EXPECT_EQ(ranges.back().first, m.ln_f());
}

// GPT-2's architecture: each module's bias after its weight (nanoGPT's bias=True order), the
// token embedding padded to the multiple, the presets' counts those of llm.c's padded GPT-2
// (124,475,904) and of GPT-2 medium (354,823,168 with 50,257 rows; 48,128 more with 50,304).
TEST(GptModel, Gpt2sArchitectureIsBiasesTanhAndAPaddedVocabulary) {
  const GptModel m = GptModel::parse("gpt:1-2-8-5,bias,gelu=tanh,pad=4", 7);
  EXPECT_TRUE(m.shape().bias);
  EXPECT_TRUE(m.shape().tanh_gelu);
  EXPECT_EQ(m.shape().padded_vocab(), 8);
  std::vector<std::string> names;
  for (const auto& e : m.layout().entries()) names.push_back(e.name + " " + e.shape.str());
  const std::vector<std::string> want = {"transformer.wte.weight (8, 8)",
                                         "transformer.wpe.weight (5, 8)",
                                         "transformer.h.0.ln_1.weight (8)",
                                         "transformer.h.0.ln_1.bias (8)",
                                         "transformer.h.0.attn.c_attn.weight (24, 8)",
                                         "transformer.h.0.attn.c_attn.bias (24)",
                                         "transformer.h.0.attn.c_proj.weight (8, 8)",
                                         "transformer.h.0.attn.c_proj.bias (8)",
                                         "transformer.h.0.ln_2.weight (8)",
                                         "transformer.h.0.ln_2.bias (8)",
                                         "transformer.h.0.mlp.c_fc.weight (32, 8)",
                                         "transformer.h.0.mlp.c_fc.bias (32)",
                                         "transformer.h.0.mlp.c_proj.weight (8, 32)",
                                         "transformer.h.0.mlp.c_proj.bias (8)",
                                         "transformer.ln_f.weight (8)",
                                         "transformer.ln_f.bias (8)"};
  EXPECT_EQ(names, want);
  EXPECT_EQ(m.layout().at("transformer.h.0.mlp.c_fc.bias").offset, m.block(0).c_fc_bias);
  EXPECT_EQ(m.layout().at("transformer.ln_f.bias").offset, m.ln_f_bias());
  EXPECT_EQ(m.norm_ranges().size(), 10u);  // every 1-D tensor: LayerNorm weights and biases
  // A later option replaces an earlier one; without options, none of them.
  const GptShape plain = GptModel::parse("gpt:1-2-8-5,gelu=tanh,gelu=erf,pad=4,pad=1", 7).shape();
  EXPECT_FALSE(plain.tanh_gelu);
  EXPECT_EQ(plain.padded_vocab(), 7);
  EXPECT_EQ(GptModel::parse("gpt:1-2-8-5", 7).block(0).c_fc_bias, GptModel::kNoBias);

  const GptModel small = GptModel::parse("gpt:124M", 50257);
  EXPECT_EQ(small.shape(),
            GptModel::parse("gpt:12-12-768-1024,bias,gelu=tanh,pad=128", 50257).shape());
  EXPECT_EQ(small.shape().padded_vocab(), 50304);
  EXPECT_EQ(small.layout().numel(), 124'475'904u);
  EXPECT_EQ(GptModel::parse("gpt:350M", 50257).layout().numel(), 354'823'168u + 47u * 1024u);
  EXPECT_EQ(GptModel::parse("gpt:124M-0.1,pad=64", 50257).shape().dropout, 0.1f);
  EXPECT_EQ(GptModel::parse("gpt:124M-0.1,pad=64", 50257).shape().padded_vocab(), 50304);

  // Init: biases 0, the padded rows 0, the rest as without them.
  AlignedBuffer<float> p(m.layout().total());
  m.init(p.data(), kSeed);
  for (const auto& e : m.layout().entries()) {
    if (!e.name.ends_with(".bias")) continue;
    for (std::size_t i = 0; i < e.shape.numel(); ++i) EXPECT_EQ(p[e.offset + i], 0.0f) << e.name;
  }
  for (std::size_t i = 7 * 8; i < 8 * 8; ++i) EXPECT_EQ(p[m.wte() + i], 0.0f) << "padded row";
  EXPECT_NE(p[m.wte() + 6 * 8], 0.0f);
}

struct BadSpec {
  const char* name;
  const char* spec;
  std::int64_t vocab;
  const char* says;
};

class GptBadSpec : public ::testing::TestWithParam<BadSpec> {};

TEST_P(GptBadSpec, IsRefusedNamingTheField) {
  const BadSpec& c = GetParam();
  try {
    GptModel::parse(c.spec, c.vocab);
    FAIL() << c.spec << " was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(c.says), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--model"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Specs, GptBadSpec,
    ::testing::Values(BadSpec{"ThreeSizes", "gpt:4-4-128", 65, "found 3 sizes"},
                      BadSpec{"UnknownOption", "gpt:4-4-128-64,bais", 65, "found 'bais'"},
                      BadSpec{"PadZero", "gpt:4-4-128-64,pad=0", 65, "pad: expected"},
                      BadSpec{"UnknownPreset", "gpt:125M", 65, "found 1 sizes"},
                      BadSpec{"PresetWithSizes", "gpt:124M-12-768", 65, "found 6 sizes"},
                      BadSpec{"ZeroLayers", "gpt:0-4-128-64", 65, "LAYERS"},
                      BadSpec{"HeadsNotADivisor", "gpt:4-3-128-64", 65, "HEADS"},
                      BadSpec{"NotANumber", "gpt:4-4-x-64", 65, "EMBD"},
                      BadSpec{"DropoutOne", "gpt:4-4-128-64-1", 65, "DROPOUT"},
                      BadSpec{"NoVocabulary", "gpt:4-4-128-64", 0, "vocabulary"},
                      BadSpec{"TooLarge", "gpt:64-16-16384-1024", 65, "parameters"}),
    [](const auto& p) { return std::string(p.param.name); });

TEST(GptModel, InitIsGpt2sAndKeyedBySeed) {
  const GptModel m = GptModel::parse("gpt:4-4-128-64", 65);
  AlignedBuffer<float> a(m.layout().total()), b(m.layout().total());
  m.init(a.data(), kSeed);
  m.init(b.data(), kSeed);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  auto stddev = [&](const std::string& name) {
    const auto& e = m.layout().at(name);
    double sum = 0, sq = 0;
    const std::size_t n = e.shape.numel();
    for (std::size_t i = 0; i < n; ++i) {
      sum += a[e.offset + i];
      sq += double(a[e.offset + i]) * a[e.offset + i];
    }
    EXPECT_NEAR(sum / double(n), 0.0, 0.002) << name;
    return std::sqrt(sq / double(n) - (sum / double(n)) * (sum / double(n)));
  };
  EXPECT_NEAR(stddev("transformer.h.0.attn.c_attn.weight"), 0.02, 0.0005);
  EXPECT_NEAR(stddev("transformer.wte.weight"), 0.02, 0.001);
  EXPECT_NEAR(stddev("transformer.h.3.mlp.c_proj.weight"), 0.02 / std::sqrt(8.0), 0.0003);
  EXPECT_NEAR(stddev("transformer.h.1.attn.c_proj.weight"), 0.02 / std::sqrt(8.0), 0.0003);
  const auto& ln = m.layout().at("transformer.h.2.ln_2.weight");
  for (std::size_t i = 0; i < 128; ++i) EXPECT_EQ(a[ln.offset + i], 1.0f);
  m.init(b.data(), kSeed + 1);
  EXPECT_NE(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

// A case of the numeric tests: a spec, its vocabulary and the windows per call.
struct Case {
  const char* name;
  const char* spec;
  std::int64_t vocab, N;
};

std::vector<std::int32_t> windows_for(const GptModel& m, std::int64_t N, std::uint64_t seed) {
  Rng rng({seed, 7});
  std::vector<std::int32_t> w(static_cast<std::size_t>(N * (m.shape().block + 1)));
  for (auto& t : w)
    t = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(m.shape().vocab)));
  return w;
}

// Parameters larger than GPT-2's initial ones (N(0, 0.02) would leave the attention uniform
// and the gradients tiny): vectors (norms' weights and biases) in [0.5, 1.5); matrices in
// [-0.5, 0.5) (N(0, 0.3)-ish) scaled by sqrt(8 / C), so that the scores and logits, sums over C
// and over the head size, keep the spread of the 8-wide cases at every width. Unscaled, wide
// rows give softmax rows so saturated that bf16's rounding of q and k (2^-9 of each) moves their
// gradients past the bound below: the conditioning of the input, not the net's error.
std::vector<double> params_for(const GptModel& m, std::uint64_t seed) {
  std::vector<double> p(m.layout().total(), 0.0);
  Rng rng({seed, 11});
  const double spread = std::sqrt(8.0 / static_cast<double>(m.shape().embd));
  for (const auto& e : m.layout().entries())
    for (std::size_t i = 0; i < e.shape.numel(); ++i)
      p[e.offset + i] =
          e.shape.dims.size() == 1 ? rng.uniform(0.5f, 1.5f) : spread * rng.uniform(-0.5f, 0.5f);
  return p;
}

class GptNumeric : public ::testing::TestWithParam<Case> {};

const nn::StreamKey kKey{kSeed, 3, 1};

TEST_P(GptNumeric, ReferenceMatchesFiniteDifferences) {
  const Case& c = GetParam();
  const GptModel m = GptModel::parse(c.spec, c.vocab);
  const auto w = windows_for(m, c.N, kSeed);
  std::vector<double> p = params_for(m, kSeed);
  const reference::GptResult r = reference::gpt_forward_backward(m, p, w.data(), c.N, kKey);
  const double h = 1e-6;
  double worst = 0;
  for (const auto& e : m.layout().entries())
    for (std::size_t i = 0; i < e.shape.numel(); ++i) {
      const std::size_t j = e.offset + i;
      const double keep = p[j];
      p[j] = keep + h;
      const double up = reference::gpt_forward_backward(m, p, w.data(), c.N, kKey, true).loss;
      p[j] = keep - h;
      const double down = reference::gpt_forward_backward(m, p, w.data(), c.N, kKey, true).loss;
      p[j] = keep;
      const double fd = (up - down) / (2 * h);
      const double err = std::abs(fd - r.grad[j]) / std::max(1.0, std::abs(fd));
      worst = std::max(worst, err);
      ASSERT_LT(err, 1e-6) << e.name << "[" << i << "]: finite difference " << fd << ", reference "
                           << r.grad[j];
    }
  std::cout << "  worst relative error " << worst << "\n";
}

// Max |a - b| over max |b|, over the parameters' elements.
double relative_error(const std::vector<double>& want, const float* got, const GptModel& m) {
  double num = 0, den = 0;
  for (const auto& e : m.layout().entries())
    for (std::size_t i = 0; i < e.shape.numel(); ++i) {
      num = std::max(num, std::abs(double(got[e.offset + i]) - want[e.offset + i]));
      den = std::max(den, std::abs(want[e.offset + i]));
    }
  return num / den;
}

// GptNet in f32 against the reference: the loss, every gradient, inference's loss.
void check_f32_net(const Case& c, GptPaths paths = {}) {
  const GptModel m = GptModel::parse(c.spec, c.vocab);
  const auto w = windows_for(m, c.N, kSeed);
  const std::vector<double> p = params_for(m, kSeed);
  AlignedBuffer<float> pf(p.size()), grad(p.size());
  for (std::size_t i = 0; i < p.size(); ++i) pf[i] = static_cast<float>(p[i]);
  std::vector<double> pr(pf.data(), pf.data() + pf.size());  // the f32 values, exactly
  const reference::GptResult r = reference::gpt_forward_backward(m, pr, w.data(), c.N, kKey);
  GptNet net(m, Precision::kF32, paths);
  const double loss = net.forward_backward(pf.data(), w.data(), c.N, grad.data(), kKey);
  EXPECT_NEAR(loss, r.loss, 1e-5 * std::abs(r.loss)) << "seed " << kSeed;
  EXPECT_LT(relative_error(r.grad, grad.data(), m), 2e-5) << "seed " << kSeed;
  // Inference: the loss without dropout, as the reference's.
  const double plain = reference::gpt_forward_backward(m, pr, w.data(), c.N, kKey, false).loss;
  EXPECT_NEAR(net.evaluate(pf.data(), w.data(), c.N).loss, plain, 1e-5 * std::abs(plain));
}

// GptNet in bf16 against the reference given the bf16 weights, within bf16's rounding; the
// calling test is skipped where oneDNN has no bf16 kernels.
void check_bf16_net(const Case& c, GptPaths paths = {}) {
  if (bf16_support() == Bf16Support::kNone)
    GTEST_SKIP() << "oneDNN has no bf16 kernels here (" << onednn_isa() << ")";
  const GptModel m = GptModel::parse(c.spec, c.vocab);
  const auto w = windows_for(m, c.N, kSeed);
  const std::vector<double> p = params_for(m, kSeed);
  std::vector<bf16> pb(p.size());
  std::vector<double> pr(p.size());
  for (std::size_t i = 0; i < p.size(); ++i) {
    pb[i] = to_bf16(static_cast<float>(p[i]));
    pr[i] = to_float(pb[i]);  // the reference gets the bf16 weights: only activations round
  }
  AlignedBuffer<float> grad(p.size());
  const reference::GptResult r = reference::gpt_forward_backward(m, pr, w.data(), c.N, kKey);
  GptNet net(m, Precision::kBf16, paths);
  const double loss = net.forward_backward(pb.data(), w.data(), c.N, grad.data(), kKey);
  // bf16 keeps 8 bits of mantissa: each rounding is within 2^-9 relative; the loss within 1% and
  // the gradient (through a dozen roundings in sequence) within 3% of its largest element (a
  // wrong scale or mask gives several times that).
  const double err = relative_error(r.grad, grad.data(), m);
  std::cout << "  loss " << loss << " (reference " << r.loss << "), gradient error " << err << "\n";
  EXPECT_NEAR(loss, r.loss, 0.01 * std::abs(r.loss)) << "seed " << kSeed;
  EXPECT_LT(err, 0.03) << "seed " << kSeed;
  // Inference (its own plan: the GELU without its slope, buffers shared across layers).
  const double plain = reference::gpt_forward_backward(m, pr, w.data(), c.N, kKey, false).loss;
  EXPECT_NEAR(net.evaluate(pb.data(), w.data(), c.N).loss, plain, 0.01 * std::abs(plain));
}

TEST_P(GptNumeric, F32NetMatchesTheReference) { check_f32_net(GetParam()); }

TEST_P(GptNumeric, Bf16NetMatchesTheReferenceWithinBf16) { check_bf16_net(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Shapes, GptNumeric,
                         ::testing::Values(Case{"TwoLayersTwoHeads", "gpt:2-2-8-5", 7, 2},
                                           Case{"OneHead", "gpt:1-1-8-4", 5, 3},
                                           Case{"FourHeadsOneWindow", "gpt:1-4-8-6", 9, 1},
                                           Case{"Dropout", "gpt:2-2-8-5-0.3", 7, 2},
                                           Case{"WindowOfOne", "gpt:1-2-4-1", 3, 4},
                                           Case{"Gpt2Architecture",
                                                "gpt:2-2-8-5,bias,gelu=tanh,pad=4", 7, 2},
                                           Case{"BiasesDropout", "gpt:1-2-8-4-0.3,bias", 5, 2},
                                           Case{"TanhGelu", "gpt:1-1-8-4,gelu=tanh", 5, 3},
                                           Case{"PaddedVocabulary", "gpt:1-2-8-5,pad=16", 7, 2}),
                         [](const auto& p) { return std::string(p.param.name); });

// Windows long enough that attention runs by row blocks (GptPlanBuilder::row_blocks): the Net
// against the reference (which the short windows above check against finite differences).
class GptRowBlocks : public ::testing::TestWithParam<Case> {};

TEST_P(GptRowBlocks, F32NetMatchesTheReference) { check_f32_net(GetParam()); }

TEST_P(GptRowBlocks, Bf16NetMatchesTheReferenceWithinBf16) { check_bf16_net(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Windows, GptRowBlocks,
                         ::testing::Values(Case{"TwoBlocks", "gpt:1-2-8-131", 7, 2},  // 66, 65 rows
                                           Case{"FourBlocksDropout", "gpt:2-2-8-259-0.3", 7,
                                                2}),  // 65, 65, 65, 64 rows
                         [](const auto& p) { return std::string(p.param.name); });

// Embeddings wide enough that rows of 4 KB (multiples of 1,024 floats) meet the f32 weight
// gradients on dnnl_sgemm (GptPlanBuilder::wide_rows): the MLP's 4 C columns with C = 256
// (W^T = X^T dY for c_fc, W = dY^T X for its c_proj, both on skewed buffers), and with C = 1024
// every block layer and the head (W = dY^T X; the head's X not skewed).
class GptWideRows : public ::testing::TestWithParam<Case> {};

TEST_P(GptWideRows, F32NetMatchesTheReference) { check_f32_net(GetParam()); }

TEST_P(GptWideRows, Bf16NetMatchesTheReferenceWithinBf16) { check_bf16_net(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Embeddings, GptWideRows,
                         ::testing::Values(Case{"Mlp1024", "gpt:1-2-256-5", 7, 2},
                                           Case{"Mlp1024Dropout", "gpt:2-2-256-4-0.3", 7, 2},
                                           Case{"Embd1024", "gpt:1-1-1024-2", 5, 3},
                                           Case{"Mlp1024Gpt2",
                                                "gpt:1-2-256-5,bias,gelu=tanh,pad=64", 7, 2}),
                         [](const auto& p) { return std::string(p.param.name); });

// A leaf of 768 rows puts weight gradients on both sides of the small-GEMM bound
// (GptPlanBuilder::small_weight_grad, 2^25 multiply-adds) where oneDNN's inner product is
// gemm-based (f32 on AVX2 CPUs): c_attn (768 x 128 x 384) and the MLP's two (768 x 128 x 512) on
// oneDNN, the attention's c_proj (768 x 128 x 128) and the head on OpenBLAS. The shapes above
// are all below the bound. In bf16 on AMX CPUs these rows are enough for the weight gradients'
// matmuls to run AMX's kernel (GptPlanBuilder::linear_backward); the short windows above (4 to
// 12 rows a leaf) keep the inner product's.
class GptWeightGradPaths : public ::testing::TestWithParam<Case> {};

TEST_P(GptWeightGradPaths, F32NetMatchesTheReference) { check_f32_net(GetParam()); }

TEST_P(GptWeightGradPaths, Bf16NetMatchesTheReferenceWithinBf16) { check_bf16_net(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Leaves, GptWeightGradPaths,
                         ::testing::Values(Case{"BothSidesOfTheBound", "gpt:1-2-128-64", 7, 12}),
                         [](const auto& p) { return std::string(p.param.name); });

// Each way the plans can compute attention and a bf16 linear layer's backward (GptPaths), forced,
// so that every CPU runs all of them (kAuto takes one by what oneDNN dispatches): windows of one
// row block and of four with dropout, and leaves of 768 rows. f32 plans choose their linear
// layers' backward themselves: attention's two ways only.
const auto kPathCases = ::testing::Values(
    Case{"Dropout", "gpt:2-2-8-5-0.3", 7, 2}, Case{"FourBlocksDropout", "gpt:2-2-8-259-0.3", 7, 2},
    Case{"Rows768", "gpt:1-2-128-64", 7, 12}, Case{"Heads32Dropout", "gpt:2-2-64-32-0.3", 7, 3},
    Case{"Rows768Gpt2", "gpt:1-2-128-64,bias,gelu=tanh,pad=64", 7, 12});
const auto kAttentionPaths =
    ::testing::Values(GptPaths::Attention::kDense, GptPaths::Attention::kRowBlocks);
// bf16 plans also have cohort's kernel, on its preferred engine and on AVX-512's, where heads
// and windows are multiples of 32 (Rows768, Heads32Dropout; elsewhere, and where the CPU has no
// engine, kKernel and kKernelAvx512Bf16 take kAuto's other way).
const auto kBf16AttentionPaths =
    ::testing::Values(GptPaths::Attention::kDense, GptPaths::Attention::kRowBlocks,
                      GptPaths::Attention::kKernel, GptPaths::Attention::kKernelAvx512Bf16);

std::string attention_name(GptPaths::Attention a) {
  switch (a) {
    case GptPaths::Attention::kDense:
      return "_Dense";
    case GptPaths::Attention::kKernel:
      return "_Kernel";
    case GptPaths::Attention::kKernelAvx512Bf16:
      return "_KernelAvx512Bf16";
    default:
      return "_RowBlocks";
  }
}

class GptForcedAttention : public ::testing::TestWithParam<std::tuple<Case, GptPaths::Attention>> {
};

TEST_P(GptForcedAttention, F32NetMatchesTheReference) {
  check_f32_net(std::get<0>(GetParam()), GptPaths{std::get<1>(GetParam())});
}

INSTANTIATE_TEST_SUITE_P(Paths, GptForcedAttention, ::testing::Combine(kPathCases, kAttentionPaths),
                         [](const auto& p) {
                           return std::string(std::get<0>(p.param).name) +
                                  attention_name(std::get<1>(p.param));
                         });

class GptForcedPaths : public ::testing::TestWithParam<
                           std::tuple<Case, GptPaths::Attention, GptPaths::Bf16LinearBackward>> {};

TEST_P(GptForcedPaths, Bf16NetMatchesTheReferenceWithinBf16) {
  const auto& [c, attention, linear_backward] = GetParam();
  check_bf16_net(c, GptPaths{attention, linear_backward});
}

INSTANTIATE_TEST_SUITE_P(
    Paths, GptForcedPaths,
    ::testing::Combine(kPathCases, kBf16AttentionPaths,
                       ::testing::Values(GptPaths::Bf16LinearBackward::kMatmul,
                                         GptPaths::Bf16LinearBackward::kInnerProduct)),
    [](const auto& p) {
      const bool matmul = std::get<2>(p.param) == GptPaths::Bf16LinearBackward::kMatmul;
      return std::string(std::get<0>(p.param).name) + attention_name(std::get<1>(p.param)) +
             (matmul ? "_MatmulBackward" : "_InnerProductBackward");
    });

// Where a bf16 plan's attention runs: cohort's kernel is timed as attention (its products and
// softmax in one pass, PhaseTimes::attention); on oneDNN's matmuls the products are matmul and the
// softmax eltwise, and nothing is attention. Heads of 32 and windows of 32, which the kernel takes
// where the CPU has an engine for it.
TEST(GptTimes, AttentionOnCohortsKernelIsTimedAsAttentionElseAsMatmulAndSoftmax) {
  if (bf16_support() == Bf16Support::kNone)
    GTEST_SKIP() << "oneDNN has no bf16 kernels here (" << onednn_isa() << ")";
  const GptModel m = GptModel::parse("gpt:1-2-64-32", 7);
  const auto w = windows_for(m, 2, kSeed);
  const std::vector<double> p = params_for(m, kSeed);
  std::vector<bf16> pb(p.size());
  for (std::size_t i = 0; i < p.size(); ++i) pb[i] = to_bf16(static_cast<float>(p[i]));
  AlignedBuffer<float> grad(p.size());
  const bool kernel = gpt_attention_kernel(m, Precision::kBf16).has_value();
  for (const GptPaths::Attention a :
       {GptPaths::Attention::kKernel, GptPaths::Attention::kRowBlocks}) {
    GptNet net(m, Precision::kBf16, GptPaths{a});
    net.forward_backward(pb.data(), w.data(), 2, grad.data(), kKey);
    const PhaseTimes& t = net.times();
    const bool on_kernel = a == GptPaths::Attention::kKernel && kernel;
    std::cout << "  " << (on_kernel ? "kernel" : "row blocks") << ": attention " << t.attention
              << " s, eltwise " << t.eltwise << " s, matmul " << t.matmul << " s\n";
    if (on_kernel) {
      EXPECT_GT(t.attention, 0);
    } else {
      EXPECT_EQ(t.attention, 0);
      EXPECT_GT(t.eltwise, 0);  // the softmax and the GELU
    }
    EXPECT_GT(t.matmul, 0);
    EXPECT_DOUBLE_EQ(t.total(), t.matmul + t.attention + t.eltwise + t.loss + t.other);
  }
}

// The head in chunks of rows (GptPaths::head_rows; the plans' own choice splits a vocabulary
// past 16 MB of logits, GPT-2's at 83 positions): a chunk's logits, loss and head backward in
// turn, the token embedding's gradient summed over the chunks. Chunks of 3 positions of 10
// (3, 3, 3, 1), with dropout, and of 100 of a leaf of 768 (the last of 68).
struct ChunkCase {
  Case c;
  std::int64_t rows;
};

class GptHeadChunks : public ::testing::TestWithParam<ChunkCase> {};

TEST_P(GptHeadChunks, F32NetMatchesTheReference) {
  GptPaths paths;
  paths.head_rows = GetParam().rows;
  check_f32_net(GetParam().c, paths);
}

TEST_P(GptHeadChunks, Bf16NetMatchesTheReferenceWithinBf16) {
  GptPaths paths;
  paths.head_rows = GetParam().rows;
  check_bf16_net(GetParam().c, paths);
}

INSTANTIATE_TEST_SUITE_P(
    Rows, GptHeadChunks,
    ::testing::Values(ChunkCase{{"Gpt2Architecture", "gpt:2-2-8-5,bias,gelu=tanh,pad=4", 7, 2}, 3},
                      ChunkCase{{"Dropout", "gpt:2-2-8-5-0.3", 7, 2}, 3},
                      ChunkCase{{"Rows768Gpt2", "gpt:1-2-128-64,bias,gelu=tanh,pad=64", 7, 12},
                                100}),
    [](const auto& p) { return std::string(p.param.c.name); });

// The generator's logits after each token are the full forward pass's at that position: while
// the window fills, and after it restarts from the last block / 2 tokens.
class GptGeneratorLogits : public ::testing::TestWithParam<const char*> {};

TEST_P(GptGeneratorLogits, AreTheForwardPasssAtEachPosition) {
  const GptModel m = GptModel::parse(GetParam(), 7);
  const std::vector<double> p = params_for(m, kSeed);
  std::vector<float> pf(p.begin(), p.end());
  const std::vector<double> pr(pf.begin(), pf.end());
  const std::int64_t T = 6, V = 7;
  const auto w = windows_for(m, 2, kSeed);  // 14 tokens: the pushes
  GptGenerator gen(m, pf.data());
  // The context after push i (0-based), as the generator holds it.
  std::vector<std::int32_t> context;
  for (std::size_t i = 0; i < 10; ++i) {
    if (static_cast<std::int64_t>(context.size()) == T)
      context.erase(context.begin(), context.end() - T / 2);
    context.push_back(w[i]);
    const float* got = gen.push(w[i]);
    std::vector<std::int32_t> window(context);
    window.resize(static_cast<std::size_t>(T + 1), 0);  // positions after the last do not matter
    const auto r = reference::gpt_forward_backward(m, pr, window.data(), 1, {}, false);
    const std::size_t at = (context.size() - 1) * static_cast<std::size_t>(V);
    for (std::int64_t v = 0; v < V; ++v)
      EXPECT_NEAR(got[v], r.logits[at + static_cast<std::size_t>(v)], 1e-4)
          << "push " << i << ", token " << v;
  }
  EXPECT_EQ(gen.positions_run(), 10u + 6u);  // restarts at pushes 6 and 9 ran 3 kept tokens each
}

// nanoGPT's default architecture, and GPT-2's (biases, the tanh GELU, 7 tokens padded to 16).
INSTANTIATE_TEST_SUITE_P(Specs, GptGeneratorLogits,
                         ::testing::Values("gpt:2-2-8-6", "gpt:2-2-8-6,bias,gelu=tanh,pad=16"),
                         [](const auto& p) {
                           return std::string(p.index == 0 ? "NanoGpt" : "Gpt2Architecture");
                         });

// Nets sharing their weights' copies in oneDNN's layouts (the trainer's replicas): each gives
// what a net of its own gives, run in turn and on two threads at once, and after the weights
// change (each net told, as the trainer tells its replicas) both read the new weights; the
// copies are counted by the net that made them.
TEST(GptNet, SharedWeightCopiesGiveEachNetsOwnResults) {
  const GptModel m = GptModel::parse("gpt:2-2-64-32,bias,gelu=tanh,pad=16", 7);
  const auto w1 = windows_for(m, 3, kSeed), w2 = windows_for(m, 3, kSeed + 1);
  const std::vector<double> p = params_for(m, kSeed);
  for (const Precision precision : {Precision::kF32, Precision::kBf16}) {
    if (precision == Precision::kBf16 && bf16_support() == Bf16Support::kNone) continue;
    const bool half = precision == Precision::kBf16;
    AlignedBuffer<float> pf(p.size());
    std::vector<bf16> pb(p.size());
    auto set = [&](float delta) {
      for (std::size_t i = 0; i < p.size(); ++i) {
        pf[i] = static_cast<float>(p[i]) + delta;
        pb[i] = to_bf16(pf[i]);
      }
    };
    // The loss and gradient of `net` on `windows`.
    auto run = [&](GptNet& net, const std::vector<std::int32_t>& windows) {
      std::vector<float> grad(p.size());
      const double loss = half ? net.forward_backward(pb.data(), windows.data(), 3, grad.data())
                               : net.forward_backward(pf.data(), windows.data(), 3, grad.data());
      return std::make_pair(loss, grad);
    };
    for (const float delta : {0.0f, 0.01f}) {
      set(delta);
      GptNet alone1(m, precision), alone2(m, precision);
      const auto want1 = run(alone1, w1), want2 = run(alone2, w2);
      GptNet a(m, precision), b(m, precision);
      b.share_weight_copies(a);
      set(-0.02f);  // other weights first: the copies must follow the change below
      a.weights_changed();
      b.weights_changed();
      run(a, w1);
      set(delta);
      a.weights_changed();
      b.weights_changed();
      EXPECT_EQ(run(b, w2), want2) << "delta " << delta;
      EXPECT_EQ(run(a, w1), want1) << "delta " << delta;
      a.weights_changed();
      b.weights_changed();
      std::pair<double, std::vector<float>> got1, got2;
      std::thread t([&] { got1 = run(a, w1); });
      got2 = run(b, w2);
      t.join();
      EXPECT_EQ(got1, want1) << "delta " << delta << ", two threads";
      EXPECT_EQ(got2, want2) << "delta " << delta << ", two threads";
      EXPECT_EQ(b.memory().weight_copies, 0u);
      EXPECT_EQ(a.memory().weight_copies, alone1.memory().weight_copies);
    }
  }
}

TEST(GptNet, PlansFollowTheCallersArrays) {
  const GptModel m = GptModel::parse("gpt:2-2-8-5", 7);
  const auto w1 = windows_for(m, 2, kSeed), w2 = windows_for(m, 2, kSeed + 1);
  const std::vector<double> p = params_for(m, kSeed);
  AlignedBuffer<float> a(p.size()), b(p.size()), g1(p.size()), g2(p.size()), g3(p.size());
  for (std::size_t i = 0; i < p.size(); ++i) a[i] = b[i] = static_cast<float>(p[i]);
  b[m.wte()] += 0.5f;
  GptNet net(m), fresh(m);
  const double l1 = net.forward_backward(a.data(), w1.data(), 2, g1.data());
  const double l2 = net.forward_backward(b.data(), w2.data(), 2, g2.data());
  const double l3 = fresh.forward_backward(b.data(), w2.data(), 2, g3.data());
  EXPECT_NE(l1, l2);
  EXPECT_EQ(l2, l3);
  EXPECT_EQ(std::memcmp(g2.data(), g3.data(), g2.size() * sizeof(float)), 0);
}

// GptNet::weights_changed: until its first call every run reorders the weights into the
// primitives' layouts, so a run on changed values (same array) equals a fresh net's; after it,
// a plan reorders them once, on its next run (training and inference plans alike), and reuses
// that copy until the next call. In bf16 (LayerNorm's weight converted too, and the inner
// products' weights blocked wherever oneDNN has bf16 kernels), so the reuse shows.
TEST(GptNet, WeightsChangedReordersTheWeightsOnceAfterEachCall) {
  if (bf16_support() == Bf16Support::kNone)
    GTEST_SKIP() << "oneDNN has no bf16 kernels here (" << onednn_isa() << ")";
  const GptModel m = GptModel::parse("gpt:2-2-8-5", 7);
  const auto w = windows_for(m, 2, kSeed);
  const std::vector<double> p = params_for(m, kSeed);
  std::vector<bf16> params(p.size()), changed(p.size());
  for (std::size_t i = 0; i < p.size(); ++i) {
    params[i] = to_bf16(static_cast<float>(p[i]));
    changed[i] = to_bf16(1.25f * static_cast<float>(p[i]));
  }
  AlignedBuffer<float> g(p.size()), want(p.size());
  // A fresh net's results on the changed values.
  GptNet fresh(m, Precision::kBf16);
  const double want_loss = fresh.forward_backward(changed.data(), w.data(), 2, want.data());
  const double want_eval = fresh.evaluate(changed.data(), w.data(), 2).loss;
  auto same_as_fresh = [&](double loss) {
    return loss == want_loss && std::memcmp(g.data(), want.data(), g.size() * sizeof(float)) == 0;
  };
  std::vector<bf16> array = params;  // one array whose values the caller changes in place
  auto set = [&](const std::vector<bf16>& values) {
    std::copy(values.begin(), values.end(), array.begin());
  };

  GptNet never(m, Precision::kBf16);  // weights_changed never called
  never.forward_backward(array.data(), w.data(), 2, g.data());
  never.evaluate(array.data(), w.data(), 2);
  set(changed);
  EXPECT_TRUE(same_as_fresh(never.forward_backward(array.data(), w.data(), 2, g.data())));
  EXPECT_EQ(never.evaluate(array.data(), w.data(), 2).loss, want_eval);

  set(params);
  GptNet net(m, Precision::kBf16);
  net.weights_changed();
  net.forward_backward(array.data(), w.data(), 2, g.data());
  const double before_eval = net.evaluate(array.data(), w.data(), 2).loss;
  set(changed);
  // Not told: the copies of the old values are reused (the loss differs from the fresh net's).
  EXPECT_FALSE(same_as_fresh(net.forward_backward(array.data(), w.data(), 2, g.data())));
  EXPECT_NE(net.evaluate(array.data(), w.data(), 2).loss, want_eval);
  net.weights_changed();
  EXPECT_TRUE(same_as_fresh(net.forward_backward(array.data(), w.data(), 2, g.data())));
  EXPECT_EQ(net.evaluate(array.data(), w.data(), 2).loss, want_eval);
  EXPECT_NE(want_eval, before_eval);
}

}  // namespace gpt_test
}  // namespace cohort::nn
