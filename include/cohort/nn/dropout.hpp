// Dropout masks drawn from keyed streams: (seed, step, leaf, layer) names the stream, so a leaf's
// mask is the same whichever replica or thread computes it, and a resumed run redraws it exactly.
// Not a layer: nn::Net applies the mask (inverted dropout: kept values scaled by 1/(1-p)).
#pragma once

#include <cstddef>
#include <cstdint>

namespace cohort::nn {

// Identifies one leaf of one optimizer step.
struct StreamKey {
  std::uint64_t seed = 0, step = 0, leaf = 0;
};

// mask[i] = 0 with probability p, else 1 / (1 - p), for i in [0, count), in logical row-major
// (N, C, H, W) order, from the stream keyed by (key, layer).
void dropout_mask(const StreamKey& key, std::size_t layer, float p, std::size_t count, float* mask);
// The same mask's entries that a causal attention reads: of `mats` row-major (T, T) matrices,
// row i's first i + 1 entries, each dropout_mask's value at its place; the others not written.
void causal_dropout_mask(const StreamKey& key, std::size_t layer, float p, std::size_t mats,
                         std::size_t T, float* mask);

}  // namespace cohort::nn
