// The summation kernel, the tree shape and the serial oracle, checked against plain scalar code;
// and a check that these data make a wrong order visible (so the bitwise tests can fail).
#include <gtest/gtest.h>

#include "cohort/core/error.hpp"
#include "cohort/reduce/kernels.hpp"
#include "reduce_test_util.hpp"

namespace cohort::reduce {
namespace kernels_test {

using testing::bitwise_equal;
using testing::Leaves;
using testing::naive_node;

TEST(TreeShape, BinaryExampleFromHeader) {
  const TreeShape shape(5, 2);
  ASSERT_EQ(shape.node_count(), 9u);
  EXPECT_EQ(std::vector<std::uint32_t>(shape.children(5).begin(), shape.children(5).end()),
            (std::vector<std::uint32_t>{0, 1}));
  EXPECT_EQ(std::vector<std::uint32_t>(shape.children(6).begin(), shape.children(6).end()),
            (std::vector<std::uint32_t>{2, 3}));
  EXPECT_EQ(std::vector<std::uint32_t>(shape.children(7).begin(), shape.children(7).end()),
            (std::vector<std::uint32_t>{5, 6}));
  EXPECT_EQ(std::vector<std::uint32_t>(shape.children(8).begin(), shape.children(8).end()),
            (std::vector<std::uint32_t>{7, 4}));
  EXPECT_EQ(shape.root(), 8u);
  EXPECT_EQ(shape.parent(4), 8u);
}

TEST(TreeShape, SingleLeafAndFlat) {
  const TreeShape one(1, 2);
  EXPECT_EQ(one.node_count(), 1u);
  EXPECT_TRUE(one.is_leaf(one.root()));
  const TreeShape flat(7, 8);
  ASSERT_EQ(flat.node_count(), 8u);
  EXPECT_EQ(flat.children(flat.root()).size(), 7u);
}

TEST(TreeShape, EveryLeafReachesTheRootOnce) {
  for (std::size_t arity : {2, 3, 4, 8, 64}) {
    for (std::size_t leaves = 1; leaves <= 70; ++leaves) {
      const TreeShape shape(leaves, arity);
      std::vector<int> seen(shape.node_count(), 0);
      for (std::uint32_t p = static_cast<std::uint32_t>(leaves); p < shape.node_count(); ++p) {
        ASSERT_GE(shape.children(p).size(), 2u);
        ASSERT_LE(shape.children(p).size(), arity);
        for (std::uint32_t c : shape.children(p)) {
          ASSERT_LT(c, p);  // children precede parents
          ASSERT_EQ(shape.parent(c), p);
          ++seen[c];
        }
      }
      for (std::uint32_t v = 0; v + 1 < shape.node_count(); ++v) ASSERT_EQ(seen[v], 1);
      EXPECT_EQ(shape.parent(shape.root()), TreeShape::kNoParent);
    }
  }
}

TEST(TreeShape, RejectsBadInput) {
  EXPECT_THROW(TreeShape(0, 2), InputError);
  EXPECT_THROW(TreeShape(4, 1), InputError);
}

TEST(Kernels, SumSourcesMatchesScalarLeftToRight) {
  const std::uint64_t seed = 11;
  std::printf("seed=%llu\n", static_cast<unsigned long long>(seed));
  for (std::size_t k = 1; k <= 9; ++k) {
    for (std::size_t n : {0, 1, 15, 16, 17, 1023, 1024, 1025, 4097}) {
      Leaves leaves(k, n, seed + k);
      for (float scale : {1.0f, 0.125f, 1.0f / 3.0f}) {
        AlignedBuffer<float> got(n), want(n);
        sum_sources(got.data(), leaves.pointers.data(), k, n, scale);
        for (std::size_t i = 0; i < n; ++i) {
          float acc = leaves.pointers[0][i];
          for (std::size_t j = 1; j < k; ++j) acc += leaves.pointers[j][i];
          want[i] = scale == 1.0f ? acc : acc * scale;
        }
        ASSERT_TRUE(bitwise_equal(got.data(), want.data(), n)) << "k=" << k << " n=" << n;
      }
    }
  }
}

TEST(Kernels, AccumulateAndScale) {
  Leaves leaves(2, 1000, 5);
  AlignedBuffer<float> d(1000);
  sum_sources(d.data(), leaves.pointers.data(), 1, 1000);
  accumulate(d.data(), leaves.pointers[1], 1000);
  scale_in_place(d.data(), 1000, 0.5f);
  for (std::size_t i = 0; i < 1000; ++i) {
    ASSERT_EQ(d[i], (leaves.pointers[0][i] + leaves.pointers[1][i]) * 0.5f);
  }
}

// The oracle equals plain recursion over the shape, for every L in 1..33 and several arities.
TEST(Reference, MatchesNaiveTreeRecursion) {
  const std::uint64_t seed = 21;
  std::printf("seed=%llu\n", static_cast<unsigned long long>(seed));
  const std::size_t n = 1100;  // crosses the evaluator's 1024-float block
  for (std::size_t arity : {2, 3, 4, 8}) {
    for (std::size_t l = 1; l <= 33; ++l) {
      const TreeShape shape(l, arity);
      Leaves leaves(l, n, seed + l);
      AlignedBuffer<float> got(n);
      reference_reduce(shape, leaves.pointers, n, got.data(), 0.25f);
      for (std::size_t i = 0; i < n; ++i) {
        const float want = naive_node(shape, leaves.pointers, shape.root(), i) * 0.25f;
        ASSERT_EQ(std::memcmp(&got[i], &want, sizeof(float)), 0)
            << "arity=" << arity << " L=" << l << " i=" << i;
      }
      ASSERT_TRUE(testing::within_float64(leaves.pointers, n, got.data(), 0.25f));
    }
  }
}

// A test that cannot fail is a defect: with these data a different order of additions (another
// arity, reversed children, plain left-to-right) changes bits, so bitwise checks have teeth.
TEST(Reference, WrongOrderIsDetected) {
  const std::uint64_t seed = 31;
  std::printf("seed=%llu\n", static_cast<unsigned long long>(seed));
  const std::size_t n = 4097;
  for (std::size_t l : {3, 5, 8, 33}) {
    Leaves leaves(l, n, seed + l);
    const TreeShape binary(l, 2);
    const TreeShape other(l, 3);
    AlignedBuffer<float> a(n), b(n), c(n);
    reference_reduce(binary, leaves.pointers, n, a.data());
    reference_reduce(other, leaves.pointers, n, b.data());
    // Rotated, not reversed: a + b == b + a exactly, so mirroring a full binary tree is no change.
    std::vector<const float*> rotated(leaves.pointers.begin() + 1, leaves.pointers.end());
    rotated.push_back(leaves.pointers[0]);
    reference_reduce(binary, rotated, n, c.data());
    // For L = 3 the binary tree and arity 3 are the same order, ((l0 + l1) + l2).
    if (l != 3) {
      EXPECT_FALSE(bitwise_equal(a.data(), b.data(), n)) << "L=" << l;
    }
    EXPECT_FALSE(bitwise_equal(a.data(), c.data(), n)) << "L=" << l;
  }
}

}  // namespace kernels_test
}  // namespace cohort::reduce
