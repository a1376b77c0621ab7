// The Reducer base (step bookkeeping, sinks), validation, the factory and the serial oracle.
#include "cohort/reduce/reducer.hpp"

#include <string>
#include <utility>

#include "cohort/core/error.hpp"
#include "strategies.hpp"
#include "tree_eval.hpp"

namespace cohort::reduce {

std::string_view to_string(Strategy strategy) { return name_of(kStrategyNames, strategy); }

Strategy parse_strategy(std::string_view name, const std::string& what) {
  return parse_name(kStrategyNames, name, what);
}

bool is_deterministic(Strategy strategy) {
  return strategy != Strategy::kAtomic && strategy != Strategy::kMutex;
}

void validate(const ReducerConfig& config) {
  auto fail = [](const char* field, const char* expected, std::size_t found) {
    throw InputError(std::string("reducer config: ") + field + ": expected " + expected +
                     ", found " + std::to_string(found));
  };
  if (config.leaves == 0 || config.leaves >= (std::size_t{1} << 30)) {
    fail("leaves", "1 .. 2^30-1", config.leaves);
  }
  if (config.workers == 0 || config.workers >= (std::size_t{1} << 31)) {
    fail("workers", "1 .. 2^31-1", config.workers);
  }
  if (config.arity < 2 || config.arity > kMaxArity) fail("arity", "2 .. 64", config.arity);
  if (config.chunk == 0 || config.chunk % 16 != 0) {
    fail("chunk", "a positive multiple of 16 floats (one cache line)", config.chunk);
  }
}

Reducer::Reducer(Strategy strategy, const ReducerConfig& config, Executor& executor)
    : strategy_(strategy),
      config_((validate(config), config)),
      shape_(config.leaves, config.arity),
      executor_(executor) {}

Reducer::~Reducer() = default;

void Reducer::begin_step(Sink sink) {
  COHORT_CHECK(step_done(), "begin_step: the previous step is not complete (call reset())");
  if (sink.result == nullptr && sink.sources && !fused_sink_uses_result()) {
    out_ = nullptr;
  } else if (sink.result == nullptr) {
    if (own_result_.size() != config_.n) own_result_ = AlignedBuffer<float>(config_.n);
    out_ = own_result_.data();
  } else {
    out_ = sink.result;
  }
  COHORT_CHECK(!sink.sources || (sink.scale == 1.0f && !sink.callback && !sink.result),
               "begin_step: a fused sink takes no scale, chunk callback or result array");
  callback_ = sink.callback;
  sources_ = sink.sources;
  scale_ = sink.scale;
  ++started_steps_;
  on_begin_step();
}

bool Reducer::finish(std::size_t worker) {
  COHORT_CHECK(worker < config_.workers, "finish: worker id out of range");
  return false;
}

bool Reducer::step_done() const {
  // acquire: the step's result writes are visible once its completion is.
  return completed_steps_.load(std::memory_order_acquire) == started_steps_;
}

void Reducer::wait_step() {
  // acquire: as in step_done; it also publishes root_error_.
  std::uint32_t done = completed_steps_.load(std::memory_order_acquire);
  while (done != started_steps_) done = detail::wait_while_equal(completed_steps_, done);
  if (root_error_) std::rethrow_exception(std::exchange(root_error_, nullptr));
}

void Reducer::reset() {
  // relaxed: reset runs with no contribution in flight; the controller's own bookkeeping.
  completed_steps_.store(started_steps_, std::memory_order_relaxed);
}

void Reducer::complete_step() {
  // release: every result and callback write of the step happens-before an acquire that sees it.
  completed_steps_.fetch_add(1, std::memory_order_release);
  completed_steps_.notify_all();
}

void Reducer::check_contribution(std::size_t worker, std::size_t leaf) const {
  COHORT_CHECK(worker < config_.workers, "contribute: worker id out of range");
  COHORT_CHECK(leaf < config_.leaves, "contribute: leaf index out of range");
}

std::unique_ptr<Reducer> make_reducer(Strategy strategy, const ReducerConfig& config,
                                      Executor& executor) {
  switch (strategy) {
    case Strategy::kTree:
      return detail::make_combining_tree(config, executor);
    case Strategy::kChunkOwner:
      return detail::make_chunk_owner(config, executor);
    case Strategy::kParameterServer:
      return detail::make_parameter_server(config, executor);
    case Strategy::kAtomic:
      return detail::make_atomic(config, executor);
    case Strategy::kMutex:
      return detail::make_mutex(config, executor);
    case Strategy::kSerial:
      return detail::make_serial(config, executor);
  }
  COHORT_CHECK(false, "make_reducer: unknown strategy");
  return nullptr;
}

void reference_reduce(const TreeShape& shape, std::span<const float* const> leaves, std::size_t n,
                      float* out, float scale) {
  COHORT_CHECK(leaves.size() == shape.leaves(), "reference_reduce: leaf count != shape");
  detail::TreeEvaluator evaluator(shape);
  evaluator.evaluate(leaves.data(), 0, n, out, scale);
}

}  // namespace cohort::reduce
