// The causal softmax's backward (see the header for why it is cohort's own).
#include "cohort/nn/gpt_kernels.hpp"

#include "cohort/core/cpu.hpp"

namespace cohort::nn {

namespace {

inline void store(float* out, float v) { *out = v; }
inline void store(bf16* out, float v) { *out = to_bf16(v); }

template <class Out>
[[gnu::always_inline]] inline void backward_rows(const float* p, const float* dp, Out* ds,
                                                 std::int64_t mats, std::int64_t T) {
  for (std::int64_t r = 0; r < mats * T; ++r) {
    const std::int64_t n = r % T + 1;  // the row's unmasked entries
    const float* pr = p + r * T;
    const float* dr = dp + r * T;
    Out* out = ds + r * T;
    float part[8] = {};
    std::int64_t j = 0;
    for (; j + 8 <= n; j += 8)
      for (int k = 0; k < 8; ++k) part[k] += pr[j + k] * dr[j + k];
    float rest = 0.0f;
    for (; j < n; ++j) rest += pr[j] * dr[j];
    const float dot = ((part[0] + part[1]) + (part[2] + part[3])) +
                      ((part[4] + part[5]) + (part[6] + part[7])) + rest;
    for (j = 0; j < n; ++j) store(out + j, pr[j] * (dr[j] - dot));
    for (; j < T; ++j) store(out + j, 0.0f);
  }
}

}  // namespace

COHORT_CLONES_AVX512
void causal_softmax_backward(const float* p, const float* dp, float* ds, std::int64_t mats,
                             std::int64_t T) {
  backward_rows(p, dp, ds, mats, T);
}

COHORT_CLONES_AVX512
void causal_softmax_backward(const float* p, const float* dp, bf16* ds, std::int64_t mats,
                             std::int64_t T) {
  backward_rows(p, dp, ds, mats, T);
}

}  // namespace cohort::nn
