// The roofline's floor for a layer list's linear layers (train/roofline.cpp): the plans give an
// inner product its weights plain, or in the layout oneDNN chooses (plans_choose_layout;
// docs/decisions.md, "Plain vs blocked layouts"), and either may be the faster, so the floor
// counts each at the faster of the two.
#pragma once

#include <cstdint>
#include <vector>

#include "cohort/nn/executor.hpp"
#include "cohort/nn/model.hpp"

namespace cohort::nn {

// One inner product of a leaf, timed alone on this thread (the best of several runs, after one
// that warms it): with plain weights, and with the weights (the weight gradient, for
// backward-weights) in the layout oneDNN chooses (format any).
struct LinearTiming {
  std::size_t layer = 0;  // its index in the model's layers
  enum class Pass { kForward, kBackwardData, kBackwardWeights } pass = Pass::kForward;
  double plain_seconds = 0, chosen_seconds = 0;
};

// Every inner product of a leaf of `rows` samples of a layer-list model in `precision`, as its
// plans run them: the forward (a ReLU after the layer as its post-op, a last layer writing f32
// logits), the backward-data of every layer but the model's first, and with `leaf_weight_grads`
// the backward-weights (f32 gradients). Empty for a model with no layer list. This thread must
// run OpenMP with one thread.
std::vector<LinearTiming> time_linear_layouts(const Model& model, Precision precision,
                                              std::int64_t rows, bool leaf_weight_grads);

// The rule for bf16 inner products' weights, by what oneDNN runs (never by timing: the weights'
// bits depend on it): the layout oneDNN chooses where it has native bf16 without AMX
// (`avx512_core_bf16`, where it was measured faster: docs/decisions.md, "Plain vs blocked
// layouts"); plain where it dispatches AMX or emulates bf16, where it was not measured.
// ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 on an AMX CPU takes the chosen layout.
constexpr bool choose_linear_layout(bool onednn_amx, bool native_bf16) {
  return native_bf16 && !onednn_amx;
}
// Whether this process's plans in `precision` give their inner products' forward and
// backward-data the weights in the layout oneDNN chooses (format any, copied into it) rather than
// plain: bf16 plans with blocked layouts, by the rule above (onednn_isa(), bf16_support()).
// Weight gradients stay plain.
bool plans_choose_layout(Precision precision, bool blocked_layouts);

// The timings' sums: on the plain weights, each at the faster of its two layouts, and each on the
// layout the plans give it (`plans_choose`: plans_choose_layout, backward-weights plain); run -
// best is what the faster layouts would save.
struct LinearTotals {
  double plain_seconds = 0, best_seconds = 0, run_seconds = 0;
};
LinearTotals linear_totals(const std::vector<LinearTiming>& timings, bool plans_choose);

}  // namespace cohort::nn
