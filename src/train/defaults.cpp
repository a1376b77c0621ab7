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
  if (rule.exact) return std::min(batch, rule.cap);
  const std::size_t min_leaves = std::max<std::size_t>(rule.min_leaves, 1);
  return balanced_leaf(batch, std::min(rule.cap, (batch + min_leaves - 1) / min_leaves));
}

}  // namespace cohort::train
