// Reducer: sums L leaf gradients of N floats each, contributed by W workers in any order at any
// time, into one result (sum or mean), or hands the result chunk by chunk to a callback where the
// optimizer is fused. Six strategies behind one interface; the combining tree is the default.
// Not an optimizer and not a scheduler: it knows nothing of layers, TBB or how leaves are assigned.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "cohort/core/function_ref.hpp"
#include "cohort/core/names.hpp"
#include "cohort/reduce/executor.hpp"
#include "cohort/reduce/tree_shape.hpp"
#include "cohort/tensor/buffer.hpp"

namespace cohort::reduce {

enum class Strategy {
  kTree,             // lock-free combining tree, bitwise deterministic (the default)
  kChunkOwner,       // reduce-scatter: worker w sums every leaf over its slice after a barrier
  kParameterServer,  // one dedicated thread evaluates the tree once every leaf has arrived
  kAtomic,           // every contribution adds into the result with CAS-loop float adds
  kMutex,            // every contribution adds into the result under one std::mutex
  kSerial,           // the last contribution evaluates the tree on its own thread: the oracle
};

inline constexpr Named<Strategy> kStrategyNames[] = {
    {Strategy::kTree, "tree"},
    {Strategy::kChunkOwner, "chunk_owner"},
    {Strategy::kParameterServer, "parameter_server"},
    {Strategy::kAtomic, "atomic"},
    {Strategy::kMutex, "mutex"},
    {Strategy::kSerial, "serial"},
};

std::string_view to_string(Strategy strategy);
// Accepts the names of kStrategyNames; throws InputError naming `what` and the value otherwise.
Strategy parse_strategy(std::string_view name, const std::string& what = "--reducer");
// Tree, chunk-owner, parameter server and serial give bitwise the serial reference's result for any
// W and arrival order. Atomic and mutex add leaves in arrival order: their result depends on it
// (within the float64 tolerance of tests/reduce), so they are not deterministic.
bool is_deterministic(Strategy strategy);

struct ReducerConfig {
  std::size_t n = 0;          // floats per leaf gradient (0 is allowed: nothing is summed)
  std::size_t leaves = 1;     // L >= 1: leaves contributed per step
  std::size_t workers = 1;    // W >= 1: worker ids passed to contribute/finish are < W
  std::size_t arity = 2;      // tree arity, 2 .. kMaxArity (e.g. arity = L: one flat root)
  std::size_t chunk = 16384;  // floats per executor chunk (64 KiB); root callback granularity
};
inline constexpr std::size_t kMaxArity = 64;

// Validates a config; throws InputError naming the field, the expected and the found value.
void validate(const ReducerConfig& config);

// The root callback: receives the whole-model sum array and a chunk [begin, end) of it that is
// final (already scaled). Called exactly once per chunk of the grid [c * chunk, min(N, (c + 1) *
// chunk)), c = 0 .. ceil(N / chunk) - 1, by every strategy (no call when N == 0), so a callee may
// keep per-chunk state indexed by begin / chunk. Calls may run concurrently on several threads;
// each may only touch its own [begin, end) of shared arrays (e.g. Sgd::apply(w, sum, v, begin, end,
// lr, 1)).
using ChunkCallback = FunctionRef<void(const float* sum, std::size_t begin, std::size_t end)>;

// The fused root callback: the step's result on [begin, end) is the left-to-right sum
// ((sources[0][i] + sources[1][i]) + sources[2][i]) + ... of k >= 1 whole-model arrays, final
// for that range. The callee consumes the sum in its own sweep (e.g. adds the sources block by
// block in L1 and applies the optimizer there), so the reducer writes no result array: one read
// of each source, no N-sized temporary, and for a single source no copy at all. Called exactly
// once per chunk, like ChunkCallback, possibly concurrently. To be bitwise equal to the other
// sinks the callee must add in this order (reduce::sum_sources does).
using SourcesCallback = FunctionRef<void(const float* const* sources, std::size_t k,
                                         std::size_t begin, std::size_t end)>;

// Where a step's result goes: result[i] = scale * sum_i into `result` (or, if null, into the
// reducer's own buffer, see sum()), then `callback` per chunk if set; or, for a fused sink, the
// sources of the sum per chunk to `sources` (scale 1: the callee scales).
struct Sink {
  float* result = nullptr;
  ChunkCallback callback;
  float scale = 1.0f;  // 1 for the sum; 1 / batch (or 1 / L) for the mean
  SourcesCallback sources;

  static Sink into(float* result, float scale = 1.0f) { return Sink{result, {}, scale, {}}; }
  static Sink chunks(ChunkCallback callback, float scale = 1.0f) {
    return Sink{nullptr, callback, scale, {}};
  }
  static Sink fused(SourcesCallback sources) { return Sink{nullptr, {}, 1.0f, sources}; }
};

// The reducer contract, for every strategy.
//
// A step: the controller calls begin_step(sink); then every leaf in [0, L) is contributed exactly
// once, by any worker, in any order, from any threads (contribute(worker, leaf, grad)); and every
// worker id in [0, W) calls finish(worker) once after its own contributions. The step is complete
// when one call of contribute or finish returns true (tree, atomic, mutex, serial, chunk-owner) or
// when the parameter-server thread finishes; step_done()/wait_step() observe it for all strategies.
// Then the sink's result and callbacks are complete, and the next begin_step may follow.
//
// Which thread may call what:
// - begin_step, step_done, wait_step, reset, sum: the controller, one thread, never concurrently
//   with contributions of a step. begin_step must happen-before every contribute/finish of its step
//   (e.g. it is called before the step's tasks are spawned or released to the workers).
// - contribute and finish: any thread, concurrently. finish(worker) of the chunk-owner strategy
//   blocks until all L leaves have arrived (so every leaf must be contributed by a thread that
//   does not wait for that finish); every other strategy never blocks in contribute/finish (tree:
//   no lock, no wait, no spin), so any number of threads >= 1 can drive any W.
// - abort_step: any thread, once a contribution will never come (its worker failed): every
//   finish() blocked or yet to come returns false, and the step never completes; the controller
//   then calls reset() once no contribution or finish is in flight.
// - The sink's callback runs on whichever threads complete the step (and the executor's threads);
//   for the parameter server, on its own thread. An exception from the callback propagates out of
//   the contribute/finish call that ran it, or, on the parameter server's thread, out of
//   wait_step() on the controller (the step then counts as complete; call reset() before the next).
//
// Lifetime: a gradient passed to contribute must stay valid and unchanged until the step is
// complete (leaves are read when their parent node combines, possibly much later). The executor,
// the sink's result array and the callable behind the callback must outlive the step.
//
// Memory ordering: every write to a leaf gradient made before contribute() happens-before the
// result's computation; every result/callback write happens-before the completing call returns
// true and before step_done() returns true on the controller (completed_steps_ is incremented with
// release and read with acquire). Each strategy's header comment in src/reduce/ states its own.
class Reducer {
 public:
  Reducer(Strategy strategy, const ReducerConfig& config, Executor& executor);
  virtual ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  Strategy strategy() const { return strategy_; }
  const ReducerConfig& config() const { return config_; }
  const TreeShape& shape() const { return shape_; }

  // Starts a step. Precondition: the previous step is complete (or reset() was called).
  void begin_step(Sink sink);
  // Leaf `leaf` of this step is final in grad[0, N). Returns true if this call completed the step.
  virtual bool contribute(std::size_t worker, std::size_t leaf, const float* grad) = 0;
  // Worker `worker` has made all of its contributions of this step. Returns true if this call
  // completed the step. A no-op (false) except for the chunk-owner strategy.
  virtual bool finish(std::size_t worker);

  bool step_done() const;
  // Waits for the step's completion; rethrows an exception the sink's callback raised on a
  // strategy's own thread (parameter server).
  void wait_step();
  // See the contract above. A no-op except for the strategies that wait (chunk-owner finish, the
  // parameter server's thread).
  virtual void abort_step() {}
  std::uint32_t completed_steps() const {
    return completed_steps_.load(std::memory_order_acquire);  // acquire: see the step's output
  }
  // Abandons a step that will not complete (a worker failed): restores every counter. No
  // contribution may be in flight.
  virtual void reset();

  // The array the last step's result was written to (sink.result, or the reducer's own buffer).
  // Null for the combining tree with a fused sink (its callback consumes the root's sources).
  const float* sum() const { return out_; }

 protected:
  virtual void on_begin_step() {}
  // Whether the strategy writes a result array for a fused sink (then the reducer allocates one
  // where the sink has none); the combining tree hands the root's sources on instead.
  virtual bool fused_sink_uses_result() const { return true; }
  // Publishes the step's completion; call last, after all result writes.
  void complete_step();
  // Hands [begin, end) of the finished result array to the callback, if any (a fused sink gets
  // it as a single source).
  void emit(std::size_t begin, std::size_t end) const {
    if (callback_) callback_(out_, begin, end);
    if (sources_) {
      const float* sum = out_;
      sources_(&sum, 1, begin, end);
    }
  }
  bool has_callback() const { return callback_ || sources_; }
  std::size_t chunk_count() const { return (config_.n + config_.chunk - 1) / config_.chunk; }
  void check_contribution(std::size_t worker, std::size_t leaf) const;
  // On a strategy's own thread: the sink's callback threw; kept for wait_step(). Write it before
  // complete_step(), whose release publishes it.
  void set_root_error(std::exception_ptr error) { root_error_ = std::move(error); }
  // 1 for the first step; set by begin_step on the controller, readable by contributors.
  std::uint32_t step_number() const { return started_steps_; }

  const Strategy strategy_;
  const ReducerConfig config_;
  const TreeShape shape_;
  Executor& executor_;
  // Set by begin_step on the controller; read by the completing threads.
  float* out_ = nullptr;
  ChunkCallback callback_;
  SourcesCallback sources_;
  float scale_ = 1.0f;

 private:
  AlignedBuffer<float> own_result_;
  // 32-bit, compared for equality only (wraps harmlessly); a 32-bit atomic is libstdc++'s futex
  // type, so notify_all with no sleeper is a load, not a locked add on a shared waiter pool.
  std::uint32_t started_steps_ = 0;  // controller only
  std::exception_ptr root_error_;    // see set_root_error
  alignas(kCacheLine) std::atomic<std::uint32_t> completed_steps_{0};
};

// Creates a reducer. The executor must outlive it (the serial strategy does not use it).
std::unique_ptr<Reducer> make_reducer(Strategy strategy, const ReducerConfig& config,
                                      Executor& executor);

// The oracle: out[i] = scale * (tree sum of leaves[0..L)[i]), evaluated on the calling thread in
// the TreeShape's order, block by block (reads L*N floats, writes N, no N-sized temporaries).
void reference_reduce(const TreeShape& shape, std::span<const float* const> leaves, std::size_t n,
                      float* out, float scale = 1.0f);

}  // namespace cohort::reduce
