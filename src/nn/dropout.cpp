// Dropout masks from the keyed SplitMix64 stream.
#include "cohort/nn/dropout.hpp"

#include "cohort/core/cpu.hpp"
#include "cohort/core/rng.hpp"

namespace cohort::nn {

namespace {
// Element i is the stream's draw i (Rng::next_unit), computed from its counter rather than from
// the draw before it, so that the loop has no carried dependency and vectorizes: at AVX2 with
// GCC's emulated 64-bit multiplies, at AVX-512 (its clone, where the CPU has it) with vpmullq.
COHORT_CLONES_AVX512
void fill_mask(std::uint64_t state, float p, float keep, std::size_t count, float* mask) {
  for (std::size_t i = 0; i < count; ++i) {
    const float u = Rng::unit_of(Rng::mix(state + (i + 1) * Rng::kGamma));
    mask[i] = u < p ? 0.0f : keep;
  }
}

std::uint64_t mask_state(const StreamKey& key, std::size_t layer) {
  return Rng({key.seed, 0xd809ull /* purpose: dropout */, key.step, key.leaf, layer}).state();
}
}  // namespace

void dropout_mask(const StreamKey& key, std::size_t layer, float p, std::size_t count,
                  float* mask) {
  fill_mask(mask_state(key, layer), p, 1.0f / (1.0f - p), count, mask);
}

void causal_dropout_mask(const StreamKey& key, std::size_t layer, float p, std::size_t mats,
                         std::size_t T, float* mask) {
  const std::uint64_t state = mask_state(key, layer);
  const float keep = 1.0f / (1.0f - p);
  // Draw i of the stream from draw `first` on: the state moved first steps along.
  for (std::size_t row = 0; row < mats * T; ++row) {
    const std::size_t first = row * T;
    fill_mask(state + first * Rng::kGamma, p, keep, row % T + 1, mask + first);
  }
}

}  // namespace cohort::nn
