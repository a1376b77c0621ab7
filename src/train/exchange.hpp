// Exchange: where a step's leaf gradients go and how their sum reaches the root, behind one
// interface, so that one step reads the same for one process and for ranks (step.cpp):
// LocalExchange, one process's reduction tree (below), and ShardedStep, the ranks' sharded root
// (sharded.hpp).
//
// Thread-safety: the controller's thread only; the replicas reach the reducer alone.
#pragma once

#include <cstddef>
#include <map>
#include <memory>

#include "cohort/core/function_ref.hpp"
#include "cohort/dist/shard_plan.hpp"
#include "cohort/reduce/executor.hpp"
#include "cohort/reduce/reducer.hpp"
#include "cohort/train/root.hpp"
#include "leaf_chain.hpp"

namespace cohort::train {

class Exchange {
 public:
  virtual ~Exchange() = default;
  // A step of `rows` rows in `leaves` leaves, after Root::begin_step: readies the reduction and
  // returns the leaves this process computes.
  virtual dist::Range begin_step(std::size_t rows, std::size_t leaves) = 0;
  // The reducer the replicas contribute this step's leaves to, or null: the exchange reads the
  // leaves' gradient buffers itself in reduce().
  virtual reduce::Reducer* reducer() = 0;
  // Whether a replica out of leaves may stage the next step's rows (a rank's leaves are its share
  // of the batch: no).
  virtual bool stages_ahead() const = 0;
  // After the replicas: the leaves' sum reaches the root, which has run (fused) or summed
  // (two-phase) this process's chunks when it returns. `stop`: this process's stop request, for
  // stop_agreed. `meanwhile` may run while messages move (ranks: assembling the other ranks'
  // rows where this rank's chunks read the whole staged batch).
  virtual void reduce(reduce::Executor& executor, bool stop, FunctionRef<void()> meanwhile) = 0;
  // A replica or the reduction failed: the next step starts clean.
  virtual void abort() = 0;
  // The chunks whose optimizer this process runs in the two-phase root's second phase; after it,
  // share_weights sends their weights to every process.
  virtual dist::Range owned_chunks() const = 0;
  virtual void share_weights() = 0;
  // Completes the step's messages: the weights are the whole step's in every process. Returns the
  // seconds the controller spent exchanging this step.
  virtual double end_step() = 0;
  // Whether the run stops after this step: `requested` (this process's request) for one
  // process; for ranks, whether any rank's request reached the step's reduce().
  virtual bool stop_agreed(bool requested) const = 0;
};

// One process: the replicas contribute each leaf to a reducer (one per leaf count: a partial last
// batch has its own decomposition), or to a LeafChain whose one sum is the reducer's only leaf;
// the contribution that completes the tree runs the root.
class LocalExchange final : public Exchange {
 public:
  // `chain` may be null; it, the root and the executor outlive this.
  LocalExchange(reduce::Strategy strategy, std::size_t n, std::size_t workers, Root& root,
                reduce::Executor& executor, LeafChain* chain);
  dist::Range begin_step(std::size_t rows, std::size_t leaves) override;
  reduce::Reducer* reducer() override { return current_; }
  bool stages_ahead() const override { return true; }
  void reduce(reduce::Executor& executor, bool stop, FunctionRef<void()> meanwhile) override;
  void abort() override;
  dist::Range owned_chunks() const override { return {0, root_.chunks()}; }
  void share_weights() override {}
  double end_step() override { return 0; }
  bool stop_agreed(bool requested) const override { return requested; }

 private:
  // Arity: one flat root over all leaves, up to kMaxArity (binary trees are slower:
  // docs/reduce_results.md). Its workers are the replicas that get leaves (each calls finish).
  reduce::Reducer& reducer_for(std::size_t leaves);

  const reduce::Strategy strategy_;
  const std::size_t n_, workers_;
  Root& root_;
  reduce::Executor& executor_;
  LeafChain* const chain_;
  std::map<std::size_t, std::unique_ptr<reduce::Reducer>> reducers_;  // by leaf count
  reduce::Reducer* current_ = nullptr;
};

}  // namespace cohort::train
