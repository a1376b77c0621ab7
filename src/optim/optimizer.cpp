// The update loops: one read of g and one read-modify-write of w and of each state array per
// element, in one pass, so the fused root streams each array once.
#include "cohort/optim/optimizer.hpp"

#include <cmath>
#include <sstream>

#include "cohort/core/cpu.hpp"
#include "cohort/core/error.hpp"

namespace cohort::optim {

namespace {
void require(bool ok, const char* flag, const char* expected, float found) {
  if (ok) return;
  std::ostringstream msg;
  msg << flag << ": expected " << expected << ", found " << found;
  throw InputError(msg.str());
}
}  // namespace

Kind parse_kind(const std::string& name, const std::string& flag) {
  return parse_name(kKindNames, name, flag);
}

const char* to_string(Kind kind) { return name_of(kKindNames, kind).data(); }

void validate(const OptimizerConfig& c) {
  require(std::isfinite(c.lr) && c.lr > 0, "--lr", "a finite value > 0", c.lr);
  require(std::isfinite(c.weight_decay) && c.weight_decay >= 0, "--weight-decay",
          "a finite value >= 0", c.weight_decay);
  if (c.kind == Kind::kSgd) {
    require(std::isfinite(c.momentum) && c.momentum >= 0 && c.momentum < 1, "--momentum",
            "a value in [0, 1)", c.momentum);
    if (c.nesterov) require(c.momentum > 0, "--nesterov", "--momentum > 0", c.momentum);
    return;
  }
  require(std::isfinite(c.beta1) && c.beta1 >= 0 && c.beta1 < 1, "--beta1", "a value in [0, 1)",
          c.beta1);
  require(std::isfinite(c.beta2) && c.beta2 >= 0 && c.beta2 < 1, "--beta2", "a value in [0, 1)",
          c.beta2);
  require(std::isfinite(c.eps) && c.eps > 0, "--eps", "a finite value > 0", c.eps);
}

Optimizer::Optimizer(OptimizerConfig config) : config_(config) { validate(config_); }

std::size_t Optimizer::state_buffers() const {
  if (config_.kind != Kind::kSgd) return 2;
  return config_.momentum != 0.0f ? 1 : 0;
}

StepScalars Optimizer::scalars(float lr, float grad_scale, std::uint64_t update) const {
  StepScalars s{.lr = lr, .grad_scale = grad_scale};
  if (config_.kind != Kind::kSgd) {
    // In double, as PyTorch computes these Python floats; t >= 1.
    const double t = static_cast<double>(update);
    const double bias1 = 1.0 - std::pow(static_cast<double>(config_.beta1), t);
    const double bias2 = 1.0 - std::pow(static_cast<double>(config_.beta2), t);
    s.step_size = static_cast<float>(lr / bias1);
    s.inv_sqrt_bias2 = static_cast<float>(1.0 / std::sqrt(bias2));
  }
  return s;
}

namespace {
// A state value below the smallest normal float (1.2e-38) becomes 0. A parameter whose gradient
// stays 0 (a border pixel's weight, a dead unit) has its momentum decay geometrically into the
// subnormal range after several hundred steps, where every multiply takes a microcode assist and
// the sweep slows several times over (docs/decisions.md, "Subnormal optimizer state flushed to
// 0", and its command). The flush is a compare and a blend,
// the same on every thread and CPU, so it keeps every result reproducible; it departs from
// torch.optim only below 1.2e-38.
inline float flush_subnormal(float x) { return std::fabs(x) < 1.17549435e-38f ? 0.0f : x; }
}  // namespace

COHORT_CLONES_AVX512
void Optimizer::apply(const StepScalars& step, float* __restrict w, const float* __restrict g,
                      float* __restrict s0, float* __restrict s1, std::size_t count) const {
  const float lr = step.lr, gs = step.grad_scale, wd = step.decay ? config_.weight_decay : 0.0f;
  if (config_.kind != Kind::kSgd) {
    const float b1 = config_.beta1, b2 = config_.beta2, eps = config_.eps;
    const float step_size = step.step_size, ib2 = step.inv_sqrt_bias2;
    const float l2 = config_.kind == Kind::kAdam ? wd : 0.0f;
    const float shrink = config_.kind == Kind::kAdamW ? 1.0f - lr * wd : 1.0f;
    for (std::size_t i = 0; i < count; ++i) {
      const float wi = w[i] * shrink;
      const float d = gs * g[i] + l2 * w[i];
      const float m = flush_subnormal(b1 * s0[i] + (1.0f - b1) * d);
      const float v = flush_subnormal(b2 * s1[i] + (1.0f - b2) * d * d);
      s0[i] = m;
      s1[i] = v;
      w[i] = wi - step_size * m / (std::sqrt(v) * ib2 + eps);
    }
    return;
  }
  const float mu = config_.momentum;
  if (mu == 0.0f) {
    for (std::size_t i = 0; i < count; ++i) w[i] -= lr * (gs * g[i] + wd * w[i]);
    return;
  }
  if (config_.nesterov) {
    for (std::size_t i = 0; i < count; ++i) {
      const float d = gs * g[i] + wd * w[i];
      const float vi = flush_subnormal(mu * s0[i] + d);
      s0[i] = vi;
      w[i] -= lr * (d + mu * vi);
    }
    return;
  }
  for (std::size_t i = 0; i < count; ++i) {
    const float d = gs * g[i] + wd * w[i];
    const float vi = flush_subnormal(mu * s0[i] + d);
    s0[i] = vi;
    w[i] -= lr * vi;
  }
}

}  // namespace cohort::optim
