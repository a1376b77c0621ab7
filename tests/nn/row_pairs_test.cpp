// Row pairs (nn/batch_grad.hpp): the layout to_row_pairs writes, cohort's own bf16 weight-gradient
// kernel against a float64 loop and against itself over other ranges, the bias sums bitwise equal
// to the row-major ones, and a bf16 Net keeping its output-gradient rows in pairs.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "cohort/core/error.hpp"
#include "cohort/core/rng.hpp"
#include "cohort/nn/batch_grad.hpp"
#include "cohort/nn/net.hpp"
#include "cohort/nn/version.hpp"
#include "cohort/tensor/bf16.hpp"
#include "cohort/tensor/buffer.hpp"
#include "nn_test_util.hpp"

namespace cohort::nn {
namespace row_pairs_test {

constexpr std::uint64_t kSeed = 20261202;

struct Shape {
  std::int64_t rows, in, out;
};

std::string shape_name(const ::testing::TestParamInfo<Shape>& info) {
  return "rows" + std::to_string(info.param.rows) + "_in" + std::to_string(info.param.in) + "_out" +
         std::to_string(info.param.out);
}

// Seeded bf16 rows x (rows, in) and dy (rows, out), and dy in row pairs.
struct Rows {
  AlignedBuffer<bf16> x, dy, pairs;
  explicit Rows(const Shape& s)
      : x(static_cast<std::size_t>(s.rows * s.in)),
        dy(static_cast<std::size_t>(s.rows * s.out)),
        pairs(static_cast<std::size_t>((s.rows + 1) / 2 * 2 * s.out)) {
    Rng rng({kSeed, static_cast<std::uint64_t>(s.rows * 1000000 + s.in * 1000 + s.out)});
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = to_bf16(rng.uniform(-1.0f, 1.0f));
    for (std::size_t i = 0; i < dy.size(); ++i) dy[i] = to_bf16(rng.uniform(-1.0f, 1.0f));
    for (std::size_t i = 0; i < pairs.size(); ++i) pairs[i] = to_bf16(12345.0f);  // overwritten
    to_row_pairs(dy.data(), s.rows, s.out, pairs.data());
  }
};

class RowPairs : public ::testing::TestWithParam<Shape> {
 protected:
  void SetUp() override {
    if (!row_pair_kernel()) GTEST_SKIP() << "no AVX512_BF16 on this CPU";
    omp_set_num_threads(1);
    std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  }
};

// Element (r, o) at (r / 2) * 2 * OC + 2 * o + r % 2; an odd last row's partner is +0.
TEST_P(RowPairs, LayoutIsPairsOfRowsWithAZeroPartnerAfterAnOddLastRow) {
  const Shape s = GetParam();
  const Rows d(s);
  for (std::int64_t r = 0; r < (s.rows + 1) / 2 * 2; ++r)
    for (std::int64_t o = 0; o < s.out; ++o) {
      const bf16 want = r < s.rows ? d.dy[static_cast<std::size_t>(r * s.out + o)] : bf16{0};
      ASSERT_EQ(d.pairs[static_cast<std::size_t>((r / 2) * 2 * s.out + 2 * o + r % 2)].bits,
                want.bits)
          << "row " << r << " column " << o;
    }
}

// The products of two bf16 values are exact in f32, so only f32 accumulation differs from the
// float64 sum: |dw - ref| <= rows * 2^-24 * sum |x dy|. Computed in uneven ranges of rows of dW
// (tiles cut anywhere), the result is bitwise the whole range's.
TEST_P(RowPairs, WeightGradientMatchesAFloat64LoopInAnyRanges) {
  const Shape s = GetParam();
  const Rows d(s);
  const auto n = static_cast<std::size_t>(s.in * s.out);
  AlignedBuffer<float> whole(n), cut(n);
  linear_weight_grad_pairs(d.x.data(), d.pairs.data(), s.rows, s.in, s.out, 0, s.in, whole.data());
  for (std::int64_t i0 = 0, len = 1; i0 < s.in; i0 += len, len = len * 2 + 1) {
    const std::int64_t i1 = std::min(s.in, i0 + len);
    linear_weight_grad_pairs(d.x.data(), d.pairs.data(), s.rows, s.in, s.out, i0, i1,
                             cut.data() + i0 * s.out);
  }
  for (std::int64_t i = 0; i < s.in; ++i)
    for (std::int64_t o = 0; o < s.out; ++o) {
      const auto at = static_cast<std::size_t>(i * s.out + o);
      double sum = 0, abs_sum = 0;
      for (std::int64_t r = 0; r < s.rows; ++r) {
        const double t = double(to_float(d.x[static_cast<std::size_t>(r * s.in + i)])) *
                         to_float(d.dy[static_cast<std::size_t>(r * s.out + o)]);
        sum += t;
        abs_sum += std::abs(t);
      }
      ASSERT_NEAR(whole[at], sum, double(s.rows) * std::ldexp(1.0, -24) * abs_sum)
          << "at (" << i << ", " << o << ")";
      ASSERT_EQ(std::bit_cast<std::uint32_t>(cut[at]), std::bit_cast<std::uint32_t>(whole[at]))
          << "at (" << i << ", " << o << "): a range's result differs from the whole's";
    }
}

// The same sums in the same (row) order as linear_bias_grad on row-major dy: the same bits.
TEST_P(RowPairs, BiasGradientIsBitwiseTheRowMajorOne) {
  const Shape s = GetParam();
  const Rows d(s);
  const auto out = static_cast<std::size_t>(s.out);
  AlignedBuffer<float> plain(out), pairs(out);
  linear_bias_grad(d.dy.data(), s.rows, s.out, 0, s.out, plain.data());
  for (std::int64_t o0 = 0; o0 < s.out; o0 += 5)
    linear_bias_grad_pairs(d.pairs.data(), s.rows, s.out, o0, std::min(s.out, o0 + 5),
                           pairs.data() + o0);
  for (std::size_t o = 0; o < out; ++o)
    ASSERT_EQ(std::bit_cast<std::uint32_t>(pairs[o]), std::bit_cast<std::uint32_t>(plain[o]))
        << "bias " << o;
}

// Handed to a consumer a tile at a time, rows [i0, i1) of dW arrive in order, kPairTileRows at a
// time (a shorter last tile), bitwise the rows the whole-range call writes; the prefetched rows
// of the consumer's arrays (unaligned bases, widths that cut cache lines) are only touched, never
// changed.
TEST_P(RowPairs, AConsumerGetsEveryTileInOrderBitwiseTheWholeRangesRows) {
  const Shape s = GetParam();
  const Rows d(s);
  const auto n = static_cast<std::size_t>(s.in * s.out), out = static_cast<std::size_t>(s.out);
  AlignedBuffer<float> whole(n), buffer(static_cast<std::size_t>(kPairTileRows) * out);
  linear_weight_grad_pairs(d.x.data(), d.pairs.data(), s.rows, s.in, s.out, 0, s.in, whole.data());
  AlignedBuffer<float> w(n + 1), state(n + 1);
  AlignedBuffer<bf16> w16(n + 3);
  for (std::size_t i = 0; i < n; ++i) w[i] = state[i] = static_cast<float>(i);
  for (std::int64_t i0 = 0, len = 1; i0 < s.in; i0 += len, len = len * 3 + 2) {
    const std::int64_t i1 = std::min(s.in, i0 + len);
    std::int64_t next = i0;
    auto take = [&](std::int64_t i, std::int64_t j, const float* rows) {
      EXPECT_EQ(i, next) << "tiles out of order";
      EXPECT_EQ(j, std::min(i1, i + kPairTileRows)) << "tile [" << i << ", " << j << ")";
      EXPECT_EQ(rows, buffer.data());
      for (std::size_t e = 0; e < static_cast<std::size_t>(j - i) * out; ++e)
        EXPECT_EQ(std::bit_cast<std::uint32_t>(rows[e]),
                  std::bit_cast<std::uint32_t>(whole[static_cast<std::size_t>(i) * out + e]))
            << "row " << i + static_cast<std::int64_t>(e / out) << " column " << e % out;
      next = j;
      return true;
    };
    const RowConsumer consumer{take,
                               buffer.data(),
                               {{{w.data() + 1, out * sizeof(float)},
                                 {w16.data() + 3, out * sizeof(bf16)},
                                 {state.data(), out * sizeof(float)}}}};
    EXPECT_TRUE(linear_weight_grad_pairs(d.x.data(), d.pairs.data(), s.rows, s.in, s.out, i0, i1,
                                         consumer));
    EXPECT_EQ(next, i1) << "range [" << i0 << ", " << i1 << ") not handed on whole";
  }
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(w[i], static_cast<float>(i));
    ASSERT_EQ(state[i], static_cast<float>(i));
  }
}

// A consumer that answers false stops the kernel: no further tile is handed on.
TEST_P(RowPairs, AConsumerThatSaysStopGetsNoFurtherTile) {
  const Shape s = GetParam();
  const Rows d(s);
  AlignedBuffer<float> buffer(static_cast<std::size_t>(kPairTileRows * s.out));
  int calls = 0;
  auto take = [&](std::int64_t, std::int64_t, const float*) { return ++calls < 2; };
  const RowConsumer consumer{take, buffer.data(), {}};
  const bool whole =
      linear_weight_grad_pairs(d.x.data(), d.pairs.data(), s.rows, s.in, s.out, 0, s.in, consumer);
  const std::int64_t tiles = (s.in + kPairTileRows - 1) / kPairTileRows;
  EXPECT_EQ(calls, std::min<std::int64_t>(tiles, 2));
  EXPECT_EQ(whole, tiles < 2);
}

// Shapes: one row; odd row counts (a zero partner); widths below, at and past a 16- and 32-lane
// block and a 12-row tile; the default MLP's layers at a leaf and at the batch.
INSTANTIATE_TEST_SUITE_P(Shapes, RowPairs,
                         ::testing::Values(Shape{1, 1, 1}, Shape{3, 13, 5}, Shape{2, 12, 16},
                                           Shape{7, 25, 33}, Shape{64, 65, 63}, Shape{33, 256, 10},
                                           Shape{128, 784, 512}, Shape{256, 512, 256}),
                         shape_name);

// Rows for a bf16 Net's batch weight gradients of every linear layer of `m` at N rows (room for
// an odd N's zero partner), in buffers appended to `store`; the first layer's input is the
// caller's.
std::vector<LinearRows> row_buffers(const Model& m, std::int64_t N, bool pairs,
                                    std::vector<AlignedBuffer<bf16>>& store) {
  std::vector<LinearRows> rows;
  for (const auto& l : m.layers()) {
    if (l.kind != LayerSpec::Kind::kLinear) continue;
    const bool first = &l == &m.layers().front();
    void* xr = first ? nullptr : store.emplace_back(static_cast<std::size_t>(N * l.in.C)).data();
    void* dy = store.emplace_back(static_cast<std::size_t>((N + 1) * l.out.C)).data();
    rows.push_back({xr, dy, pairs});
  }
  return rows;
}

// A bf16 Net told to keep dy in row pairs writes exactly to_row_pairs of what it writes
// row-major, and the same x rows; an odd N pairs its last row with zero.
TEST(RowPairsNet, KeepsOutputGradientRowsInPairs) {
  if (bf16_support() == Bf16Support::kNone)
    GTEST_SKIP() << "oneDNN has no bf16 kernels here (" << onednn_isa() << ")";
  const Model m = Model::parse("mlp:20-24-10");
  for (const std::int64_t N : {4, 5}) {
    const auto in = testing::make_inputs(m, N, kSeed);
    AlignedBuffer<bf16> params(in.params.size()), x(in.x.size());
    to_bf16(in.params.data(), params.data(), params.size());
    to_bf16(in.x.data(), x.data(), x.size());
    std::vector<AlignedBuffer<bf16>> store;
    const std::vector<LinearRows> plain = row_buffers(m, N, false, store),
                                  pairs = row_buffers(m, N, true, store);
    Net net(m, true, Precision::kBf16);
    AlignedBuffer<float> grad(m.layout().total());
    net.forward_backward(params.data(), x.data(), in.labels.data(), N, grad.data(), {}, plain);
    net.forward_backward(params.data(), x.data(), in.labels.data(), N, grad.data(), {}, pairs);
    std::size_t k = 0;
    for (const auto& l : m.layers()) {
      if (l.kind != LayerSpec::Kind::kLinear) continue;
      const std::int64_t out = l.out.C;
      AlignedBuffer<bf16> want(static_cast<std::size_t>((N + 1) / 2 * 2 * out));
      to_row_pairs(static_cast<const bf16*>(plain[k].dy), N, out, want.data());
      const auto* got = static_cast<const bf16*>(pairs[k].dy);
      for (std::size_t i = 0; i < want.size(); ++i)
        ASSERT_EQ(got[i].bits, want[i].bits) << l.name << " N " << N << " element " << i;
      if (plain[k].x) {
        const auto* px = static_cast<const bf16*>(plain[k].x);
        const auto* qx = static_cast<const bf16*>(pairs[k].x);
        for (std::int64_t i = 0; i < N * l.in.C; ++i)
          ASSERT_EQ(px[i].bits, qx[i].bits) << l.name << " x " << i;
      }
      ++k;
    }
  }
}

// ReLU's backward fused into the pairs: dz = y > 0 ? dy : dy * 0 (oneDNN's formula: -0 where dy
// is negative, NaN where dy is infinite or NaN, 0 where y is NaN), written in pairs and, in place,
// row-major; an odd last row pairs with zero; every width's tail.
TEST(RowPairsRelu, BackwardIsTheFormulaInPairsAndInPlace) {
  if (!row_pair_kernel()) GTEST_SKIP() << "no AVX512_BF16 on this CPU";
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  const float inf = std::numeric_limits<float>::infinity(),
              nan = std::numeric_limits<float>::quiet_NaN();
  const float special[] = {0.0f, -0.0f, 1.0f, -1.0f, inf, -inf, nan, 1e-40f, -1e-40f, 3.5f};
  for (const std::int64_t rows : {1, 2, 5, 8})
    for (const std::int64_t out : {1, 15, 16, 17, 40})
      for (const bool in_place : {false, true}) {
        const auto n = static_cast<std::size_t>(rows * out);
        AlignedBuffer<bf16> y(n), dy(n), want(n),
            pairs(static_cast<std::size_t>((rows + 1) / 2 * 2 * out));
        Rng rng({kSeed, static_cast<std::uint64_t>(rows * 100 + out)});
        for (std::size_t i = 0; i < n; ++i) {
          y[i] = to_bf16(i % 3 == 0 ? special[i % 10] : rng.uniform(-1.0f, 1.0f));
          dy[i] = to_bf16(i % 4 == 1 ? special[(i / 4) % 10] : rng.uniform(-1.0f, 1.0f));
          const float d = to_float(dy[i]), z = to_float(y[i]) > 0.0f ? d : d * 0.0f;
          want[i] = bf16{static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(z) >> 16)};
        }
        AlignedBuffer<bf16> d(n);
        std::copy(dy.data(), dy.data() + n, d.data());
        relu_backward_to_row_pairs(y.data(), d.data(), rows, out, pairs.data(), in_place);
        AlignedBuffer<bf16> want_pairs(pairs.size());
        to_row_pairs(want.data(), rows, out, want_pairs.data());
        const std::string at = "rows " + std::to_string(rows) + " out " + std::to_string(out);
        for (std::size_t i = 0; i < pairs.size(); ++i)
          ASSERT_EQ(pairs[i].bits, want_pairs[i].bits) << at << " pair element " << i;
        for (std::size_t i = 0; i < n; ++i)
          ASSERT_EQ(d[i].bits, (in_place ? want[i] : dy[i]).bits) << at << " element " << i;
        std::copy(dy.data(), dy.data() + n, d.data());
        relu_backward(y.data(), d.data(), n);
        for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(d[i].bits, want[i].bits) << at << " " << i;
      }
}

// The rows a bf16 Net keeps (ReLU's backward in the pass that keeps them, plain and in
// pairs) give the weight gradients oneDNN's own backward (its ReLU, its backward-weights) gives
// the same leaf: a wrong mask or a lost row would be a large difference, not a rounding one.
TEST(RowPairsRelu, KeptRowsGiveTheLeafModesWeightGradients) {
  if (!row_pair_kernel()) GTEST_SKIP() << "no AVX512_BF16 on this CPU";
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  const Model m = Model::parse("mlp:20-24-18-10");
  for (const std::int64_t N : {6, 7})
    for (const bool use_pairs : {false, true}) {
      const auto in = testing::make_inputs(m, N, kSeed);
      AlignedBuffer<bf16> params(in.params.size()), x(in.x.size());
      to_bf16(in.params.data(), params.data(), params.size());
      to_bf16(in.x.data(), x.data(), x.size());
      Net net(m, true, Precision::kBf16);
      AlignedBuffer<float> leaf(m.layout().total()), unused(m.layout().total());
      net.forward_backward(params.data(), x.data(), in.labels.data(), N, leaf.data());
      std::vector<AlignedBuffer<bf16>> store;
      const std::vector<LinearRows> rows = row_buffers(m, N, use_pairs, store);
      net.forward_backward(params.data(), x.data(), in.labels.data(), N, unused.data(), {}, rows);
      std::size_t k = 0;
      for (const auto& l : m.layers()) {
        if (l.kind != LayerSpec::Kind::kLinear) continue;
        const std::int64_t ic = l.in.C, oc = l.out.C;
        const bf16* xr = rows[k].x ? static_cast<const bf16*>(rows[k].x) : x.data();
        AlignedBuffer<float> dw(static_cast<std::size_t>(ic * oc));
        if (use_pairs)
          linear_weight_grad_pairs(xr, static_cast<const bf16*>(rows[k].dy), N, ic, oc, 0, ic,
                                   dw.data());
        else
          linear_weight_grad(xr, static_cast<const bf16*>(rows[k].dy), N, ic, oc, 0, ic, dw.data());
        float largest = 0;
        for (std::int64_t i = 0; i < ic * oc; ++i)
          largest = std::max(largest, std::abs(leaf[l.weight + static_cast<std::size_t>(i)]));
        ASSERT_GT(largest, 0.0f) << l.name;
        for (std::int64_t i = 0; i < ic * oc; ++i)
          ASSERT_NEAR(dw[static_cast<std::size_t>(i)], leaf[l.weight + static_cast<std::size_t>(i)],
                      1e-5f * largest)
              << l.name << " N " << N << (use_pairs ? " pairs" : " plain") << " element " << i;
        ++k;
      }
    }
}

// Row pairs are bf16 rows: an f32 Net refuses them.
TEST(RowPairsNet, AnF32NetRefusesRowPairs) {
  const Model m = Model::parse("mlp:4-3-2");
  const auto in = testing::make_inputs(m, 2, kSeed);
  std::vector<AlignedBuffer<float>> store;
  std::vector<LinearRows> rows;
  for (const auto& l : m.layers())
    if (l.kind == LayerSpec::Kind::kLinear)
      rows.push_back({store.emplace_back(8 * 8).data(), store.emplace_back(8 * 8).data(), true});
  rows.front().x = nullptr;
  Net net(m);
  AlignedBuffer<float> grad(m.layout().total());
  EXPECT_THROW(net.forward_backward(in.params.data(), in.x.data(), in.labels.data(), 2, grad.data(),
                                    {}, rows),
               InternalError);
}

}  // namespace row_pairs_test
}  // namespace cohort::nn

namespace cohort::nn {
namespace {

// The root's bf16 GEMM is chosen by what the CPU runs alone: oneDNN's where it dispatches AMX
// (its tiles), the row-pair kernel where the CPU runs it without AMX, oneDNN's elsewhere.
TEST(RootGemm, TheTableOfWhatTheCpuRuns) {
  static_assert(choose_root_gemm(/*onednn_amx=*/true, /*row_pairs=*/true) == RootGemm::kOneDnn);
  static_assert(choose_root_gemm(true, false) == RootGemm::kOneDnn);
  static_assert(choose_root_gemm(false, true) == RootGemm::kRowPairs);
  static_assert(choose_root_gemm(false, false) == RootGemm::kOneDnn);
  // This process: the table at this CPU's row (printed: the CPU decides which row a run tests).
  const bool amx = onednn_isa().find("amx") != std::string::npos;
  std::printf("oneDNN dispatches %s; row-pair kernel %s: %s\n", onednn_isa().c_str(),
              row_pair_kernel() ? "runs" : "does not run",
              std::string(name_of(kRootGemmNames, root_bf16_gemm())).c_str());
  EXPECT_EQ(root_bf16_gemm(), choose_root_gemm(amx, row_pair_kernel()));
  if (amx) {
    EXPECT_EQ(root_bf16_gemm(), RootGemm::kOneDnn) << "AMX: oneDNN's tiles";
  }
}

}  // namespace
}  // namespace cohort::nn
