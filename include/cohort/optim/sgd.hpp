// SGD with momentum, Nesterov momentum and L2 weight decay, with PyTorch's torch.optim.SGD
// semantics (dampening 0), applied to one contiguous range of the flat parameter array so the
// reduction's root can fuse it chunk by chunk. Not a scheduler: the caller passes the step's lr.
//
// Thread-safety: apply() on disjoint ranges may run concurrently; it touches only those ranges.
#pragma once

#include <cstddef>

namespace cohort::optim {

struct SgdConfig {
  float lr = 0.05f;
  float momentum = 0.9f;
  float weight_decay = 0.0f;
  bool nesterov = false;
};

// Validates a config; throws InputError naming the field, e.g. "momentum: expected [0, 1), found
// 2".
void validate(const SgdConfig& config);

class Sgd {
 public:
  explicit Sgd(SgdConfig config) : config_(config) { validate(config_); }

  const SgdConfig& config() const { return config_; }

  // One update of `count` elements: w, g and v point at the first element of the range (offset
  // them into the flat arrays); g is the summed gradient and grad_scale turns it into a mean
  // (1 / batch). Per element, with d = grad_scale * g + weight_decay * w:
  //   v = momentum * v + d;   w -= lr * (nesterov ? d + momentum * v : v)
  // With momentum 0, v is not read or written (it may be null). g must not alias w or v.
  void apply(float* w, const float* g, float* v, std::size_t count, float lr,
             float grad_scale) const;

 private:
  SgdConfig config_;
};

}  // namespace cohort::optim
