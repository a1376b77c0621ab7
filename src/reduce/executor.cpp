// ThreadTeam and the waiting helpers. Plain std::threads and atomics only, so ThreadSanitizer sees
// every synchronisation (no bare fences).
#include "cohort/reduce/executor.hpp"

#include "cohort/core/error.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace cohort::reduce {

namespace detail {

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

namespace {
// Spin a few hundred nanoseconds, then yield the core (the machine may be oversubscribed).
constexpr int kSpins = 64;
constexpr int kYields = 4000;

template <typename T>
T wait_while_equal_impl(const std::atomic<T>& value, T old) {
  T now;
  for (int i = 0; i < kSpins; ++i) {
    // acquire: the caller reads what the writer published before changing the value.
    if ((now = value.load(std::memory_order_acquire)) != old) return now;
    cpu_relax();
  }
  for (int i = 0; i < kYields; ++i) {
    if ((now = value.load(std::memory_order_acquire)) != old) return now;  // acquire: as above
    std::this_thread::yield();
  }
  for (;;) {
    value.wait(old, std::memory_order_acquire);  // acquire: as above; writers notify_all
    if ((now = value.load(std::memory_order_acquire)) != old) return now;  // acquire: as above
  }
}
}  // namespace

std::uint32_t wait_while_equal(const std::atomic<std::uint32_t>& value, std::uint32_t old) {
  return wait_while_equal_impl(value, old);
}
std::uint64_t wait_while_equal(const std::atomic<std::uint64_t>& value, std::uint64_t old) {
  return wait_while_equal_impl(value, old);
}

}  // namespace detail

namespace {

struct Backoff {
  int spins = 0;
  void pause() {
    if (spins < 64) {
      ++spins;
      detail::cpu_relax();
    } else {
      std::this_thread::yield();
    }
  }
};

constexpr std::uint64_t epoch_of(std::uint64_t state) { return state >> 32; }
constexpr std::uint64_t remaining_of(std::uint64_t state) { return state & 0xffffffffu; }

// Which team the current thread is a member of (if any), and whether it is inside a chunk body or
// an issued parallel_for (then a nested parallel_for runs inline).
thread_local const void* tl_team = nullptr;
thread_local std::size_t tl_member = 0;
thread_local bool tl_in_parallel = false;

}  // namespace

ThreadTeam::ThreadTeam(std::size_t size) : size_(size), slots_(new Slot[size]) {
  COHORT_CHECK(size >= 1 && size < (std::size_t{1} << 31), "ThreadTeam: size out of range");
  threads_.reserve(size - 1);
  for (std::size_t m = 1; m < size; ++m) threads_.emplace_back([this, m] { member_main(m); });
}

ThreadTeam::~ThreadTeam() {
  stopping_.store(true, std::memory_order_relaxed);  // relaxed: published by the release below
  const std::uint64_t state = run_state_.load(std::memory_order_relaxed);  // relaxed: owner's own
  // release (inside): members that acquire the new epoch see stopping_ == true.
  announce_epoch((epoch_of(state) + 1) << 32);
  for (auto& t : threads_) t.join();
}

void ThreadTeam::member_main(std::size_t member) {
  tl_team = this;
  tl_member = member;
  std::uint64_t seen_epoch = 0;
  for (;;) {
    // acquire: pairs with announce_epoch's release store; job_ and stopping_ are visible after it.
    std::uint64_t state = run_state_.load(std::memory_order_acquire);
    Backoff backoff;
    for (int spins = 0; epoch_of(state) == seen_epoch; ++spins) {
      if (spins < 4096) {
        backoff.pause();  // back-to-back runs (a benchmark) never get past this
      } else {
        // acquire: if the count already moved, the new epoch is visible to the load below.
        const std::uint32_t wake = wake_count_.load(std::memory_order_acquire);
        state = run_state_.load(std::memory_order_acquire);  // acquire: as above
        if (epoch_of(state) != seen_epoch) break;
        wake_count_.wait(wake, std::memory_order_acquire);  // acquire: as above
      }
      state = run_state_.load(std::memory_order_acquire);  // acquire: as above
    }
    // relaxed: ordered by the acquire of the new epoch above.
    if (stopping_.load(std::memory_order_relaxed)) return;
    seen_epoch = epoch_of(state);
    run_job(member);
  }
}

void ThreadTeam::run_job(std::size_t member) {
  try {
    job_(member);
  } catch (...) {
    const std::lock_guard lock(error_mutex_);
    if (!error_) error_ = std::current_exception();
  }
  // acq_rel: release publishes this member's job writes to the owner; acquire gives us the epoch.
  const std::uint64_t before = run_state_.fetch_sub(1, std::memory_order_acq_rel);
  const std::uint64_t epoch = epoch_of(before);
  // Help the others' parallel_for chunks until every member has finished its job in this run.
  Backoff backoff;
  for (;;) {
    // acquire: the owner, seeing 0, then reads all members' writes.
    const std::uint64_t state = run_state_.load(std::memory_order_acquire);
    if (epoch_of(state) != epoch || remaining_of(state) == 0) return;
    if (help_once(member)) {
      backoff = Backoff{};
    } else {
      backoff.pause();
    }
  }
}

void ThreadTeam::run(FunctionRef<void(std::size_t member)> job) {
  COHORT_CHECK(tl_team == nullptr, "ThreadTeam::run: called from inside a team");
  job_ = job;
  error_ = nullptr;
  const std::uint64_t state = run_state_.load(std::memory_order_relaxed);  // relaxed: owner's own
  announce_epoch(((epoch_of(state) + 1) << 32) | size_);
  tl_team = this;
  tl_member = 0;
  run_job(0);
  tl_team = nullptr;
  if (error_) std::rethrow_exception(error_);
}

void ThreadTeam::announce_epoch(std::uint64_t state) {
  // release: publishes job_, error_ and stopping_ to members, which acquire the new epoch.
  run_state_.store(state, std::memory_order_release);
  // release: a member that sees the new count also sees the new epoch (it reloads run_state_).
  wake_count_.fetch_add(1, std::memory_order_release);
  wake_count_.notify_all();
}

void ThreadTeam::run_chunks(Slot& slot) {
  for (;;) {
    // relaxed: only uniqueness of indices matters; the job fields were acquired via control.
    const std::size_t i = slot.next_index.fetch_add(1, std::memory_order_relaxed);
    if (i >= slot.n) return;
    slot.body(i);
  }
}

bool ThreadTeam::help_once(std::size_t self) {
  for (std::size_t k = 1; k < size_; ++k) {
    Slot& slot = slots_[(self + k) % size_];
    // relaxed: a hint only; the CAS below acquires.
    std::uint64_t control = slot.control.load(std::memory_order_relaxed);
    if ((control & kPublished) == 0) continue;
    // acquire: pairs with the issuer's release publication of n, body and next_index.
    if (!slot.control.compare_exchange_strong(control, control + 1, std::memory_order_acquire,
                                              std::memory_order_relaxed)) {
      continue;
    }
    tl_in_parallel = true;
    run_chunks(slot);
    tl_in_parallel = false;
    // release: our chunk bodies' writes happen-before the issuer sees the reference dropped.
    slot.control.fetch_sub(1, std::memory_order_release);
    return true;
  }
  return false;
}

void ThreadTeam::parallel_for(std::size_t n, FunctionRef<void(std::size_t)> body) {
  if (n == 0) return;
  if (n == 1 || tl_team != this || tl_in_parallel) {
    for (std::size_t i = 0; i < n; ++i) body(i);
    return;
  }
  Slot& slot = slots_[tl_member];
  slot.n = n;
  slot.body = body;
  slot.next_index.store(0, std::memory_order_relaxed);  // relaxed: published by the release below
  slot.control.store(kPublished, std::memory_order_release);  // release: publishes the job
  tl_in_parallel = true;
  run_chunks(slot);
  tl_in_parallel = false;
  // acq_rel: stop new helpers; acquire pairs with helpers that already dropped their reference.
  slot.control.fetch_and(~kPublished, std::memory_order_acq_rel);
  Backoff backoff;
  // acquire: pairs with each helper's release decrement, so their chunk writes are visible.
  while (slot.control.load(std::memory_order_acquire) != 0) backoff.pause();
}

}  // namespace cohort::reduce
