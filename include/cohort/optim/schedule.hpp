// Learning-rate schedules: constant, step decay or cosine decay, each after an optional linear
// warmup, as a pure function of the number of updates applied so far (a skipped step does not
// advance it). The linear scaling rule (Goyal et al., 2017) scales the base rate with the global
// batch. Not an optimizer: the result is the `lr` an Optimizer applies.
#pragma once

#include <cstdint>
#include <string>

#include "cohort/core/names.hpp"

namespace cohort::optim {

enum class ScheduleKind { kConstant, kStep, kCosine };
inline constexpr Named<ScheduleKind> kScheduleNames[] = {{ScheduleKind::kConstant, "constant"},
                                                         {ScheduleKind::kStep, "step"},
                                                         {ScheduleKind::kCosine, "cosine"}};

// kScheduleNames <-> ScheduleKind; parse throws InputError naming `flag`.
ScheduleKind parse_schedule(const std::string& name, const std::string& flag = "--schedule");
const char* to_string(ScheduleKind kind);

// The defaults are `cohort train`'s recipe: a linear warmup over 200 updates, then cosine decay
// to 0 over the run (docs/decisions.md, "Default recipe").
struct ScheduleConfig {
  ScheduleKind kind = ScheduleKind::kCosine;
  std::uint64_t warmup_steps = 200;  // lr rises linearly to the base over these updates
  std::uint64_t step_every = 0;      // step: multiply by gamma every this many updates (> 0)
  float gamma = 0.1f;                // step: the decay factor, in (0, 1]
  float min_lr = 0.0f;               // cosine: the rate reached at the last update, in [0, base)
  // Linear scaling rule: with scale_batch > 0 the base rate is lr * batch / scale_batch.
  std::uint64_t scale_batch = 0;
};

// Throws InputError naming the flag for values that cannot work with `base_lr`.
void validate(const ScheduleConfig& config, float base_lr);

// The base rate after the linear scaling rule (unchanged when scale_batch is 0).
float scaled_base_lr(const ScheduleConfig& config, float lr, std::uint64_t batch);

// The rate of update number `update` (0-based: updates applied before this one) in a run of
// `total_updates`:
//   warmup (update < warmup_steps):  base * (update + 1) / warmup_steps
//   constant:                        base
//   step:                            base * gamma^floor(update / step_every)
//   cosine:  min_lr + (base - min_lr) * (1 + cos(pi * p)) / 2,  p = (update - warmup) /
//            (total_updates - warmup), clamped to [0, 1] (PyTorch's CosineAnnealingLR with
//            T_max = the updates after warmup: the last update runs just above min_lr)
float lr_at(const ScheduleConfig& config, float base_lr, std::uint64_t update,
            std::uint64_t total_updates);

}  // namespace cohort::optim
