// Leaf gradients summed in leaf order as they are computed, in a few whole-model buffers, instead
// of one buffer per leaf that the reducer's root reads once every leaf is in (docs/architecture.md,
// "Leaf gradients in a chain"). The running sum S_i = S_{i-1} + g_i is, element for element, the
// flat tree's left-to-right sum ((g_0 + g_1) + g_2) + ... (reduce::SourcesCallback's order), so
// a step that chains its leaves gets the weights the reducer would give, for every worker count.
//
// A replica takes a buffer before it claims a leaf, computes the leaf into it and completes it.
// The leaf whose predecessors are all summed is added into the running sum at once, on the
// completing thread, and so is every later leaf already waiting; a leaf that completes early
// waits in its buffer. With at least workers + 1 buffers a replica that finds none free waits
// only for a leaf being computed: then every taken buffer holds the running sum, a claimed leaf,
// or a finished leaf waiting for an earlier claimed one.
//
// Thread-safety: begin_step on the controller between steps; acquire, release, complete and abort
// from the replicas' threads, concurrently.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <vector>

#include "cohort/tensor/buffer.hpp"

namespace cohort::train {

class LeafChain {
 public:
  // `buffers` (at least 2) gradients of n floats each.
  LeafChain(std::size_t n, std::size_t buffers);

  // A step of `leaves` leaves: every buffer free, no leaf summed.
  void begin_step(std::size_t leaves);
  // A free buffer for the leaf the caller is about to claim; waits while none is free. Null once
  // the step is aborted.
  float* acquire();
  // A buffer taken for a claim that found no leaf left.
  void release(float* buffer);
  // Leaf `leaf`'s gradient is final in `buffer` (from acquire). Sums every leaf whose turn has
  // come; returns the step's sum (valid until the next begin_step) if this call added the last
  // leaf, null otherwise.
  const float* complete(std::size_t leaf, float* buffer);
  // A leaf will never complete (its replica failed): acquire returns null from now on.
  void abort();

  std::size_t buffers() const { return pool_.size(); }
  float* buffer(std::size_t i) { return pool_[i].data(); }

 private:
  const std::size_t n_;
  std::vector<AlignedBuffer<float>> pool_;
  std::mutex mutex_;
  std::condition_variable freed_;
  std::vector<float*> free_;   // buffers no leaf holds
  std::vector<float*> ready_;  // by leaf: finished and waiting for its turn (null: not)
  std::size_t leaves_ = 0;
  std::size_t next_ = 0;    // the next leaf to add
  float* sum_ = nullptr;    // S_{next - 1}: the sum of leaves [0, next)
  bool advancing_ = false;  // a thread is adding leaves (outside the lock)
  bool aborted_ = false;
};

}  // namespace cohort::train
