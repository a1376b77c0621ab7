// The root sharded over the ranks of a multi-rank run (docs/architecture.md, "Past one machine").
// Rank r computes a contiguous run of the step's leaves (dist::ShardPlan) and owns a contiguous
// run of the root's chunks and their optimizer state (ZeRO-1). Per step each owner receives
// exactly what one process's root would read for its chunks — every other rank's leaves' slices
// of them (ranges summed from leaves) and, with batch weight gradients, the other ranks' rows of
// the linear layers it owns — runs the same Root on them in the same order, and sends the updated
// weights of each chunk group to every rank as soon as they are done. So every rank ends the step
// with the weights one process would have, bit for bit. Small per-rank results (leaf losses, the
// chunks' non-finite and norm statistics, a stop request) are all-gathered once per step.
//
// Thread-safety: the controller's thread only (it makes every dist::Comm call); the root's work
// runs on the executor's threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "batch_grads.hpp"
#include "cohort/core/function_ref.hpp"
#include "cohort/dist/comm.hpp"
#include "cohort/dist/shard_plan.hpp"
#include "cohort/reduce/tree_shape.hpp"
#include "cohort/tensor/buffer.hpp"
#include "cohort/train/root.hpp"
#include "exchange.hpp"

namespace cohort::train {

class Tracer;

class ShardedStep final : public Exchange {
 public:
  // The trainer's arrays: one gradient per leaf of a full batch (n floats each) and their losses,
  // the master weights, their bf16 copy (null: f32 run; the received weights' copy is written
  // when they arrive), and (may be null) the batch weight gradients' rows. All outlive this.
  ShardedStep(dist::Comm& comm, Root& root, std::size_t n,
              std::vector<AlignedBuffer<float>>& leaf_grads, std::vector<double>& leaf_loss,
              float* weights, bf16* weights16, BatchGrads* batch, std::size_t micro_batch,
              Tracer* tracer);

  // A step of `rows` rows (`leaves` leaves): fixes the plan and posts the receives of the other
  // ranks' leaf slices and rows (buffers no local replica touches). Returns this rank's leaves.
  dist::Range begin_step(std::size_t rows, std::size_t leaves) override;
  reduce::Reducer* reducer() override { return nullptr; }  // the leaves stay in their buffers
  bool stages_ahead() const override { return false; }
  void abort() override {}
  // After this rank's leaves are computed: sends its slices and rows to their owners, runs the
  // root (Root::sink's mode) on the owned chunks group by group as their inputs arrive (fused:
  // sending each group's weights at once), then all-gathers the leaf losses, the chunk
  // statistics (into Root::import_chunk) and `stop` (see stop_agreed).
  // `meanwhile` (the other ranks' rows assembled here) runs once the sends are posted, before
  // the first wait, where this rank's chunks read the whole staged batch (a first linear layer's
  // weight with batch weight gradients).
  void reduce(reduce::Executor& executor, bool stop, FunctionRef<void()> meanwhile) override;
  // Two-phase root, after Root::apply_summed on owned_chunks(): sends the owned weights.
  void share_weights() override;
  // Completes every message: the weights are the whole step's on every rank. Returns the
  // seconds this step's controller spent posting, waiting for and gathering messages.
  double end_step() override;

  dist::Range owned_chunks() const override { return owned_; }
  // Some rank asked to stop at this step (its request reached reduce()).
  bool stop_agreed(bool) const override { return stop_agreed_; }

 private:
  struct Group {  // a run of owned chunks whose root work and weights go out together
    dist::Range chunks;
    std::vector<dist::Comm::Handle> inputs;  // receives of slices for these chunks
  };
  dist::Range elements_of(dist::Range chunks) const;
  void post_slices(bool send);
  void post_rows(bool send);
  void run_group(reduce::Executor& executor, const Group& g);
  const float* const* root_sources(std::size_t begin, std::size_t end);
  void send_weights(dist::Range chunks);
  void post_weight_receives();
  void gather_stats(bool stop);

  dist::Comm& comm_;
  Root& root_;
  const std::size_t n_, chunk_, chunks_, ranks_, me_;
  std::vector<AlignedBuffer<float>>& leaf_grads_;
  std::vector<double>& leaf_loss_;
  float* const weights_;
  bf16* const weights16_;
  BatchGrads* const batch_;
  const std::size_t micro_batch_;
  Tracer* const tracer_;
  std::vector<dist::Range> summed_;  // ranges of the flat array summed from the leaves
  std::vector<BatchGrads::RowArray> rows_;
  // Per rank: its owned chunks, and their groups (the units of root work and weight messages).
  std::vector<dist::Range> owned_by_;
  std::vector<std::vector<dist::Range>> groups_by_;
  bool needs_staged_input_ = false;
  // This step:
  std::unique_ptr<dist::ShardPlan> plan_;
  std::size_t rows_in_step_ = 0;
  dist::Range mine_, owned_;
  std::vector<Group> groups_;
  std::vector<dist::Comm::Handle> row_inputs_;
  bool stop_agreed_ = false;
  bool weights_incoming_ = false;  // this step's weight receives are posted
  double exchange_seconds_ = 0;
  // Trees wider than one root (more than kMaxArity leaves): the internal nodes' sums.
  std::unique_ptr<reduce::TreeShape> shape_;
  std::vector<AlignedBuffer<float>> node_sums_;
  std::vector<const float*> sources_;
  std::vector<double> gathered_;
};

}  // namespace cohort::train
