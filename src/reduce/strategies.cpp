// The comparison strategies: chunk-owner reduce-scatter, parameter server, atomic float add,
// mutex, and the serial oracle. They exist to be measured against the combining tree (and the
// serial one to be the tests' oracle); none is meant for the trainer's default path.
#include <mutex>
#include <thread>

#include "cohort/core/error.hpp"
#include "cohort/reduce/kernels.hpp"
#include "strategies.hpp"
#include "tree_eval.hpp"

namespace cohort::reduce::detail {
namespace {

// One leaf's gradient pointer per cache line: written by its contributor, read by the summer.
struct alignas(kCacheLine) LeafSlot {
  const float* grad = nullptr;
};

// Base of the strategies that collect leaf pointers and count arrivals.
//
// Memory ordering: a contributor stores its pointer (plain) and then increments leaves_arrived_
// with acq_rel (release publishes the pointer and the gradient; acquire chains the earlier
// arrivals, so whoever observes L sees every leaf). The counter is re-armed with a relaxed store by
// the thread that completes the step, before complete_step's release; the next step's arrivals
// are ordered after it by the controller's begin_step handoff.
class Collecting : public Reducer {
 public:
  Collecting(Strategy strategy, const ReducerConfig& config, Executor& executor)
      : Reducer(strategy, config, executor), slots_(new LeafSlot[config.leaves]) {
    pointers_.resize(config.leaves);
  }

  void reset() override {
    // relaxed: no contribution is in flight (this also clears kAborted).
    leaves_arrived_.store(0, std::memory_order_relaxed);
    Reducer::reset();
  }

  // Sets kAborted in the arrival count, so that no waiter ever sees L, and wakes the waiters.
  void abort_step() override {
    // relaxed: the bit carries no data; waiters only stop waiting.
    leaves_arrived_.fetch_or(kAborted, std::memory_order_relaxed);
    leaves_arrived_.notify_all();
  }

 protected:
  // In leaves_arrived_ beside the count (leaves < 2^30): the step was abandoned.
  static constexpr std::uint32_t kAborted = std::uint32_t{1} << 30;

  // Returns true if this was the last of the L arrivals (never after abort_step).
  bool arrive(std::size_t worker, std::size_t leaf, const float* grad) {
    check_contribution(worker, leaf);
    slots_[leaf].grad = grad;
    // acq_rel: see the class comment.
    const std::uint32_t before = leaves_arrived_.fetch_add(1, std::memory_order_acq_rel);
    if ((before & kAborted) != 0) return false;
    COHORT_CHECK(before < config_.leaves, "more contributions than leaves in one step");
    return before + 1 == config_.leaves;
  }
  // Gathers the leaf pointers (after the L-th arrival was acquired) into a dense array.
  const float* const* leaf_pointers() {
    for (std::size_t i = 0; i < config_.leaves; ++i) pointers_[i] = slots_[i].grad;
    return pointers_.data();
  }
  // Evaluates the tree over [0, N) on this thread, chunk by chunk, emitting each chunk.
  void evaluate_all(TreeEvaluator& evaluator) {
    const float* const* leaves = leaf_pointers();
    for (std::size_t begin = 0; begin < config_.n; begin += config_.chunk) {
      const std::size_t end = std::min(config_.n, begin + config_.chunk);
      evaluator.evaluate(leaves, begin, end, out_, scale_);
      emit(begin, end);
    }
  }

  std::unique_ptr<LeafSlot[]> slots_;
  std::vector<const float*> pointers_;  // used only by the thread that sums
  alignas(kCacheLine) std::atomic<std::uint32_t> leaves_arrived_{0};
};

// Serial reference: the last arrival evaluates the whole tree on its own thread.
class SerialReducer final : public Collecting {
 public:
  SerialReducer(const ReducerConfig& config, Executor& executor)
      : Collecting(Strategy::kSerial, config, executor), evaluator_(shape_) {}

  bool contribute(std::size_t worker, std::size_t leaf, const float* grad) override {
    if (!arrive(worker, leaf, grad)) return false;
    evaluate_all(evaluator_);
    // relaxed: re-arm; see the class comment of Collecting.
    leaves_arrived_.store(0, std::memory_order_relaxed);
    complete_step();
    return true;
  }

 private:
  TreeEvaluator evaluator_;
};

// Chunk-owner reduce-scatter: worker w owns a run of whole chunks of [0, N) (so its callbacks are
// on the chunk grid, as the contract says). finish(w) waits until all L leaves have arrived (the
// barrier), then evaluates the tree over its chunks only: reads L*N and writes N in total. Blocks,
// so every leaf must come from a thread that is not waiting in finish; abort_step releases it.
// Memory ordering: as Collecting; finished_workers_ counts slices with acq_rel so the last
// finisher sees every slice's writes before it completes the step and re-arms both counters.
class ChunkOwnerReducer final : public Collecting {
 public:
  ChunkOwnerReducer(const ReducerConfig& config, Executor& executor)
      : Collecting(Strategy::kChunkOwner, config, executor) {
    const std::size_t chunks = chunk_count();
    slice_ = (chunks + config_.workers - 1) / config_.workers * config_.chunk;  // whole chunks
    evaluators_.reserve(config_.workers);
    for (std::size_t w = 0; w < config_.workers; ++w) evaluators_.emplace_back(shape_);
    worker_pointers_.assign(config_.workers * config_.leaves, nullptr);
  }

  bool contribute(std::size_t worker, std::size_t leaf, const float* grad) override {
    if (arrive(worker, leaf, grad)) leaves_arrived_.notify_all();
    return false;
  }

  bool finish(std::size_t worker) override {
    COHORT_CHECK(worker < config_.workers, "finish: worker id out of range");
    // acquire: see every leaf pointer and gradient (the barrier).
    std::uint32_t arrived = leaves_arrived_.load(std::memory_order_acquire);
    while (arrived != config_.leaves && (arrived & kAborted) == 0)
      arrived = wait_while_equal(leaves_arrived_, arrived);
    if ((arrived & kAborted) != 0) return false;  // a leaf will never come: the step is abandoned
    const float** leaves = worker_pointers_.data() + worker * config_.leaves;
    for (std::size_t i = 0; i < config_.leaves; ++i) leaves[i] = slots_[i].grad;
    const std::size_t slice_begin = std::min(config_.n, worker * slice_);
    const std::size_t slice_end = std::min(config_.n, slice_begin + slice_);
    for (std::size_t begin = slice_begin; begin < slice_end; begin += config_.chunk) {
      const std::size_t end = std::min(slice_end, begin + config_.chunk);
      evaluators_[worker].evaluate(leaves, begin, end, out_, scale_);
      emit(begin, end);
    }
    // acq_rel: release publishes our slice; the last finisher acquires all slices.
    const std::uint32_t before = finished_workers_.fetch_add(1, std::memory_order_acq_rel);
    if (before + 1 != config_.workers) return false;
    // relaxed: every worker has passed the barrier; the next step is ordered by the handoff.
    leaves_arrived_.store(0, std::memory_order_relaxed);
    finished_workers_.store(0, std::memory_order_relaxed);  // relaxed: as above
    complete_step();
    return true;
  }

  void reset() override {
    finished_workers_.store(0, std::memory_order_relaxed);  // relaxed: nothing in flight
    Collecting::reset();
  }

 private:
  std::size_t slice_ = 0;                      // floats per worker: a whole number of chunks
  std::vector<TreeEvaluator> evaluators_;      // one per worker (block scratch)
  std::vector<const float*> worker_pointers_;  // W rows of L pointers, one row per worker
  alignas(kCacheLine) std::atomic<std::uint32_t> finished_workers_{0};
};

// Parameter server: a dedicated thread waits for all L leaves, then evaluates the tree alone and
// runs the sink's callbacks; an exception from them is kept for wait_step() (an exception must not
// leave this thread: it would end the process). An aborted step is never evaluated.
// Memory ordering: as Collecting; the server acquires leaves_arrived_ == L. Shutdown sets kStop in
// the same word (release) so the sleeping server wakes.
class ParameterServerReducer final : public Collecting {
 public:
  ParameterServerReducer(const ReducerConfig& config, Executor& executor)
      : Collecting(Strategy::kParameterServer, config, executor), evaluator_(shape_) {
    server_ = std::thread([this] { serve(); });
  }
  ~ParameterServerReducer() override {
    // release: the server, acquiring kStop, exits; no data rides on it.
    leaves_arrived_.fetch_or(kStop, std::memory_order_release);
    leaves_arrived_.notify_all();
    server_.join();
  }

  bool contribute(std::size_t worker, std::size_t leaf, const float* grad) override {
    if (arrive(worker, leaf, grad)) leaves_arrived_.notify_all();
    return false;  // the server completes the step
  }

 private:
  static constexpr std::uint32_t kStop = std::uint32_t{1} << 31;

  void serve() {
    for (;;) {
      // acquire: see every leaf pointer and gradient once all have arrived.
      std::uint32_t arrived = leaves_arrived_.load(std::memory_order_acquire);
      while (arrived != config_.leaves && (arrived & kStop) == 0) {
        arrived = wait_while_equal(leaves_arrived_, arrived);
      }
      if ((arrived & kStop) != 0) return;
      try {
        evaluate_all(evaluator_);
      } catch (...) {
        set_root_error(std::current_exception());  // published by complete_step's release
      }
      // relaxed: re-arm; the next step's arrivals are ordered after complete_step's release.
      leaves_arrived_.store(0, std::memory_order_relaxed);
      complete_step();
    }
  }

  TreeEvaluator evaluator_;
  std::thread server_;
};

// Finishes the order-dependent strategies: scale and emit, chunk-parallel through the executor.
void finalize_in_place(Reducer& reducer, float* out, float scale, std::size_t chunks,
                       std::size_t chunk, std::size_t n, Executor& executor,
                       FunctionRef<void(std::size_t, std::size_t)> emit_chunk) {
  if (scale == 1.0f && !emit_chunk) return;
  (void)reducer;
  auto body = [&](std::size_t c) {
    const std::size_t begin = c * chunk;
    const std::size_t end = std::min(n, begin + chunk);
    if (scale != 1.0f) scale_in_place(out + begin, end - begin, scale);
    if (emit_chunk) emit_chunk(begin, end);
  };
  if (chunks == 1) {
    body(0);
  } else if (chunks > 1) {
    executor.parallel_for(chunks, body);
  }
}

// Atomic accumulate: begin_step zeroes the result; every contribution adds each element with a
// compare-exchange loop; the last arrival scales and emits. Sum order = arrival order per element:
// NOT bitwise deterministic (tests compare against float64 with a tolerance).
// Memory ordering: the element adds are relaxed (only atomicity matters per element); each
// contribution then increments leaves_arrived_ with acq_rel, so the last arrival sees all adds.
class AtomicReducer final : public Collecting {
 public:
  AtomicReducer(const ReducerConfig& config, Executor& executor)
      : Collecting(Strategy::kAtomic, config, executor) {}

  bool contribute(std::size_t worker, std::size_t leaf, const float* grad) override {
    check_contribution(worker, leaf);
    float* out = out_;
    for (std::size_t i = 0; i < config_.n; ++i) {
      std::atomic_ref<float> element(out[i]);
      float current = element.load(std::memory_order_relaxed);  // relaxed: see class comment
      // relaxed: atomicity of this element is all the CAS must give; ordering rides on the counter.
      while (!element.compare_exchange_weak(current, current + grad[i], std::memory_order_relaxed,
                                            std::memory_order_relaxed)) {
      }
    }
    if (!arrive(worker, leaf, grad)) return false;
    finish_step();
    return true;
  }

 private:
  void on_begin_step() override {
    if (config_.n != 0) std::fill(out_, out_ + config_.n, 0.0f);
  }
  void finish_step() {
    auto emit_chunk = [this](std::size_t b, std::size_t e) { emit(b, e); };
    finalize_in_place(*this, out_, scale_, chunk_count(), config_.chunk, config_.n, executor_,
                      has_callback() ? FunctionRef<void(std::size_t, std::size_t)>(emit_chunk)
                                     : FunctionRef<void(std::size_t, std::size_t)>());
    // relaxed: re-arm; see Collecting.
    leaves_arrived_.store(0, std::memory_order_relaxed);
    complete_step();
  }
};

// Mutex: every contribution adds its leaf into the result under one lock (the first copies), in
// arrival order: NOT bitwise deterministic. The last arrival scales and emits outside the lock.
// Memory ordering: the mutex orders every add and the arrival count; no atomics besides the base's.
class MutexReducer final : public Reducer {
 public:
  MutexReducer(const ReducerConfig& config, Executor& executor)
      : Reducer(Strategy::kMutex, config, executor) {}

  bool contribute(std::size_t worker, std::size_t leaf, const float* grad) override {
    check_contribution(worker, leaf);
    bool last = false;
    {
      const std::lock_guard lock(mutex_);
      if (arrived_ == 0) {
        sum_sources(out_, &grad, 1, config_.n);
      } else {
        accumulate(out_, grad, config_.n);
      }
      COHORT_CHECK(arrived_ < config_.leaves, "more contributions than leaves in one step");
      last = ++arrived_ == config_.leaves;
      if (last) arrived_ = 0;
    }
    if (!last) return false;
    auto emit_chunk = [this](std::size_t b, std::size_t e) { emit(b, e); };
    finalize_in_place(*this, out_, scale_, chunk_count(), config_.chunk, config_.n, executor_,
                      has_callback() ? FunctionRef<void(std::size_t, std::size_t)>(emit_chunk)
                                     : FunctionRef<void(std::size_t, std::size_t)>());
    complete_step();
    return true;
  }

  void reset() override {
    {
      const std::lock_guard lock(mutex_);
      arrived_ = 0;
    }
    Reducer::reset();
  }

 private:
  std::mutex mutex_;
  std::size_t arrived_ = 0;  // guarded by mutex_
};

}  // namespace

std::unique_ptr<Reducer> make_chunk_owner(const ReducerConfig& config, Executor& executor) {
  return std::make_unique<ChunkOwnerReducer>(config, executor);
}
std::unique_ptr<Reducer> make_parameter_server(const ReducerConfig& config, Executor& executor) {
  return std::make_unique<ParameterServerReducer>(config, executor);
}
std::unique_ptr<Reducer> make_atomic(const ReducerConfig& config, Executor& executor) {
  return std::make_unique<AtomicReducer>(config, executor);
}
std::unique_ptr<Reducer> make_mutex(const ReducerConfig& config, Executor& executor) {
  return std::make_unique<MutexReducer>(config, executor);
}
std::unique_ptr<Reducer> make_serial(const ReducerConfig& config, Executor& executor) {
  return std::make_unique<SerialReducer>(config, executor);
}

}  // namespace cohort::reduce::detail
