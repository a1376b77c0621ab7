// Learning-rate schedules, computed in double and rounded once to float.
#include "cohort/optim/schedule.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <sstream>

#include "cohort/core/error.hpp"

namespace cohort::optim {

ScheduleKind parse_schedule(const std::string& name, const std::string& flag) {
  return parse_name(kScheduleNames, name, flag);
}

const char* to_string(ScheduleKind kind) { return name_of(kScheduleNames, kind).data(); }

void validate(const ScheduleConfig& c, float base_lr) {
  auto bad = [](const char* flag, const char* expected, double found) {
    std::ostringstream msg;
    msg << flag << ": expected " << expected << ", found " << found;
    throw InputError(msg.str());
  };
  if (c.kind == ScheduleKind::kStep) {
    if (c.step_every == 0) bad("--lr-step-every", "at least 1 update with --schedule step", 0);
    if (!(std::isfinite(c.gamma) && c.gamma > 0 && c.gamma <= 1))
      bad("--lr-gamma", "a value in (0, 1]", c.gamma);
  }
  if (!(std::isfinite(c.min_lr) && c.min_lr >= 0 && c.min_lr < base_lr))
    bad("--min-lr", "a value in [0, --lr)", c.min_lr);
  if (c.warmup_steps > (std::uint64_t{1} << 40)) bad("--warmup-steps", "at most 2^40", 0);
}

float scaled_base_lr(const ScheduleConfig& c, float lr, std::uint64_t batch) {
  if (c.scale_batch == 0) return lr;
  return static_cast<float>(static_cast<double>(lr) * static_cast<double>(batch) /
                            static_cast<double>(c.scale_batch));
}

float lr_at(const ScheduleConfig& c, float base_lr, std::uint64_t update,
            std::uint64_t total_updates) {
  const double base = base_lr;
  if (update < c.warmup_steps)
    return static_cast<float>(base * static_cast<double>(update + 1) /
                              static_cast<double>(c.warmup_steps));
  switch (c.kind) {
    case ScheduleKind::kConstant:
      return base_lr;
    case ScheduleKind::kStep:
      return static_cast<float>(base * std::pow(static_cast<double>(c.gamma),
                                                static_cast<double>(update / c.step_every)));
    case ScheduleKind::kCosine: {
      const double span = total_updates > c.warmup_steps
                              ? static_cast<double>(total_updates - c.warmup_steps)
                              : 1.0;
      const double p = std::clamp(static_cast<double>(update - c.warmup_steps) / span, 0.0, 1.0);
      const double lo = c.min_lr;
      return static_cast<float>(lo + (base - lo) * 0.5 * (1.0 + std::cos(std::numbers::pi * p)));
    }
  }
  return base_lr;
}

}  // namespace cohort::optim
