// Linear weights into oneDNN's pair-blocked layouts; see weight_pairs.hpp.
#include "weight_pairs.hpp"

#include <algorithm>
#include <cstring>

#include "cohort/core/cpu.hpp"

namespace cohort::nn::detail {

std::optional<PairBlocks> pair_blocks(const dnnl::memory::desc& from,
                                      const dnnl::memory::desc& to) {
  const dnnl_memory_desc_t &f = from.data, &t = to.data;
  if (f.ndims != 2 || t.ndims != 2 || f.data_type != dnnl_bf16 || t.data_type != dnnl_bf16 ||
      f.format_kind != dnnl_blocked || t.format_kind != dnnl_blocked || f.offset0 != 0 ||
      t.offset0 != 0 || f.extra.flags != 0 || t.extra.flags != 0)
    return std::nullopt;
  const std::int64_t O = f.dims[0], I = f.dims[1];
  if (t.dims[0] != O || t.dims[1] != I) return std::nullopt;
  const dnnl_blocking_desc_t &fb = f.format_desc.blocking, &tb = t.format_desc.blocking;
  if (fb.inner_nblks != 0 || f.padded_dims[0] != O || f.padded_dims[1] != I) return std::nullopt;
  PairBlocks b;
  if (fb.strides[0] == 1 && fb.strides[1] == O)
    b.rows_of_outputs = false;  // (I, O) rows
  else if (fb.strides[0] == I && fb.strides[1] == 1)
    b.rows_of_outputs = true;  // (O, I) rows
  else
    return std::nullopt;
  // Inner blocks k (of input rows), n (of output columns), 2 (of input rows), outermost first.
  if (tb.inner_nblks != 3 || tb.inner_idxs[0] != 1 || tb.inner_idxs[1] != 0 ||
      tb.inner_idxs[2] != 1 || tb.inner_blks[2] != 2)
    return std::nullopt;
  b.O = O;
  b.I = I;
  b.a_block = tb.inner_blks[1];
  b.b_block = tb.inner_blks[0] * 2;
  b.stride_a = tb.strides[0];
  b.stride_b = tb.strides[1];
  b.padded_O = t.padded_dims[0];
  b.padded_I = t.padded_dims[1];
  const std::int64_t block = b.a_block * b.b_block;
  if (b.a_block <= 0 || b.padded_O % b.a_block != 0 || b.padded_I % b.b_block != 0 ||
      b.stride_a % block != 0 || b.stride_b % block != 0 ||
      static_cast<std::size_t>(b.padded_O * b.padded_I) * sizeof(bf16) != to.get_size())
    return std::nullopt;
  return b;
}

void to_pair_blocks(const PairBlocks& b, const bf16* from, bf16* to) {
  std::memset(to, 0, static_cast<std::size_t>(b.padded_O * b.padded_I) * sizeof(bf16));
  to_pair_blocks(b, from, to, 0, static_cast<std::size_t>(b.O * b.I));
}

namespace {

// (I, O) rows: a pair of input rows both in the range is one 32-bit word per output column,
// built from the two rows' values (the loop the compiler vectorizes); else element by element.
void from_input_rows(const PairBlocks& b, const std::uint16_t* src, std::uint16_t* dst,
                     std::int64_t lo, std::int64_t hi) {
  const std::int64_t O = b.O, A = b.a_block;
  // Where input row i's pair starts in the block of output columns [0, A): column o at
  // + (o / A) * stride_a + (o % A) * 2.
  auto row_at = [&](std::int64_t i) {
    return (i / b.b_block) * b.stride_b + (i % b.b_block) / 2 * 2 * A + i % 2;
  };
  for (std::int64_t i = lo / O; i * O < hi;) {
    if (i % 2 == 0 && i + 1 < b.I && i * O >= lo && (i + 2) * O <= hi) {
      const std::uint16_t* r0 = src + i * O;
      const std::uint16_t* r1 = r0 + O;
      for (std::int64_t o0 = 0; o0 < O; o0 += A) {
        auto* out = reinterpret_cast<std::uint32_t*>(dst + (o0 / A) * b.stride_a + row_at(i));
        const std::int64_t n = std::min(A, O - o0);
        for (std::int64_t o = 0; o < n; ++o)
          out[o] = static_cast<std::uint32_t>(r0[o0 + o]) | static_cast<std::uint32_t>(r1[o0 + o])
                                                                << 16;
      }
      i += 2;
      continue;
    }
    const std::int64_t first = std::max(lo, i * O) - i * O;
    const std::int64_t last = std::min(hi, (i + 1) * O) - i * O;
    const std::int64_t row = row_at(i);
    for (std::int64_t o = first; o < last; ++o)
      dst[(o / A) * b.stride_a + row + (o % A) * 2] = src[i * O + o];
    ++i;
  }
}

// (O, I) rows [lo, hi) of the source's elements. Whole rows go a block of output columns and a
// pair of input rows at a time: the block's words (each a pair, adjacent in its source row) are
// read down the rows, whose cache lines serve the next pairs too, and stored side by side. The
// rows cut by the range's ends go element by element.
void from_output_rows(const PairBlocks& b, const std::uint16_t* src, std::uint16_t* dst,
                      std::int64_t lo, std::int64_t hi) {
  const std::int64_t I = b.I, A = b.a_block, step = 2 * A;
  auto at = [&](std::int64_t o, std::int64_t i) {
    return dst + (o / A) * b.stride_a + (o % A) * 2 + (i / b.b_block) * b.stride_b +
           (i % b.b_block) / 2 * step + i % 2;
  };
  auto part_of_row = [&](std::int64_t o, std::int64_t first, std::int64_t last) {
    for (std::int64_t i = first; i < last; ++i) *at(o, i) = src[o * I + i];
  };
  const std::int64_t whole_begin = (lo + I - 1) / I, whole_end = hi / I;
  if (whole_begin > whole_end) {  // inside one row
    part_of_row(lo / I, lo % I, hi % I);
    return;
  }
  if (lo % I != 0) part_of_row(lo / I, lo % I, I);
  if (hi % I != 0) part_of_row(whole_end, 0, hi % I);
  for (std::int64_t o0 = whole_begin; o0 < whole_end;) {
    const std::int64_t o1 = std::min(whole_end, (o0 / A + 1) * A), n = o1 - o0;
    const std::uint16_t* rows = src + o0 * I;
    for (std::int64_t i = 0; i + 1 < I; i += 2) {
      auto* out = reinterpret_cast<std::uint32_t*>(at(o0, i));
      for (std::int64_t k = 0; k < n; ++k) std::memcpy(out + k, rows + k * I + i, 4);
    }
    if (I % 2 != 0)  // the last input row has no pair: its half of the word only
      for (std::int64_t k = 0; k < n; ++k) *at(o0 + k, I - 1) = rows[k * I + I - 1];
    o0 = o1;
  }
}

}  // namespace

COHORT_CLONES_AVX512
void to_pair_blocks(const PairBlocks& b, const bf16* from, bf16* to, std::size_t begin,
                    std::size_t end) {
  const auto* src = reinterpret_cast<const std::uint16_t*>(from);
  auto* dst = reinterpret_cast<std::uint16_t*>(to);
  const auto lo = static_cast<std::int64_t>(begin), hi = static_cast<std::int64_t>(end);
  if (b.rows_of_outputs)
    from_output_rows(b, src, dst, lo, hi);
  else
    from_input_rows(b, src, dst, lo, hi);
}

}  // namespace cohort::nn::detail
