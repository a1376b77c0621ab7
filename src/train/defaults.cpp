// The default leaf size: defaults.hpp.
#include "defaults.hpp"

#include <algorithm>

namespace cohort::train {

std::size_t balanced_leaf(std::size_t batch, std::size_t cap) {
  const std::size_t leaves = (batch + cap - 1) / std::max<std::size_t>(cap, 1);
  return (batch + leaves - 1) / std::max<std::size_t>(leaves, 1);
}

std::size_t default_micro_batch(const nn::Model& model, std::size_t batch,
                                nn::Precision precision) {
  if (batch == 0) return 0;
  const nn::LeafRule rule = model.kind().leaf_rule(precision);
  return rule.exact ? std::min(batch, rule.cap) : balanced_leaf(batch, rule.cap);
}

}  // namespace cohort::train
