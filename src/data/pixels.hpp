// Bytes of an image set as a bf16 batch's values, on the CPU's widest loop (dataset.cpp's
// batch assembly); internal to the data module, declared here so its tests run every loop the CPU
// has.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cohort/tensor/bf16.hpp"

namespace cohort::data::detail {

// dst[i] = to_bf16(src[i] * (1 / 255)) for i < n: with lanes16, in AVX512_BF16's 16 lanes (only
// where pixels_in_lanes16() is true), otherwise the plain loop. Both give the same bits.
void pixels_to_bf16(const std::uint8_t* src, bf16* dst, std::size_t n, bool lanes16);
// Whether this CPU runs the 16-lane loop (AVX512_BF16 in an x86-64 build): batch assembly's choice.
bool pixels_in_lanes16();

}  // namespace cohort::data::detail
