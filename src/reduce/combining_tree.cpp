// The lock-free combining tree: the default reducer. No locks, no waiting, no spinning: a
// contribution either leaves at the first internal node where siblings are still missing, or is the
// last arrival there and combines the node, then climbs. Not a scheduler: chunk work goes to the
// executor.
//
// Memory ordering: a contributor writes its leaf pointer (or a combiner its node buffer, including
// writes made by executor chunks, which happen-before parallel_for returns) and then decrements the
// parent's pending_children with acq_rel: the release publishes that child, the acquire makes every
// sibling published before it visible to the last arriver, which alone reads them. The last arriver
// re-arms the counter with a relaxed store: nothing touches that counter again until the next step,
// whose contributions the controller orders after this step's completion (release in
// complete_step) via begin_step. So there is no per-step reset sweep: reset() exists only for an
// abandoned step.
#include <array>

#include "cohort/core/error.hpp"
#include "cohort/reduce/kernels.hpp"
#include "strategies.hpp"

namespace cohort::reduce::detail {
namespace {

class CombiningTree final : public Reducer {
 public:
  CombiningTree(const ReducerConfig& config, Executor& executor)
      : Reducer(Strategy::kTree, config, executor), nodes_(new Node[shape_.node_count()]) {
    const std::uint32_t root = shape_.root();
    for (std::uint32_t p = static_cast<std::uint32_t>(shape_.first_internal());
         p < shape_.node_count(); ++p) {
      if (p != root) {
        buffers_.emplace_back(config_.n);
        nodes_[p].value = buffers_.back().data();
      }
    }
    arm_counters();
  }

  bool contribute(std::size_t worker, std::size_t leaf, const float* grad) override {
    check_contribution(worker, leaf);
    Node& mine = nodes_[leaf];
    COHORT_CHECK(mine.contributed_step != step_number(),
                 "combining tree: leaf contributed twice in one step");
    mine.contributed_step = step_number();
    mine.value = grad;  // published by the acq_rel decrement below
    auto node = static_cast<std::uint32_t>(leaf);
    const std::uint32_t root = shape_.root();
    while (node != root) {
      const std::uint32_t parent = shape_.parent(node);
      // acq_rel: release publishes this child's value; acquire lets the last arriver read all
      // siblings' values (see the file comment).
      const std::uint32_t before =
          nodes_[parent].pending_children.fetch_sub(1, std::memory_order_acq_rel);
      COHORT_CHECK(before != 0,
                   "combining tree: more arrivals than children (a leaf contributed "
                   "twice in one step?)");
      if (before != 1) return false;  // siblings still missing: leave, someone else climbs
      // relaxed: re-arm for the next step; ordered by the step handoff (file comment).
      nodes_[parent].pending_children.store(
          static_cast<std::uint32_t>(shape_.children(parent).size()), std::memory_order_relaxed);
      node = parent;
      if (node != root) combine_into(node, nodes_[node].value, 1.0f, false);
    }
    combine_into(root, out_, scale_, true);
    complete_step();
    return true;
  }

  void reset() override {
    arm_counters();
    for (std::size_t l = 0; l < shape_.leaves(); ++l) nodes_[l].contributed_step = 0;
    Reducer::reset();
  }

 private:
  struct alignas(kCacheLine) Node {
    // Internal node: children that have not arrived in this step.
    std::atomic<std::uint32_t> pending_children{0};
    // Leaf: this step's gradient; internal non-root node: its own buffer (fixed).
    const float* value = nullptr;
    // Leaf: the step it was last contributed in (catches a second contribution in one step).
    std::uint32_t contributed_step = 0;
  };

  void arm_counters() {
    for (std::size_t p = shape_.first_internal(); p < shape_.node_count(); ++p) {
      // relaxed: no contribution is in flight (construction or reset()).
      nodes_[p].pending_children.store(
          static_cast<std::uint32_t>(shape_.children(static_cast<std::uint32_t>(p)).size()),
          std::memory_order_relaxed);
    }
  }

  // dst = scale * (children of node, left to right), or a copy of the leaf when the root is one.
  // Split into chunks for the executor; the root also hands each chunk to the callback, or, for
  // a fused sink, hands the callback the children instead of summing them.
  void combine_into(std::uint32_t node, const float* dst_const, float scale, bool is_root) {
    float* dst = const_cast<float*>(dst_const);  // node buffers are ours; value is const for leaves
    std::array<const float*, kMaxArity> src{};
    std::size_t k = 0;
    if (shape_.is_leaf(node)) {
      src[k++] = nodes_[node].value;
    } else {
      for (std::uint32_t c : shape_.children(node)) src[k++] = nodes_[c].value;
    }
    const std::size_t n = config_.n;
    const std::size_t chunk = config_.chunk;
    // A fused sink sums the root's children itself, in its own sweep: nothing to write here.
    const bool fused = is_root && static_cast<bool>(sources_);
    auto body = [&](std::size_t c) {
      const std::size_t begin = c * chunk;
      const std::size_t end = std::min(n, begin + chunk);
      if (fused) {
        sources_(src.data(), k, begin, end);
        return;
      }
      std::array<const float*, kMaxArity> at{};
      for (std::size_t j = 0; j < k; ++j) at[j] = src[j] + begin;
      sum_sources(dst + begin, at.data(), k, end - begin, scale);
      if (is_root) emit(begin, end);
    };
    const std::size_t chunks = chunk_count();
    if (chunks == 1) {
      body(0);
    } else if (chunks > 1) {
      executor_.parallel_for(chunks, body);
    }
  }

  bool fused_sink_uses_result() const override { return false; }

  std::unique_ptr<Node[]> nodes_;
  std::vector<AlignedBuffer<float>> buffers_;  // one per non-root internal node
};

}  // namespace

std::unique_ptr<Reducer> make_combining_tree(const ReducerConfig& config, Executor& executor) {
  return std::make_unique<CombiningTree>(config, executor);
}

}  // namespace cohort::reduce::detail
