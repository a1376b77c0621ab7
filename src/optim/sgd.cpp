// SGD update on a flat range: one read of g, one read-modify-write of w and v per element.
#include "cohort/optim/sgd.hpp"

#include <cmath>
#include <sstream>

#include "cohort/core/error.hpp"

namespace cohort::optim {

namespace {
void require(bool ok, const char* field, const char* expected, float found) {
  if (ok) return;
  std::ostringstream msg;
  msg << "optimizer: " << field << ": expected " << expected << ", found " << found;
  throw InputError(msg.str());
}
}  // namespace

void validate(const SgdConfig& c) {
  require(std::isfinite(c.lr) && c.lr > 0, "lr", "a finite value > 0", c.lr);
  require(std::isfinite(c.momentum) && c.momentum >= 0 && c.momentum < 1, "momentum",
          "a value in [0, 1)", c.momentum);
  require(std::isfinite(c.weight_decay) && c.weight_decay >= 0, "weight-decay",
          "a finite value >= 0", c.weight_decay);
  if (c.nesterov) require(c.momentum > 0, "nesterov", "momentum > 0", c.momentum);
}

void Sgd::apply(float* __restrict w, const float* __restrict g, float* __restrict v,
                std::size_t count, float lr, float grad_scale) const {
  const float mu = config_.momentum;
  const float wd = config_.weight_decay;
  if (mu == 0.0f) {
    for (std::size_t i = 0; i < count; ++i) w[i] -= lr * (grad_scale * g[i] + wd * w[i]);
    return;
  }
  if (config_.nesterov) {
    for (std::size_t i = 0; i < count; ++i) {
      float d = grad_scale * g[i] + wd * w[i];
      float vi = mu * v[i] + d;
      v[i] = vi;
      w[i] -= lr * (d + mu * vi);
    }
    return;
  }
  for (std::size_t i = 0; i < count; ++i) {
    float d = grad_scale * g[i] + wd * w[i];
    float vi = mu * v[i] + d;
    v[i] = vi;
    w[i] -= lr * vi;
  }
}

}  // namespace cohort::optim
