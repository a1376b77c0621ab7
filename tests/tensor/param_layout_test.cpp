// ParamLayout and AlignedBuffer: alignment of every view, padding, lookup by name.
#include "cohort/tensor/param_layout.hpp"

#include <gtest/gtest.h>

#include <cstdint>

#include "cohort/core/error.hpp"
#include "cohort/tensor/buffer.hpp"

namespace cohort {
namespace param_layout_test {

TEST(ParamLayout, EveryTensorStartsOnACacheLine) {
  ParamLayout layout;
  layout.add("fc1.weight", Shape{{3, 5}});  // 15 floats
  layout.add("fc1.bias", Shape{{3}});
  layout.add("fc2.weight", Shape{{17}});
  EXPECT_EQ(layout.at("fc1.weight").offset, 0u);
  EXPECT_EQ(layout.at("fc1.bias").offset, 16u);
  EXPECT_EQ(layout.at("fc2.weight").offset, 32u);
  EXPECT_EQ(layout.total(), 49u);
  EXPECT_EQ(layout.numel(), 35u);
  AlignedBuffer<float> buf(layout.total());
  for (const auto& e : layout.entries())
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(buf.data() + e.offset) % kCacheLine, 0u) << e.name;
}

TEST(ParamLayout, UnknownNameIsAnInternalError) {
  ParamLayout layout;
  layout.add("w", Shape{{2, 2}});
  EXPECT_THROW(layout.at("nope"), InternalError);
}

TEST(AlignedBuffer, IsZeroedAndAligned) {
  for (std::size_t n : {1u, 15u, 16u, 17u, 1000u}) {
    AlignedBuffer<float> b(n);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b.data()) % kCacheLine, 0u);
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(b[i], 0.0f);
  }
  AlignedBuffer<float> empty(0);
  EXPECT_EQ(empty.size(), 0u);
  EXPECT_EQ(Shape({{512, 784}}).str(), "(512, 784)");
}

}  // namespace param_layout_test
}  // namespace cohort
