// Leaf gradients summed in leaf order; see leaf_chain.hpp.
#include "leaf_chain.hpp"

#include "cohort/core/error.hpp"

namespace cohort::train {

namespace {
// g[i] = sum[i] + g[i]: the tree's (S_{i-1} + g_i), in place in the leaf's own buffer.
void add_sum_into(float* __restrict g, const float* __restrict sum, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) g[i] = sum[i] + g[i];
}
}  // namespace

LeafChain::LeafChain(std::size_t n, std::size_t buffers) : n_(n) {
  COHORT_CHECK(buffers >= 2, "LeafChain: at least 2 buffers");
  for (std::size_t i = 0; i < buffers; ++i) pool_.emplace_back(n);
  free_.reserve(buffers);
}

void LeafChain::begin_step(std::size_t leaves) {
  const std::lock_guard lock(mutex_);
  free_.clear();
  for (auto& b : pool_) free_.push_back(b.data());
  ready_.assign(leaves, nullptr);
  leaves_ = leaves;
  next_ = 0;
  sum_ = nullptr;
  advancing_ = false;
  aborted_ = false;
}

float* LeafChain::acquire() {
  std::unique_lock lock(mutex_);
  freed_.wait(lock, [this] { return aborted_ || !free_.empty(); });
  if (aborted_) return nullptr;
  float* b = free_.back();
  free_.pop_back();
  return b;
}

void LeafChain::release(float* buffer) {
  {
    const std::lock_guard lock(mutex_);
    free_.push_back(buffer);
  }
  freed_.notify_one();
}

const float* LeafChain::complete(std::size_t leaf, float* buffer) {
  std::unique_lock lock(mutex_);
  COHORT_CHECK(leaf < leaves_ && leaf >= next_ && ready_[leaf] == nullptr,
               "LeafChain: a leaf completed twice or out of range");
  ready_[leaf] = buffer;
  if (advancing_ || leaf != next_) return nullptr;  // the thread adding, or a later one, takes it
  advancing_ = true;
  while (next_ < leaves_ && ready_[next_] != nullptr) {
    float* g = ready_[next_];
    float* previous = sum_;
    lock.unlock();
    if (previous != nullptr) add_sum_into(g, previous, n_);
    lock.lock();
    ready_[next_] = nullptr;
    sum_ = g;
    ++next_;
    if (previous != nullptr) {
      free_.push_back(previous);
      freed_.notify_one();
    }
  }
  advancing_ = false;
  return next_ == leaves_ ? sum_ : nullptr;
}

void LeafChain::abort() {
  {
    const std::lock_guard lock(mutex_);
    aborted_ = true;
  }
  freed_.notify_all();
}

}  // namespace cohort::train
