// The trainer's tuning constants (private to src/train and its tests).
#pragma once

#include <cstddef>

namespace cohort::train {

// The root's chunk, and so the reducer's (floats): 256 KiB. The fused root computes a chunk's
// batch weight gradients with one GEMM of the chunk's weight rows, and oneDNN 2.6's bf16 GEMM
// re-packs dY per call, so a GEMM of few rows runs below the rate of a larger one
// (docs/decisions.md, "The root's chunk size", and its command). One value for every worker count
// and rank split: the chunk grid is part of how the root computes.
inline constexpr std::size_t kRootChunk = 65536;

}  // namespace cohort::train
