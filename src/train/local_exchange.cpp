// One process's exchange: exchange.hpp.
#include <algorithm>

#include "exchange.hpp"

namespace cohort::train {

LocalExchange::LocalExchange(reduce::Strategy strategy, std::size_t n, std::size_t workers,
                             Root& root, reduce::Executor& executor, LeafChain* chain)
    : strategy_(strategy),
      n_(n),
      workers_(workers),
      root_(root),
      executor_(executor),
      chain_(chain) {}

reduce::Reducer& LocalExchange::reducer_for(std::size_t leaves) {
  auto& slot = reducers_[leaves];
  if (!slot)
    slot = reduce::make_reducer(strategy_,
                                {.n = n_,
                                 .leaves = leaves,
                                 .workers = std::min(workers_, leaves),
                                 .arity = std::clamp<std::size_t>(leaves, 2, reduce::kMaxArity),
                                 .chunk = root_.chunk()},
                                executor_);
  return *slot;
}

dist::Range LocalExchange::begin_step(std::size_t, std::size_t leaves) {
  // A chain hands the reducer one leaf: its sum of the step's leaves.
  current_ = &reducer_for(chain_ ? 1 : leaves);
  if (chain_) chain_->begin_step(leaves);
  current_->begin_step(root_.sink());
  return {0, leaves};
}

void LocalExchange::reduce(reduce::Executor&, bool, FunctionRef<void()>) {
  current_->wait_step();  // the parameter server: on its own thread
}

void LocalExchange::abort() {
  if (current_) current_->reset();  // the root never ran whole: it needs every leaf
}

}  // namespace cohort::train
