// Optimizers on one contiguous range of the flat parameter array, so the reduction's root can
// fuse them chunk by chunk: SGD (momentum, Nesterov, L2 weight decay), Adam (L2 weight decay)
// and AdamW (decoupled weight decay), each with PyTorch's torch.optim semantics. Not a
// scheduler: the caller passes the step's learning rate (see schedule.hpp).
//
// Thread-safety: apply() on disjoint ranges may run concurrently; it touches only those ranges.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "cohort/core/names.hpp"

namespace cohort::optim {

enum class Kind { kSgd, kAdam, kAdamW };
inline constexpr Named<Kind> kKindNames[] = {
    {Kind::kSgd, "sgd"}, {Kind::kAdam, "adam"}, {Kind::kAdamW, "adamw"}};

// kKindNames <-> Kind; parse throws InputError naming `flag`.
Kind parse_kind(const std::string& name, const std::string& flag = "--optimizer");
const char* to_string(Kind kind);

// The defaults are `cohort train`'s recipe (with ScheduleConfig's): SGD, momentum 0.9, lr 0.1.
struct OptimizerConfig {
  Kind kind = Kind::kSgd;
  float lr = 0.1f;            // the base learning rate; the schedule scales it per step
  float momentum = 0.9f;      // SGD only
  bool nesterov = false;      // SGD only
  float weight_decay = 0.0f;  // SGD, Adam: L2 added to the gradient; AdamW: decoupled
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;  // Adam, AdamW
};

// Throws InputError naming the flag, expected and found value, e.g. "--momentum: expected a
// value in [0, 1), found 2".
void validate(const OptimizerConfig& config);

// What one step needs besides the config, computed once per step (not per chunk).
struct StepScalars {
  float lr = 0;              // this step's learning rate
  float grad_scale = 1;      // turns the summed gradient into the one to apply (1/B, times a clip)
  float step_size = 0;       // Adam: lr / (1 - beta1^t)
  float inv_sqrt_bias2 = 1;  // Adam: 1 / sqrt(1 - beta2^t)
  bool decay = true;         // false: no weight decay on this range (--no-decay-norm-bias)
};

class Optimizer {
 public:
  explicit Optimizer(OptimizerConfig config);

  const OptimizerConfig& config() const { return config_; }
  // Per-parameter state arrays the optimizer keeps (each as large as the weights): SGD 1 with
  // momentum, else 0; Adam and AdamW 2 (first and second moment).
  std::size_t state_buffers() const;
  // `update` is the 1-based count of updates applied including this one (Adam's bias correction).
  StepScalars scalars(float lr, float grad_scale, std::uint64_t update) const;

  // One update of `count` elements; w, g, s0 and s1 point at the first element of the range.
  // g is the summed gradient (g * grad_scale is the one applied). s0/s1 are the state arrays
  // state_buffers() asks for (null otherwise). g must not alias w or the state.
  //   SGD:   d = grad_scale*g + wd*w;  s0 = momentum*s0 + d;  w -= lr*(nesterov ? d+momentum*s0 :
  //   s0) Adam:  d = grad_scale*g (+ wd*w);  s0 = b1*s0 + (1-b1)*d;  s1 = b2*s1 + (1-b2)*d*d;
  //          AdamW first scales w by (1 - lr*wd);  w -= step_size * s0 / (sqrt(s1)*inv_sqrt_bias2 +
  //          eps)
  void apply(const StepScalars& step, float* w, const float* g, float* s0, float* s1,
             std::size_t count) const;

 private:
  OptimizerConfig config_;
};

}  // namespace cohort::optim
