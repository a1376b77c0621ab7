// The double-buffered staged batch; see staging.hpp.
#include "staging.hpp"

#include <algorithm>

namespace cohort::train {

Staging::Staging(const data::Dataset& train, const data::Augmenter* augmenter, std::size_t batch,
                 std::size_t micro_batch, bool bf16_rows)
    : train_(train),
      augmenter_(augmenter),
      features_(train.features()),
      micro_batch_(micro_batch),
      pieces_per_leaf_((micro_batch + kPiece - 1) / kPiece),
      bf16_(bf16_rows) {
  for (Buffers& b : set_) {
    b.x = AlignedBuffer<float>(bf16_rows ? 0 : batch * features_);
    b.x16 = AlignedBuffer<bf16>(bf16_rows ? batch * features_ : 0);
    b.y.resize(batch);
    b.ready.resize((batch + micro_batch - 1) / micro_batch * pieces_per_leaf_);
  }
}

namespace {
bool same_step(const Staging::Step& a, const Staging::Step& b) {
  return a.number == b.number && a.epoch == b.epoch && a.ids.data() == b.ids.data() &&
         a.ids.size() == b.ids.size();
}
}  // namespace

void Staging::begin_step(const Step& current, const Step& next) {
  parity_ = current.number % 2;
  current_ = current;
  // Pieces staged ahead count only for the step they were staged for (the same ids, the same
  // array: the run passes the step it will run next).
  Buffers& now = set_[parity_];
  if (!same_step(now.ahead_of, current)) std::fill(now.ready.begin(), now.ready.end(), 0);
  // The other set: this step's staging ahead writes it, for the next step only.
  Buffers& ahead = set_[1 - parity_];
  std::fill(ahead.ready.begin(), ahead.ready.end(), 0);
  ahead.ahead_of = next;
  next_ = next;
  next_leaves_ = (next.ids.size() + micro_batch_ - 1) / micro_batch_;
  next_claim_.store(0, std::memory_order_relaxed);  // ordered before the replicas by the graph
}

void Staging::assemble(Buffers& b, const Step& s, std::size_t first, std::size_t n) const {
  auto rows = [&](std::size_t from, std::size_t count, float* x) {
    const auto ids = s.ids.subspan(from, count);
    if (augmenter_)
      augmenter_->assemble(train_, ids, s.epoch, /*train=*/true, x, b.y.data() + from);
    else
      data::assemble_batch(train_, ids, x, b.y.data() + from);
  };
  if (!bf16_) {
    rows(first, n, b.x.data() + first * features_);
    return;
  }
  if (!augmenter_) {  // bf16 rows converted straight from the source
    data::assemble_batch(train_, s.ids.subspan(first, n), b.x16.data() + first * features_,
                         b.y.data() + first);
    return;
  }
  // Augmented bf16 rows: a few rows at a time in f32 in this thread's L1, then converted; no f32
  // copy of the batch is written to memory and read back.
  constexpr std::size_t kRows = 8;
  thread_local AlignedBuffer<float> block;
  if (block.size() < kRows * features_) block = AlignedBuffer<float>(kRows * features_);
  for (std::size_t r = first; r < first + n; r += kRows) {
    const std::size_t count = std::min(kRows, first + n - r);
    rows(r, count, block.data());
    to_bf16(block.data(), b.x16.data() + r * features_, count * features_);
  }
}

// Piece j of leaf l of a step of `rows` rows: [begin, end), empty past the leaf's end.
std::pair<std::size_t, std::size_t> Staging::piece(std::size_t l, std::size_t j,
                                                   std::size_t rows) const {
  const std::size_t leaf_end = std::min((l + 1) * micro_batch_, rows);
  const std::size_t begin = std::min(l * micro_batch_ + j * kPiece, leaf_end);
  return {begin, std::min(begin + kPiece, leaf_end)};
}

std::size_t Staging::stage(std::size_t first, std::size_t n) {
  Buffers& b = set_[parity_];
  const std::size_t last = first + n, rows = current_.ids.size();
  std::size_t assembled = 0, found = 0;
  // Runs of rows not staged ahead: a piece wholly in the range and staged ahead is kept, the
  // rest assembled now (a piece the range cuts is assembled again: the same bits).
  std::size_t run = first;
  for (std::size_t l = first / micro_batch_; l * micro_batch_ < last; ++l)
    for (std::size_t j = 0; j < pieces_per_leaf_; ++j) {
      const auto [begin, end] = piece(l, j, rows);
      if (begin == end || !b.ready[l * pieces_per_leaf_ + j] || begin < first || end > last)
        continue;
      if (run < begin) assemble(b, current_, run, begin - run);
      assembled += begin - run;
      found += end - begin;
      run = end;
    }
  if (run < last) assemble(b, current_, run, last - run);
  assembled += last - run;
  if (found) found_ahead_.fetch_add(found, std::memory_order_relaxed);
  return assembled;
}

bool Staging::stage_ahead() {
  // Round robin over the next step's leaves (piece 0 of every leaf, then piece 1, ...): what
  // gets staged ahead shortens every leaf's assembly alike, so no replica starts late.
  for (;;) {
    const std::size_t k = next_claim_.fetch_add(1, std::memory_order_relaxed);
    if (next_leaves_ == 0 || k >= next_leaves_ * pieces_per_leaf_) return false;
    const std::size_t l = k % next_leaves_, j = k / next_leaves_;
    const auto [begin, end] = piece(l, j, next_.ids.size());
    if (begin == end) continue;  // the short last leaf has fewer pieces
    Buffers& b = set_[1 - parity_];
    assemble(b, next_, begin, end - begin);
    b.ready[l * pieces_per_leaf_ + j] = 1;  // read in the next step (the graph orders it)
    return true;
  }
}

}  // namespace cohort::train
