// detail::to_pair_blocks (src/nn/weight_pairs.hpp) against oneDNN's own reorder of the same
// weights, bit for bit (padding included), for the pair-blocked layouts oneDNN chooses for bf16
// inner products, from weights stored (I, O) and (O, I), on shapes whose dims are and are not
// multiples of the blocks, whole and in ranges; and pair_blocks declines what the loop does not
// write (a blocked source, f32, a plain or unpaired destination), which the plans then leave to
// oneDNN's reorder.
#include <gtest/gtest.h>

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cohort/core/rng.hpp"
#include "cohort/tensor/bf16.hpp"
#include "cohort/tensor/buffer.hpp"
#include "weight_pairs.hpp"

namespace cohort::nn::detail {
namespace {

using Tag = dnnl::memory::format_tag;
using Dt = dnnl::memory::data_type;

constexpr std::uint64_t kSeed = 20261206;

struct Case {
  std::int64_t O, I;
  Tag tag;
  Tag stored;  // ba: (I, O) rows (a layer list's), ab: (O, I) rows (a language model's)
  std::string name;
};

class PairBlocksTest : public testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    const Case& c = GetParam();
    from_md = dnnl::memory::desc({c.O, c.I}, Dt::bf16, c.stored);
    to_md = dnnl::memory::desc({c.O, c.I}, Dt::bf16, c.tag);
    const auto b = pair_blocks(from_md, to_md);
    ASSERT_TRUE(b.has_value());
    blocks = *b;
    Rng rng({kSeed});
    w.resize(static_cast<std::size_t>(c.O * c.I));
    for (bf16& v : w) v = to_bf16(rng.uniform(-1.0f, 1.0f));
    // oneDNN's reorder of the whole weight, into a destination of garbage: the padding is
    // written too.
    want = AlignedBuffer<std::uint8_t>(to_md.get_size());
    std::memset(want.data(), 0x5a, want.size());
    dnnl::memory from(from_md, eng, w.data()), to(to_md, eng, want.data());
    dnnl::reorder(from, to).execute(stream, from, to);
    stream.wait();
  }
  bf16* as_bf16(AlignedBuffer<std::uint8_t>& b) { return reinterpret_cast<bf16*>(b.data()); }

  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{eng};
  dnnl::memory::desc from_md, to_md;
  PairBlocks blocks;
  std::vector<bf16> w;
  AlignedBuffer<std::uint8_t> want;
};

TEST_P(PairBlocksTest, WritesWhatOneDnnsReorderWrites) {
  SCOPED_TRACE("seed " + std::to_string(kSeed));
  AlignedBuffer<std::uint8_t> got(want.size());
  std::memset(got.data(), 0xa5, got.size());
  to_pair_blocks(blocks, w.data(), as_bf16(got));
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size()), 0);
}

// Ranges that cut rows and row pairs anywhere (random bounds, fixed seed), written by two
// threads at once, give the whole weight's layout; a range written alone changes only its own
// elements (the rest of a zeroed copy stays zero except where the range's values are).
TEST_P(PairBlocksTest, RangesFromTwoThreadsWriteTheWholeLayout) {
  SCOPED_TRACE("seed " + std::to_string(kSeed + 1));
  const std::size_t n = w.size();
  Rng rng({kSeed + 1});
  std::vector<std::size_t> cuts{0, n};
  for (int k = 0; k < 9; ++k) cuts.push_back(static_cast<std::size_t>(rng.next_u64() % (n + 1)));
  std::sort(cuts.begin(), cuts.end());
  AlignedBuffer<std::uint8_t> got(want.size());
  std::memset(got.data(), 0, got.size());  // the padding, as the whole write leaves it
  auto write = [&](std::size_t parity) {
    for (std::size_t r = parity; r + 1 < cuts.size(); r += 2)
      to_pair_blocks(blocks, w.data(), as_bf16(got), cuts[r], cuts[r + 1]);
  };
  std::thread other(write, 1);
  write(0);
  other.join();
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size()), 0);

  // One range alone, of an odd length from an odd start.
  const std::size_t begin = std::min<std::size_t>(n - 1, n / 3 | 1), end = std::min(n, begin + 7);
  std::vector<bf16> marked(n, to_bf16(0.0f));
  for (std::size_t i = begin; i < end; ++i) marked[i] = w[i];
  AlignedBuffer<std::uint8_t> whole(want.size()), part(want.size());
  to_pair_blocks(blocks, marked.data(), as_bf16(whole));
  std::memset(part.data(), 0, part.size());
  to_pair_blocks(blocks, w.data(), as_bf16(part), begin, end);
  EXPECT_EQ(std::memcmp(part.data(), whole.data(), whole.size()), 0);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, PairBlocksTest,
    testing::Values(Case{512, 784, Tag::AB8b64a2b, Tag::ba, "O512_I784_AB8b64a2b_from_IO"},
                    Case{256, 512, Tag::AB8b64a2b, Tag::ba, "O256_I512_AB8b64a2b_from_IO"},
                    Case{10, 256, Tag::AB8b16a2b, Tag::ba, "O10_I256_AB8b16a2b_from_IO"},
                    Case{100, 33, Tag::AB8b32a2b, Tag::ba, "O100_I33_AB8b32a2b_from_IO"},
                    Case{7, 5, Tag::AB8b16a2b, Tag::ba, "O7_I5_AB8b16a2b_from_IO"},
                    Case{70, 47, Tag::AB16b64a2b, Tag::ba, "O70_I47_AB16b64a2b_from_IO"},
                    Case{384, 128, Tag::AB8b64a2b, Tag::ab, "O384_I128_AB8b64a2b_from_OI"},
                    Case{65, 128, Tag::AB8b64a2b, Tag::ab, "O65_I128_AB8b64a2b_from_OI"},
                    Case{70, 47, Tag::AB16b64a2b, Tag::ab, "O70_I47_AB16b64a2b_from_OI"},
                    Case{7, 5, Tag::AB8b16a2b, Tag::ab, "O7_I5_AB8b16a2b_from_OI"}),
    [](const testing::TestParamInfo<Case>& p) { return p.param.name; });

TEST(PairBlocks, DeclinesOtherLayoutsAndTypes) {
  const dnnl::memory::desc to({64, 32}, Dt::bf16, Tag::AB8b64a2b);
  EXPECT_FALSE(pair_blocks(dnnl::memory::desc({64, 32}, Dt::bf16, Tag::AB16b16a), to));
  EXPECT_FALSE(pair_blocks(dnnl::memory::desc({64, 32}, Dt::f32, Tag::ba),
                           dnnl::memory::desc({64, 32}, Dt::f32, Tag::AB8b64a2b)));
  EXPECT_FALSE(pair_blocks(dnnl::memory::desc({64, 32}, Dt::bf16, Tag::ba),
                           dnnl::memory::desc({64, 32}, Dt::bf16, Tag::ab)));
  EXPECT_FALSE(pair_blocks(dnnl::memory::desc({64, 32}, Dt::bf16, Tag::ba),
                           dnnl::memory::desc({64, 32}, Dt::bf16, Tag::AB16b16a)));
  EXPECT_TRUE(pair_blocks(dnnl::memory::desc({64, 32}, Dt::bf16, Tag::ba), to));
  EXPECT_TRUE(pair_blocks(dnnl::memory::desc({64, 32}, Dt::bf16, Tag::ab), to));
}

}  // namespace
}  // namespace cohort::nn::detail
