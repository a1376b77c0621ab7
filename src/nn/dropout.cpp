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
}  // namespace

void dropout_mask(const StreamKey& key, std::size_t layer, float p, std::size_t count,
                  float* mask) {
  const Rng rng({key.seed, 0xd809ull /* purpose: dropout */, key.step, key.leaf, layer});
  fill_mask(rng.state(), p, 1.0f / (1.0f - p), count, mask);
}

}  // namespace cohort::nn
