// The root of the reduction: where a step's summed gradient meets the optimizer. The reducer hands
// the root its sources chunk by chunk (reduce::Sink::fused); the root sums them block by block,
// checks for non-finite values and applies the optimizer to the master weights in one sweep
// (fused), or first sums and measures every chunk and applies only once the whole gradient is
// known to be finite and its norm is known (two-phase: --clip-norm, --on-nonfinite skip). With
// batch weight gradients it computes linear layers' gradients per chunk right before applying
// them. Not a reducer and not a scheduler: it never sees leaves or threads, only chunks.
//
// Thread-safety: the chunk callbacks (fused_chunk, summed_chunk, the sink's) may run concurrently
// on any threads, each on its own chunk of the grid [c * chunk, min(n, (c + 1) * chunk)); the rest
// is for one thread between steps. Per-chunk results live in one cache-line-aligned ChunkStats per
// chunk (disjoint writers); the caller reads them after the reducer's step completion, which
// orders them (its release/acquire).
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "cohort/optim/optimizer.hpp"
#include "cohort/reduce/executor.hpp"
#include "cohort/reduce/reducer.hpp"
#include "cohort/tensor/bf16.hpp"
#include "cohort/tensor/buffer.hpp"

namespace cohort::train {

class BatchGrads;
class Tracer;
using TimePoint = std::chrono::steady_clock::time_point;

// One root chunk's results in a step, written only by the thread that ran the chunk.
struct alignas(kCacheLine) ChunkStats {
  TimePoint begin{}, end{};          // when the chunk's root work ran (begin == end: not run)
  double gemm_seconds = 0;           // batch weight gradients' GEMMs within it
  std::size_t first_bad = 0;         // first non-finite element of the summed gradient, or n (none)
  double sum_squares = 0;            // two-phase: of the chunk's summed gradient
  const float* grad = nullptr;       // two-phase: the chunk's summed gradient (offset to its begin)
  double apply_seconds = 0;          // two-phase: the second phase's optimizer over the chunk
  bool inside_reducer_call = false;  // ran inside a replica's contribute/finish (see ReducerCall)
};

// Marks the calling thread as inside a replica's reducer call for its lifetime, so root chunks it
// runs are accounted to that replica (TimeAccount).
class ReducerCall {
 public:
  ReducerCall();
  ~ReducerCall();
  ReducerCall(const ReducerCall&) = delete;
  ReducerCall& operator=(const ReducerCall&) = delete;
};

class Root {
 public:
  Root(const Root&) = delete;
  Root& operator=(const Root&) = delete;
  // Floats per block of the fused sweep: the summed block (4 KiB) stays in L1 for the optimizer.
  static constexpr std::size_t kBlock = 1024;
  enum class Mode { kFused, kTwoPhase };

  // The master weights and the optimizer's state arrays (null where the optimizer keeps none), n
  // floats each; all must outlive the root. `weights16` (may be null): the bf16 copy of the
  // weights the replicas read (--precision bf16), written block by block right after the
  // optimizer, from L1, in the same sweep. `chunk` is the reducer's chunk. `batch` (may be
  // null): batch weight gradients of linear layers; `tracer` (may be null): root spans.
  Root(const optim::Optimizer& optimizer, float* weights, bf16* weights16, float* state0,
       float* state1, std::size_t n, std::size_t chunk, Mode mode,
       const BatchGrads* batch = nullptr, Tracer* tracer = nullptr);

  Mode mode() const { return mode_; }
  // Ranges [begin, end) of the weights the optimizer applies no weight decay to (sorted,
  // disjoint; --no-decay-norm-bias). Call before the first step.
  void set_no_decay(std::vector<std::pair<std::size_t, std::size_t>> ranges) {
    no_decay_ = std::move(ranges);
  }
  std::size_t chunk() const { return chunk_; }
  // Told after elements [begin, end) of the bf16 copy were written: after each chunk's sweep (on
  // the thread that ran it, while the chunk is in its cache), and where bf16_written is called.
  // The trainer keeps its replicas' copies of the weights in oneDNN's layouts current with it
  // (nn::Net::keep_weight_copies). Call before the first step.
  void on_bf16_written(std::function<void(std::size_t, std::size_t)> f) {
    bf16_written_ = std::move(f);
  }
  // Tells on_bf16_written's callable that [begin, end) of the bf16 copy was written elsewhere
  // (the whole copy made from the master weights, another rank's chunks).
  void bf16_written(std::size_t begin, std::size_t end) const {
    if (weights16_ && bf16_written_) bf16_written_(begin, end);
  }

  // Before a step: the scalars the fused sweep applies (grad_scale = 1 / rows), and with batch
  // weight gradients the batch's row count and its staged input (rows, features).
  void begin_step(const optim::StepScalars& scalars, std::size_t rows = 0,
                  const void* staged_input = nullptr);
  // The reducer's sink for this root's mode; valid as long as the root (the root must not move).
  reduce::Sink sink();

  // Fused: the sum of sources [begin, end), checked block by block and applied. A non-finite
  // block is not applied and ends the chunk (first_bad says where).
  void fused_chunk(const float* const* sources, std::size_t k, std::size_t begin, std::size_t end);
  // Two-phase, first phase: the sum (kept), its first non-finite element and sum of squares.
  void summed_chunk(const float* const* sources, std::size_t k, std::size_t begin, std::size_t end);
  // The common tail of the fused sweep: checks and applies the summed gradient g (of chunk
  // [begin, end), offset to begin) block by block. Returns false at the first non-finite block.
  bool apply_checked(const float* g, std::size_t begin, std::size_t end);

  // After the step (the reducer's completion observed):
  std::span<const ChunkStats> stats() const { return stats_; }
  // The first non-finite element of the step's summed gradient over all chunks, or n.
  std::size_t first_non_finite() const;
  // Two-phase: the squared L2 norm of the summed gradient (chunk sums added in chunk order, so
  // it does not depend on threads), and the second phase: the optimizer with `scalars` over
  // every chunk's kept sum, chunk-parallel through `executor`.
  double sum_squares() const;
  void apply_summed(const optim::StepScalars& scalars, reduce::Executor& executor);
  // The same on chunks [first, last) only (a rank's owned chunks, src/train/sharded.hpp).
  void apply_summed(const optim::StepScalars& scalars, reduce::Executor& executor,
                    std::size_t first, std::size_t last);
  // Another rank ran chunk c this step: its first non-finite element (or n) and sum of squares,
  // for first_non_finite() and sum_squares().
  void import_chunk(std::size_t c, std::size_t first_bad, double sum_squares);
  std::size_t chunks() const { return stats_.size(); }

 private:
  // (apply: each piece of the gradient is applied as it is computed; returns null.)
  const float* batch_gradient(const float* const* sources, std::size_t k, std::size_t begin,
                              std::size_t end, float* out, ChunkStats& stats, bool apply);

  // The sink's callables: members, so the reducer's FunctionRef to them stays valid.
  struct FusedCall {
    Root* root;
    void operator()(const float* const* s, std::size_t k, std::size_t b, std::size_t e) const {
      root->fused_chunk(s, k, b, e);
    }
  };
  struct SummedCall {
    Root* root;
    void operator()(const float* const* s, std::size_t k, std::size_t b, std::size_t e) const {
      root->summed_chunk(s, k, b, e);
    }
  };

  const optim::Optimizer& optimizer_;
  // The optimizer on [b, b + count) with gradient g, then the block's bf16 copy.
  void apply(const optim::StepScalars& scalars, std::size_t b, const float* g,
             std::size_t count) const;

  float* const weights_;
  bf16* const weights16_;
  std::function<void(std::size_t, std::size_t)> bf16_written_;
  std::vector<std::pair<std::size_t, std::size_t>> no_decay_;
  float* const state0_;
  float* const state1_;
  const std::size_t n_, chunk_;
  const Mode mode_;
  const BatchGrads* const batch_;
  Tracer* const tracer_;
  optim::StepScalars scalars_{};
  std::size_t rows_ = 0;
  const void* staged_input_ = nullptr;
  AlignedBuffer<float> grad_sum_;  // two-phase: the summed gradient
  std::vector<ChunkStats> stats_;
  FusedCall fused_call_{this};
  SummedCall summed_call_{this};
};

}  // namespace cohort::train
