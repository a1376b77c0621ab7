// The arena, OpenMP pinning in every task body, the executor and the flow graph; see
// step_graph.hpp.
#include "step_graph.hpp"

#include <omp.h>
#include <oneapi/tbb/flow_graph.h>
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/info.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>

namespace cohort::train {

namespace {
namespace flow = oneapi::tbb::flow;

// Every task body that may run a oneDNN primitive (replica nodes, evaluation, executor chunks:
// the root's GEMMs) first pins OpenMP to one thread on its own thread: a cheap thread-local
// write. Not a task_scheduler_observer: its proxy, freed by whichever thread drops it last,
// leaked under LeakSanitizer in 1 of 24 runs of a test whose replica throws.
void one_openmp_thread() { omp_set_num_threads(1); }

}  // namespace

// Chunk-parallel work on the arena's threads: idle threads take chunks. Entering the arena from a
// thread already in it runs the functor directly, so this serves callers inside (the reducer's
// root) and outside (the controller's second phase) alike. Not in the anonymous namespace:
// StepGraph::Impl, a type of the header's, holds one.
class ArenaExecutor final : public reduce::Executor {
 public:
  explicit ArenaExecutor(oneapi::tbb::task_arena& arena) : arena_(arena) {}
  void parallel_for(std::size_t n, FunctionRef<void(std::size_t)> body) override {
    arena_.execute([&] {
      oneapi::tbb::parallel_for(std::size_t{0}, n, [&](std::size_t i) {
        one_openmp_thread();
        body(i);
      });
    });
  }

 private:
  oneapi::tbb::task_arena& arena_;
};

Replica::Replica(const nn::Model& model, std::size_t eval_rows, bool blocked_layouts,
                 nn::Precision precision)
    : net(model, blocked_layouts, precision),
      eval_x(eval_rows * static_cast<std::size_t>(model.input_features())),
      eval_x16(precision == nn::Precision::kBf16 && model.kind().bf16_rows() ? eval_x.size() : 0),
      eval_y(eval_rows) {}

// More workers than this process may use cores (--workers above the affinity mask, e.g. an MPI
// rank bound to one core): TBB would cap the arena at the mask and warn on stderr. The user asked
// for W replica threads: raise TBB's limit to W while the graph lives (oversubscribed, as asked).
std::unique_ptr<oneapi::tbb::global_control> parallelism_for(std::size_t workers) {
  const auto available = static_cast<std::size_t>(oneapi::tbb::info::default_concurrency());
  if (workers <= available) return nullptr;
  return std::make_unique<oneapi::tbb::global_control>(
      oneapi::tbb::global_control::max_allowed_parallelism, workers);
}

struct StepGraph::Impl {
  std::unique_ptr<oneapi::tbb::global_control> parallelism;  // before the arena
  oneapi::tbb::task_arena arena;
  ArenaExecutor executor{arena};
  // Set by run_replicas before the start message, read by the nodes (try_put orders the two).
  FunctionRef<void(std::size_t)> body;
  // Built inside the arena it belongs to: start -> replica 0 .. W-1.
  std::unique_ptr<flow::graph> graph;
  std::unique_ptr<flow::broadcast_node<flow::continue_msg>> start;
  std::vector<std::unique_ptr<flow::continue_node<flow::continue_msg>>> nodes;

  explicit Impl(std::size_t workers)
      : parallelism(parallelism_for(workers)), arena(static_cast<int>(workers)) {
    arena.execute([&] {
      graph = std::make_unique<flow::graph>();
      start = std::make_unique<flow::broadcast_node<flow::continue_msg>>(*graph);
      for (std::size_t w = 0; w < workers; ++w) {
        nodes.push_back(std::make_unique<flow::continue_node<flow::continue_msg>>(
            *graph, [this, w](const flow::continue_msg&) {
              one_openmp_thread();
              body(w);
            }));
        flow::make_edge(*start, *nodes.back());
      }
    });
  }
};

nn::Evaluation Replica::evaluate(const ReplicaWeights& weights, std::int64_t N) {
  const std::int32_t* y = eval_y.data();
  if (net.precision() == nn::Precision::kF32)
    return net.evaluate(weights.f32, eval_x.data(), y, N, weights.stats);
  if (eval_x16.size() == 0) return net.evaluate(weights.b16, eval_x.data(), y, N, weights.stats);
  const std::size_t values = static_cast<std::size_t>(N) * (eval_x.size() / eval_y.size());
  to_bf16(eval_x.data(), eval_x16.data(), values);
  return net.evaluate(weights.b16, eval_x16.data(), y, N, weights.stats);
}

StepGraph::StepGraph(std::size_t workers, const nn::Model& model, std::size_t eval_rows,
                     bool blocked_layouts, nn::Precision precision)
    : impl_(std::make_unique<Impl>(workers)) {
  omp_set_num_threads(1);  // the controller also runs replica work inside the arena
  for (std::size_t w = 0; w < workers; ++w) {
    replicas_.push_back(std::make_unique<Replica>(model, eval_rows, blocked_layouts, precision));
    // The replicas run on the same weights at the same time: one set of their copies in
    // oneDNN's layouts (a language model's), not one a replica.
    if (w > 0) replicas_[w]->net.share_weight_copies(replicas_[0]->net);
  }
  // Told from the start, so that each run below (which tells them again) reorders the weights
  // once, the first run included.
  weights_changed();
}

StepGraph::~StepGraph() = default;

void StepGraph::keep_weight_copies(const bf16* params) {
  replicas_.front()->net.keep_weight_copies(params);  // the others share its copies
}

void StepGraph::weights_written(std::size_t begin, std::size_t end) {
  replicas_.front()->net.weights_written(begin, end);
}

void StepGraph::weights_changed() {
  for (auto& r : replicas_) r->net.weights_changed();
}

void StepGraph::run_replicas(FunctionRef<void(std::size_t)> body) {
  weights_changed();
  impl_->body = body;
  try {
    impl_->arena.execute([&] {
      impl_->start->try_put(flow::continue_msg());
      impl_->graph->wait_for_all();
    });
  } catch (...) {
    // The graph cancelled the rest and waited for the running bodies; ready it for the next run.
    impl_->arena.execute([&] { impl_->graph->reset(); });
    throw;
  }
}

reduce::Executor& StepGraph::executor() { return impl_->executor; }

void StepGraph::for_each_replica(std::size_t n, FunctionRef<void(std::size_t)> body) {
  weights_changed();
  impl_->arena.execute([&] {
    oneapi::tbb::parallel_for(
        std::size_t{0}, n,
        [&](std::size_t i) {
          one_openmp_thread();
          body(i);
        },
        oneapi::tbb::simple_partitioner());
  });
}

}  // namespace cohort::train
