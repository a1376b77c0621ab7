// Dropout masks from the keyed SplitMix64 stream.
#include "cohort/nn/dropout.hpp"

#include "cohort/core/rng.hpp"

namespace cohort::nn {

void dropout_mask(const StreamKey& key, std::size_t layer, float p, std::size_t count,
                  float* mask) {
  Rng rng({key.seed, 0xd809ull /* purpose: dropout */, key.step, key.leaf, layer});
  const float keep = 1.0f / (1.0f - p);
  for (std::size_t i = 0; i < count; ++i) mask[i] = rng.next_unit() < p ? 0.0f : keep;
}

}  // namespace cohort::nn
