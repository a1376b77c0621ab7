// The root sharded over ranks; see sharded.hpp.
#include "sharded.hpp"

#include <algorithm>

#include "cohort/core/error.hpp"
#include "cohort/reduce/kernels.hpp"
#include "cohort/reduce/reducer.hpp"
#include "time_account.hpp"
#include "trace.hpp"

namespace cohort::train {

namespace {
enum Tag : int { kSlices = 1, kRows = 2, kWeights = 3 };
// Owned chunks per group: up to this many groups a step, so the first group's weights leave
// while the later groups are computed.
constexpr std::size_t kGroups = 4;
}  // namespace

ShardedStep::ShardedStep(dist::Comm& comm, Root& root, std::size_t n,
                         std::vector<AlignedBuffer<float>>& leaf_grads,
                         std::vector<double>& leaf_loss, float* weights, bf16* weights16,
                         BatchGrads* batch, std::size_t micro_batch, Tracer* tracer)
    : comm_(comm),
      root_(root),
      n_(n),
      chunk_(root.chunk()),
      chunks_(root.chunks()),
      ranks_(static_cast<std::size_t>(comm.size())),
      me_(static_cast<std::size_t>(comm.rank())),
      leaf_grads_(leaf_grads),
      leaf_loss_(leaf_loss),
      weights_(weights),
      weights16_(weights16),
      batch_(batch),
      micro_batch_(micro_batch),
      tracer_(tracer) {
  // The ranges summed from leaves: everything, less what batch weight gradients compute.
  std::size_t pos = 0;
  if (batch_) {
    for (auto [b, e] : batch_->computed_ranges()) {
      if (b > pos) summed_.push_back({pos, b});
      pos = e;
    }
    rows_ = batch_->row_arrays();
  }
  // Chunk ownership and its groups do not depend on the step: fixed here for every rank.
  const dist::ShardPlan ownership(1, chunks_, ranks_);
  for (std::size_t r = 0; r < ranks_; ++r) {
    const dist::Range owned = ownership.chunks_of(r);
    owned_by_.push_back(owned);
    std::vector<dist::Range>& groups = groups_by_.emplace_back();
    const std::size_t count = std::min(kGroups, owned.size());
    for (std::size_t g = 0; g < count; ++g) {
      const dist::Range part = dist::even_part(owned.size(), count, g);
      groups.push_back({owned.begin + part.begin, owned.begin + part.end});
    }
  }
  owned_ = owned_by_[me_];
  if (batch_) {
    const auto [b, e] = batch_->input_reader();
    const dist::Range mine = elements_of(owned_);
    needs_staged_input_ = !dist::intersect({b, e}, mine.begin, mine.end).empty();
  }
  if (pos < n_) summed_.push_back({pos, n_});
}

dist::Range ShardedStep::elements_of(dist::Range chunks) const {
  return {std::min(n_, chunks.begin * chunk_), std::min(n_, chunks.end * chunk_)};
}

dist::Range ShardedStep::begin_step(std::size_t rows, std::size_t leaves) {
  if (!plan_ || plan_->leaves() != leaves) {
    plan_ = std::make_unique<dist::ShardPlan>(leaves, chunks_, ranks_);
    // The root's sources: the leaves themselves up to one flat root (the trainer's arity), else
    // the sums of the tree's internal nodes below the root, computed per chunk.
    shape_.reset();
    node_sums_.clear();
    sources_.clear();
    const std::size_t arity = std::clamp<std::size_t>(leaves, 2, reduce::kMaxArity);
    if (leaves > arity) {
      shape_ = std::make_unique<reduce::TreeShape>(leaves, arity);
      for (std::size_t i = shape_->first_internal(); i + 1 < shape_->node_count(); ++i)
        node_sums_.emplace_back(n_);
      for (std::uint32_t c : shape_->children(shape_->root()))
        sources_.push_back(shape_->is_leaf(c) ? leaf_grads_[c].data()
                                              : node_sums_[c - shape_->first_internal()].data());
    } else {
      for (std::size_t l = 0; l < leaves; ++l) sources_.push_back(leaf_grads_[l].data());
    }
  }
  rows_in_step_ = rows;
  exchange_seconds_ = 0;
  mine_ = plan_->leaves_of(me_);
  groups_.clear();
  for (dist::Range g : groups_by_[me_]) groups_.push_back({g, {}});
  row_inputs_.clear();
  post_slices(false);
  post_rows(false);
  return mine_;
}

// Slices: for every (sender leaf, summed range) within the receiver's chunk group, one message
// straight from/into the leaf's gradient buffer. Posted in the same order on both sides.
void ShardedStep::post_slices(bool send) {
  for (std::size_t o = 0; o < ranks_; ++o) {
    if (o == me_) continue;
    const dist::Range leaves = send ? mine_ : plan_->leaves_of(o);
    const std::size_t owner = send ? o : me_;
    const std::vector<dist::Range>& groups = groups_by_[owner];
    for (std::size_t gi = 0; gi < groups.size(); ++gi) {
      const dist::Range elems = elements_of(groups[gi]);
      for (std::size_t l = leaves.begin; l < leaves.end; ++l)
        for (const dist::Range& s : summed_) {
          const dist::Range part = dist::intersect(s, elems.begin, elems.end);
          if (part.empty()) continue;
          float* at = leaf_grads_[l].data() + part.begin;
          const std::size_t bytes = part.size() * sizeof(float);
          if (send) {
            comm_.isend(at, bytes, static_cast<int>(o), kSlices);
          } else {
            groups_[gi].inputs.push_back(comm_.irecv(at, bytes, static_cast<int>(o), kSlices));
          }
        }
    }
  }
}

// Rows of batch weight gradients: a rank's leaves' rows of each array, to every rank that owns
// part of a range reading that array.
void ShardedStep::post_rows(bool send) {
  auto reads = [&](std::size_t rank, const BatchGrads::RowArray& a) {
    const dist::Range e = elements_of(owned_by_[rank]);
    for (int i = 0; i < 2; ++i)
      if (!dist::intersect({a.reader_begin[i], a.reader_end[i]}, e.begin, e.end).empty())
        return true;
    return false;
  };
  for (std::size_t o = 0; o < ranks_; ++o) {
    if (o == me_) continue;
    const dist::Range leaves = send ? mine_ : plan_->leaves_of(o);
    const std::size_t first = std::min(rows_in_step_, leaves.begin * micro_batch_);
    const std::size_t last = std::min(rows_in_step_, leaves.end * micro_batch_);
    if (first == last) continue;
    for (const BatchGrads::RowArray& a : rows_) {
      if (!reads(send ? o : me_, a)) continue;
      // Row pairs: leaves start at even rows (an even micro-batch); an odd last row is sent with
      // its zero partner.
      const std::size_t end = (last + a.row_multiple - 1) / a.row_multiple * a.row_multiple;
      void* at = static_cast<char*>(a.data) + first * a.width * a.value_bytes;
      const std::size_t bytes = (end - first) * a.width * a.value_bytes;
      if (send) {
        comm_.isend(at, bytes, static_cast<int>(o), kRows);
      } else {
        row_inputs_.push_back(comm_.irecv(at, bytes, static_cast<int>(o), kRows));
      }
    }
  }
}

void ShardedStep::post_weight_receives() {
  weights_incoming_ = true;
  for (std::size_t o = 0; o < ranks_; ++o) {
    if (o == me_) continue;
    for (dist::Range g : groups_by_[o]) {
      const dist::Range e = elements_of(g);
      if (!e.empty())
        comm_.irecv(weights_ + e.begin, e.size() * sizeof(float), static_cast<int>(o), kWeights);
    }
  }
}

void ShardedStep::send_weights(dist::Range chunks) {
  const dist::Range e = elements_of(chunks);
  if (e.empty()) return;
  for (std::size_t o = 0; o < ranks_; ++o)
    if (o != me_)
      comm_.isend(weights_ + e.begin, e.size() * sizeof(float), static_cast<int>(o), kWeights);
}

// The internal nodes' sums below the root over [begin, end), children before parents, with the
// reducers' kernel and order (as reduce::detail::TreeEvaluator); then the root's sources.
const float* const* ShardedStep::root_sources(std::size_t begin, std::size_t end) {
  if (shape_) {
    const std::size_t first = shape_->first_internal();
    const float* src[reduce::kMaxArity];
    for (std::size_t p = first; p + 1 < shape_->node_count(); ++p) {
      const auto children = shape_->children(static_cast<std::uint32_t>(p));
      for (std::size_t j = 0; j < children.size(); ++j) {
        const std::uint32_t c = children[j];
        src[j] =
            (shape_->is_leaf(c) ? leaf_grads_[c].data() : node_sums_[c - first].data()) + begin;
      }
      reduce::sum_sources(node_sums_[p - first].data() + begin, src, children.size(), end - begin);
    }
  }
  return sources_.data();
}

void ShardedStep::run_group(reduce::Executor& executor, const Group& g) {
  const bool fused = root_.mode() == Root::Mode::kFused;
  executor.parallel_for(g.chunks.size(), [&](std::size_t i) {
    const std::size_t c = g.chunks.begin + i;
    const std::size_t begin = c * chunk_, end = std::min(n_, begin + chunk_);
    const float* const* sources = root_sources(begin, end);
    if (fused) {
      root_.fused_chunk(sources, sources_.size(), begin, end);
    } else {
      root_.summed_chunk(sources, sources_.size(), begin, end);
    }
    comm_.progress();  // the weights sent so far move while the next chunk runs
  });
}

void ShardedStep::reduce(reduce::Executor& executor, bool stop, FunctionRef<void()> meanwhile) {
  const auto t0 = Clock::now();
  const bool fused = root_.mode() == Root::Mode::kFused;
  post_slices(true);
  post_rows(true);
  if (fused) post_weight_receives();
  const std::uint32_t track = tracer_ ? tracer_->controller_track() : 0;
  if (tracer_) tracer_->record("send", track, nullptr, 0, t0, Clock::now());
  exchange_seconds_ += seconds_since(t0);
  if (needs_staged_input_) meanwhile();
  auto wait = [&](std::span<const dist::Comm::Handle> h, std::size_t index) {
    const auto w0 = Clock::now();
    comm_.wait(h);
    exchange_seconds_ += seconds_since(w0);
    if (tracer_) tracer_->record("wait", track, "chunk", index, w0, Clock::now());
  };
  wait(row_inputs_, owned_.begin);
  for (const Group& g : groups_) {
    wait(g.inputs, g.chunks.begin);
    run_group(executor, g);
    if (fused) send_weights(g.chunks);
  }
  gather_stats(stop);
}

void ShardedStep::share_weights() {
  const auto t0 = Clock::now();
  post_weight_receives();
  for (const Group& g : groups_) send_weights(g.chunks);
  exchange_seconds_ += seconds_since(t0);
}

double ShardedStep::end_step() {
  const auto t0 = Clock::now();
  comm_.wait_all();
  exchange_seconds_ += seconds_since(t0);
  // The other owners' weights arrived in f32: their bf16 copy (the owned chunks' copy was
  // written by the root's sweep), and the replicas' copies of it (Root::bf16_written).
  if (weights16_ && weights_incoming_) {
    for (std::size_t o = 0; o < ranks_; ++o) {
      if (o == me_) continue;
      const dist::Range e = elements_of(owned_by_[o]);
      to_bf16(weights_ + e.begin, weights16_ + e.begin, e.size());
      root_.bf16_written(e.begin, e.end);
    }
  }
  weights_incoming_ = false;
  if (tracer_) tracer_->record("wait", tracer_->controller_track(), nullptr, 0, t0, Clock::now());
  return exchange_seconds_;
}

// One all-gather of every rank's [leaf losses..., (first_bad, sum_squares) per owned chunk...,
// stop]: afterwards every rank has what one process's root and loss sum would have.
void ShardedStep::gather_stats(bool stop) {
  std::vector<std::size_t> bytes(ranks_);
  std::size_t total = 0, mine_at = 0;
  for (std::size_t r = 0; r < ranks_; ++r) {
    const std::size_t doubles = plan_->leaves_of(r).size() + 2 * owned_by_[r].size() + 1;
    if (r == me_) mine_at = total;
    bytes[r] = doubles * sizeof(double);
    total += doubles;
  }
  gathered_.assign(total, 0.0);
  double* out = gathered_.data() + mine_at;
  for (std::size_t l = mine_.begin; l < mine_.end; ++l) *out++ = leaf_loss_[l];
  const auto stats = root_.stats();
  for (std::size_t c = owned_.begin; c < owned_.end; ++c) {
    *out++ = static_cast<double>(stats[c].first_bad);
    *out++ = stats[c].sum_squares;
  }
  *out = stop ? 1.0 : 0.0;
  const auto t0 = Clock::now();
  comm_.allgatherv(gathered_.data(), bytes);
  exchange_seconds_ += seconds_since(t0);
  if (tracer_) tracer_->record("gather", tracer_->controller_track(), nullptr, 0, t0, Clock::now());
  const double* in = gathered_.data();
  stop_agreed_ = false;
  for (std::size_t r = 0; r < ranks_; ++r) {
    const dist::Range leaves = plan_->leaves_of(r), owned = owned_by_[r];
    for (std::size_t l = leaves.begin; l < leaves.end; ++l) leaf_loss_[l] = *in++;
    for (std::size_t c = owned.begin; c < owned.end; ++c, in += 2)
      if (r != me_) root_.import_chunk(c, static_cast<std::size_t>(in[0]), in[1]);
    stop_agreed_ = stop_agreed_ || *in++ != 0.0;
  }
}

}  // namespace cohort::train
