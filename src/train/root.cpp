// The root's sweeps; see include/cohort/train/root.hpp. The optimizer is optim::Optimizer::apply,
// the sum reduce::sum_sources (the reducers' own kernel and order), the checks optim's.
#include "cohort/train/root.hpp"

#include <omp.h>

#include <algorithm>

#include "batch_grads.hpp"
#include "cohort/core/cpu.hpp"
#include "cohort/core/error.hpp"
#include "cohort/optim/gradient.hpp"
#include "cohort/reduce/kernels.hpp"
#include "time_account.hpp"
#include "trace.hpp"

namespace cohort::train {

namespace {
thread_local bool t_inside_reducer_call = false;

// This thread's chunk buffer for batch weight gradients: reused chunk after chunk, so it stays
// in L2 and its writes cost no reads from memory. Per thread, not per chunk or arena slot, so any
// thread may run a root chunk (TBB's, the parameter server's, a test's).
float* thread_buffer(std::size_t floats) {
  thread_local AlignedBuffer<float> buffer;
  if (buffer.size() < floats) buffer = AlignedBuffer<float>(floats);
  return buffer.data();
}

float* at(float* p, std::size_t i) { return p ? p + i : nullptr; }
}  // namespace

ReducerCall::ReducerCall() { t_inside_reducer_call = true; }
ReducerCall::~ReducerCall() { t_inside_reducer_call = false; }

Root::Root(const optim::Optimizer& optimizer, float* weights, bf16* weights16, float* state0,
           float* state1, std::size_t n, std::size_t chunk, Mode mode, const BatchGrads* batch,
           Tracer* tracer)
    : optimizer_(optimizer),
      weights_(weights),
      weights16_(weights16),
      state0_(state0),
      state1_(state1),
      n_(n),
      chunk_(chunk),
      mode_(mode),
      batch_(batch),
      tracer_(tracer),
      stats_((n + chunk - 1) / chunk) {
  COHORT_CHECK(chunk > 0 && chunk % kBlock == 0, "root chunk: a multiple of the block");
  // Written chunk by chunk before it is read, and only where the root sums several sources
  // (one source, e.g. a LeafChain's sum, is read where it is).
  if (mode_ == Mode::kTwoPhase)
    grad_sum_ = AlignedBuffer<float>(n, AlignedBuffer<float>::Uninitialized{});
}

namespace {
// The bf16 copy of a block the optimizer has just written (still in L1), at AVX-512's width where
// the CPU has it.
COHORT_CLONES_AVX512
void copy_to_bf16(const float* w, bf16* w16, std::size_t count) { to_bf16(w, w16, count); }
}  // namespace

void Root::apply(const optim::StepScalars& scalars, std::size_t b, const float* g,
                 std::size_t count) const {
  if (no_decay_.empty()) {
    optimizer_.apply(scalars, weights_ + b, g, at(state0_, b), at(state1_, b), count);
  } else {
    // The block in runs that decay or not, split at the no-decay ranges' bounds.
    const std::size_t end = b + count;
    auto range = std::upper_bound(no_decay_.begin(), no_decay_.end(), b,
                                  [](std::size_t i, const auto& r) { return i < r.second; });
    for (std::size_t pos = b; pos < end;) {
      optim::StepScalars run = scalars;
      std::size_t next = end;
      if (range != no_decay_.end() && range->first <= pos) {
        run.decay = false;
        next = std::min(end, range->second);
        ++range;
      } else if (range != no_decay_.end()) {
        next = std::min(end, range->first);
      }
      optimizer_.apply(run, weights_ + pos, g + (pos - b), at(state0_, pos), at(state1_, pos),
                       next - pos);
      pos = next;
    }
  }
  if (weights16_) copy_to_bf16(weights_ + b, weights16_ + b, count);
}

void Root::begin_step(const optim::StepScalars& scalars, std::size_t rows,
                      const void* staged_input) {
  scalars_ = scalars;
  rows_ = rows;
  staged_input_ = staged_input;
  for (ChunkStats& s : stats_) s = ChunkStats{.first_bad = n_};
}

reduce::Sink Root::sink() {
  if (mode_ == Mode::kTwoPhase) return reduce::Sink::fused(summed_call_);
  return reduce::Sink::fused(fused_call_);
}

// Batch weight gradients: the chunk's whole summed gradient into `out` (end - begin floats), with
// this thread's buffer as the GEMMs' scratch for rows cut by the chunk's ends; or, with `out`
// null, into this thread's buffer. Returns it. With `apply` (the fused sweep), each piece is
// instead checked and applied as soon as it is computed: a weight's rows straight from the
// row-pair kernel, which meanwhile prefetches the next rows of the weights, their bf16 copy and
// the state (BatchGrads::Consumer); returns null.
const float* Root::batch_gradient(const float* const* sources, std::size_t k, std::size_t begin,
                                  std::size_t end, float* out, ChunkStats& stats, bool apply) {
  // The GEMMs run on this thread's OpenMP team, and a root chunk may run on a thread no task
  // body pinned (the parameter server's, a test's): unpinned, oneDNN ran them on every core,
  // oversubscribed, and on AVX2 with other bits (its sgemm split the sum over the threads).
  omp_set_num_threads(1);
  float* scratch = thread_buffer(chunk_ + batch_->scratch_floats(chunk_));
  if (out == nullptr) out = scratch;
  auto take = [this](const float* g, std::size_t a, std::size_t b) {
    return apply_checked(g, a, b);
  };
  const BatchGrads::Consumer consumer{take,
                                      {{{weights_, sizeof(float)},
                                        {weights16_, sizeof(bf16)},
                                        {state0_, sizeof(float)},
                                        {state1_, sizeof(float)}}}};
  stats.gemm_seconds = batch_->gradient(sources, k, begin, end, rows_, staged_input_, out,
                                        scratch + chunk_, apply ? &consumer : nullptr);
  return apply ? nullptr : out;
}

bool Root::apply_checked(const float* g, std::size_t begin, std::size_t end) {
  ChunkStats& stats = stats_[begin / chunk_];
  for (std::size_t b = begin; b < end; b += kBlock) {
    const std::size_t count = std::min(kBlock, end - b);
    const float* block = g + (b - begin);
    if (const std::size_t i = optim::first_non_finite(block, count); i != count) {
      stats.first_bad = b + i;
      return false;
    }
    apply(scalars_, b, block, count);
  }
  return true;
}

void Root::fused_chunk(const float* const* sources, std::size_t k, std::size_t begin,
                       std::size_t end) {
  ChunkStats& stats = stats_[begin / chunk_];
  stats.begin = Clock::now();
  stats.inside_reducer_call = t_inside_reducer_call;
  if (batch_ != nullptr) {
    batch_gradient(sources, k, begin, end, nullptr, stats, true);
  } else if (k == 1) {
    apply_checked(sources[0] + begin, begin, end);
  } else {
    // Add the sources left to right block by block into L1 and apply from there: one read of
    // each source, one read-modify-write of the weights and each state array, no N-sized sum.
    alignas(kCacheLine) float block[kBlock];
    const float* src[reduce::kMaxArity];
    for (std::size_t b = begin; b < end; b += kBlock) {
      const std::size_t count = std::min(kBlock, end - b);
      for (std::size_t j = 0; j < k; ++j) src[j] = sources[j] + b;
      reduce::sum_sources(block, src, k, count);
      if (const std::size_t i = optim::first_non_finite(block, count); i != count) {
        stats.first_bad = b + i;
        break;
      }
      apply(scalars_, b, block, count);
    }
  }
  bf16_written(begin, end);
  if (tracer_) tracer_->root_span("sum+optimizer", begin / chunk_, stats.begin);
  stats.end = Clock::now();
}

void Root::summed_chunk(const float* const* sources, std::size_t k, std::size_t begin,
                        std::size_t end) {
  ChunkStats& stats = stats_[begin / chunk_];
  stats.begin = Clock::now();
  stats.inside_reducer_call = t_inside_reducer_call;
  float* sum = grad_sum_.data() + begin;
  const float* g = sum;
  if (batch_ != nullptr) {
    batch_gradient(sources, k, begin, end, sum, stats, false);
  } else if (k == 1) {
    g = sources[0] + begin;  // the reducer's own result (or the only leaf): valid until next step
  } else {
    const float* src[reduce::kMaxArity];
    for (std::size_t j = 0; j < k; ++j) src[j] = sources[j] + begin;
    reduce::sum_sources(sum, src, k, end - begin);
  }
  const std::size_t bad = optim::first_non_finite(g, end - begin);
  if (bad != end - begin) stats.first_bad = begin + bad;
  stats.sum_squares = optim::sum_squares(g, end - begin);
  stats.grad = g;
  if (tracer_) tracer_->root_span("sum", begin / chunk_, stats.begin);
  stats.end = Clock::now();
}

std::size_t Root::first_non_finite() const {
  std::size_t first = n_;
  for (const ChunkStats& s : stats_) first = std::min(first, s.first_bad);
  return first;
}

double Root::sum_squares() const {
  double total = 0;
  for (const ChunkStats& s : stats_) total += s.sum_squares;
  return total;
}

void Root::import_chunk(std::size_t c, std::size_t first_bad, double sum_squares) {
  stats_.at(c).first_bad = first_bad;
  stats_[c].sum_squares = sum_squares;
}

void Root::apply_summed(const optim::StepScalars& scalars, reduce::Executor& executor) {
  apply_summed(scalars, executor, 0, stats_.size());
}

void Root::apply_summed(const optim::StepScalars& scalars, reduce::Executor& executor,
                        std::size_t first, std::size_t last) {
  executor.parallel_for(last - first, [&, first](std::size_t i) {
    const std::size_t c = first + i;
    const auto t0 = Clock::now();
    const std::size_t begin = c * chunk_, end = std::min(n_, begin + chunk_);
    COHORT_CHECK(stats_[c].grad != nullptr, "second phase: a chunk was never summed");
    for (std::size_t b = begin; b < end; b += kBlock)
      apply(scalars, b, stats_[c].grad + (b - begin), std::min(kBlock, end - b));
    bf16_written(begin, end);
    if (tracer_) tracer_->root_span("optimizer", c, t0);
    stats_[c].apply_seconds = seconds_since(t0);
  });
}

}  // namespace cohort::train
