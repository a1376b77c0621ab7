// The executor through which reducers run chunk-parallel work, and two implementations free of
// TBB: InlineExecutor (serial) and ThreadTeam (a persistent team of std::threads for tests and
// benchmarks). The trainer backs Executor with tbb::parallel_for; nothing here includes TBB.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "cohort/core/function_ref.hpp"
#include "cohort/tensor/buffer.hpp"

namespace cohort::reduce {

// Runs body(i) for every i in [0, n) exactly once, possibly concurrently on several threads, and
// returns only after every call has returned (a fork-join). Everything body(i) wrote
// happens-before parallel_for returns.
// Thread-safety: parallel_for may be called concurrently from several threads (two tree nodes
// may combine at once); a body may itself call parallel_for (implementations may run it inline).
class Executor {
 public:
  virtual ~Executor() = default;
  virtual void parallel_for(std::size_t n, FunctionRef<void(std::size_t)> body) = 0;
};

// Runs every index on the calling thread, in order. Always correct; the serial reference path.
class InlineExecutor final : public Executor {
 public:
  void parallel_for(std::size_t n, FunctionRef<void(std::size_t)> body) override {
    for (std::size_t i = 0; i < n; ++i) body(i);
  }
};

// A persistent team of `size` threads: the caller of run() is member 0, size-1 std::threads are
// members 1..size-1. run(job) calls job(member) once on every member and returns when all have
// returned. A member that has finished its job helps with the chunks of parallel_for calls that
// other members issue, until the whole run ends — the way idle TBB workers steal chunks. So a
// combining tree's root pass, issued by the last arriver, uses every thread of the team.
//
// Thread-safety: run() is called by one thread at a time (the owner; it becomes member 0) and is
// not reentrant. parallel_for may be called from any member during a run (concurrently; each
// member has its own job slot); called from a thread that is not a member, or nested inside a
// chunk, it runs inline. The first exception thrown by a job is rethrown by run() after all
// members have returned (an exception escaping a parallel_for body terminates, as with noexcept).
// Lifetime: the destructor joins the threads; it must not run concurrently with run().
//
// Waiting: idle members spin briefly (pause), then yield, then sleep on a futex (atomic wait).
// Between back-to-back runs (a benchmark loop) they never reach the futex, so a step's handoff
// costs a cache-line transfer, not a wake-up.
//
// Memory ordering: run() publishes the job with a release store of run_state_ (new epoch) that
// members acquire; each member's completion is a release decrement of run_state_ that the owner
// acquires, so
// everything a job did happens-before run() returns. A parallel_for slot's job fields are written
// before a release store of its control word; helpers take a reference with an acquire CAS on the
// same word and drop it with a release decrement that the issuing member acquires before
// returning — so the chunk bodies' writes happen-before parallel_for returns, and the slot is never
// rewritten while a helper still reads it.
class ThreadTeam final : public Executor {
 public:
  explicit ThreadTeam(std::size_t size);
  ~ThreadTeam() override;
  ThreadTeam(const ThreadTeam&) = delete;
  ThreadTeam& operator=(const ThreadTeam&) = delete;

  std::size_t size() const { return size_; }
  void run(FunctionRef<void(std::size_t member)> job);
  void parallel_for(std::size_t n, FunctionRef<void(std::size_t)> body) override;

 private:
  struct alignas(kCacheLine) Slot {
    // Bit 63: a job is published; bits 0..62: helpers holding a reference to it.
    std::atomic<std::uint64_t> control{0};
    std::atomic<std::size_t> next_index{0};
    std::size_t n = 0;
    FunctionRef<void(std::size_t)> body;
  };
  static constexpr std::uint64_t kPublished = std::uint64_t{1} << 63;

  void member_main(std::size_t member);
  void announce_epoch(std::uint64_t state);
  void run_job(std::size_t member);
  // Helps one published slot if any; returns true if it ran at least one chunk.
  bool help_once(std::size_t self);
  static void run_chunks(Slot& slot);

  std::size_t size_;
  std::unique_ptr<Slot[]> slots_;
  FunctionRef<void(std::size_t)> job_;
  // High 32 bits: run epoch (changed only by the owner); low 32 bits: members still in their job.
  // One word, so a member lagging behind in the previous run's help loop sees the new epoch.
  alignas(kCacheLine) std::atomic<std::uint64_t> run_state_{0};
  // Incremented after each change of epoch: what idle members sleep on (a 32-bit futex word, so
  // notify_all with no sleeper costs a load).
  alignas(kCacheLine) std::atomic<std::uint32_t> wake_count_{0};
  std::atomic<bool> stopping_{false};
  std::mutex error_mutex_;
  std::exception_ptr error_;
  std::vector<std::thread> threads_;
};

namespace detail {
// Spins (pause) a little, then yields, then sleeps on the atomic until value != old.
// Returns the new value, loaded with acquire.
std::uint32_t wait_while_equal(const std::atomic<std::uint32_t>& value, std::uint32_t old);
std::uint64_t wait_while_equal(const std::atomic<std::uint64_t>& value, std::uint64_t old);
void cpu_relax();
}  // namespace detail

}  // namespace cohort::reduce
