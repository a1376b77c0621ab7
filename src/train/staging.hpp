// The staged batch: the step's rows assembled from the training set (pixels / 255, augmented if
// asked) into (B, features) floats, and their bf16 copy in a bf16 run, with their labels — what
// the replicas' Nets and the root's batch weight gradients read.
//
// Two sets of buffers, one per step parity: the root reads step s's staged input (a first linear
// layer's batch weight gradient) until step s ends, while a replica that has no leaf left in step
// s and would wait for the last leaf assembles rows of step s + 1 into the other set, a piece of
// kPiece rows at a time (`stage_ahead`), until the last leaf is in. Step s + 1 then finds those
// rows staged. Rows depend on (sample id, epoch) only, so who assembles them and when never
// changes a bit.
//
// Thread-safety: begin_step and the accessors between steps, on the controller. During a step,
// replicas call stage (disjoint rows) and stage_ahead (claims pieces of the next step through an
// atomic counter) concurrently; a piece staged ahead is read in the next step, after the step
// graph's end and start, which order the two.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "cohort/data/augment.hpp"
#include "cohort/data/dataset.hpp"
#include "cohort/tensor/bf16.hpp"
#include "cohort/tensor/buffer.hpp"

namespace cohort::train {

class Staging {
 public:
  // Rows staged ahead at a time: few, so that a replica staging ahead is soon free for the root
  // once the last leaf is in (16 Fashion-MNIST rows take microseconds: bench/data_bench).
  static constexpr std::size_t kPiece = 16;

  // `augmenter` (may be null) must outlive this object; leaves are `micro_batch` rows;
  // bf16_rows: the rows are kept in bf16 (rounded from the f32 values), not in f32.
  Staging(const data::Dataset& train, const data::Augmenter* augmenter, std::size_t batch,
          std::size_t micro_batch, bool bf16_rows);

  // A step's samples: its 1-based number, its epoch (keys augmentation) and ids. The ids must
  // stay valid, where they are, until the step after it has ended.
  struct Step {
    std::uint64_t number = 0;
    std::uint64_t epoch = 0;
    std::span<const std::uint32_t> ids;
  };
  // Before step `current`: `next` is the step after it (ids empty: none, or no staging ahead,
  // as with several ranks). Rows of `current` staged ahead in the step before are kept.
  void begin_step(const Step& current, const Step& next);

  // Rows [first, first + n) of the current step: those not staged ahead are assembled now.
  // Returns how many it assembled.
  std::size_t stage(std::size_t first, std::size_t n);
  // Assembles the next unclaimed piece of the next step into its buffers; false when none is
  // left (or there is no next step).
  bool stage_ahead();
  // Rows that their step found staged ahead, over this object's life.
  std::uint64_t rows_staged_ahead() const { return found_ahead_; }

  // The current step's staged rows: f32 (f32 rows only) and bf16 (bf16 rows only).
  const float* x() const { return set_[parity_].x.data(); }
  const bf16* x16() const { return set_[parity_].x16.data(); }
  const std::int32_t* y() const { return set_[parity_].y.data(); }
  bool bf16_rows() const { return bf16_; }
  // The staged input as the Nets and the batch gradients read it: bf16 rows in a bf16 run.
  const void* input() const {
    return bf16_ ? static_cast<const void*>(x16()) : static_cast<const void*>(x());
  }

 private:
  struct Buffers {
    AlignedBuffer<float> x;           // (B, features); f32 runs only
    AlignedBuffer<bf16> x16;          // bf16 runs: the rows, in bf16 only
    std::vector<std::int32_t> y;      // (B)
    Step ahead_of;                    // the step whose pieces `ready` marks
    std::vector<std::uint8_t> ready;  // per piece of each leaf: staged ahead for `ahead_of`
  };
  void assemble(Buffers& b, const Step& s, std::size_t first, std::size_t n) const;
  std::pair<std::size_t, std::size_t> piece(std::size_t l, std::size_t j, std::size_t rows) const;

  const data::Dataset& train_;
  const data::Augmenter* augmenter_;
  const std::size_t features_, micro_batch_, pieces_per_leaf_;
  const bool bf16_;
  Buffers set_[2];
  std::size_t parity_ = 0;  // set_[parity_]: the current step's
  Step current_, next_;
  std::size_t next_leaves_ = 0;
  std::atomic<std::size_t> next_claim_{0};
  std::atomic<std::uint64_t> found_ahead_{0};
};

}  // namespace cohort::train
