// The stall watchdog of a multi-rank run: a thread that calls `on_stall` once if `beat()` has not
// been called for `timeout` (a peer that hangs leaves every other rank waiting in a collective,
// where no exception can reach them). Not MPI-specific: on_stall decides what ending means.
//
// Time between pause() and resume() is not idle time: a rank that waits on purpose (rank 0
// writing a checkpoint, the other ranks waiting for that write) is not stalled.
//
// Thread-safety: beat(), pause() and resume() from any thread; construction and destruction on
// one thread. on_stall runs on the watchdog's own thread (it is expected not to return, e.g.
// MPI_Abort).
// Memory ordering: beats_ is a counter compared with itself (relaxed); resume() counts a beat
// before it releases paused_, and check() acquires paused_ before it reads the beats, so a check
// that sees the pause over also sees resume()'s beat and counts the timeout from that check.
// The clock is injectable: with `now` given, no thread runs and the owner calls check() (tests
// drive it with a clock of their own, so no assertion depends on the machine's timing).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace cohort::dist {

class Watchdog {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  // timeout <= 0: no thread, beat() does nothing. Otherwise a thread checks a few times per
  // timeout (at most once a second), so a stall is caught within timeout + one period.
  Watchdog(std::chrono::duration<double> timeout,
           std::function<void(double idle_seconds)> on_stall);
  // No thread: check() reads `now`.
  Watchdog(std::chrono::duration<double> timeout, std::function<void(double idle_seconds)> on_stall,
           std::function<TimePoint()> now);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  void beat() { beats_.fetch_add(1, std::memory_order_relaxed); }

  // Stop counting idle time until the matching resume(); pairs may nest. After the last
  // resume() the timeout counts afresh, as after a beat.
  void pause() { paused_.fetch_add(1, std::memory_order_relaxed); }
  void resume() {
    beat();
    paused_.fetch_sub(1, std::memory_order_release);
  }

  // Calls on_stall (once in the watchdog's life) when no beat came for `timeout` of the clock's
  // time since the last change seen by a check (or construction); returns whether it did.
  bool check();

 private:
  void watch();

  const std::chrono::duration<double> timeout_;
  const std::function<void(double)> on_stall_;
  const std::function<TimePoint()> now_;
  std::atomic<std::uint64_t> beats_{0};
  std::atomic<int> paused_{0};  // pause() calls not yet resumed
  std::uint64_t seen_ = 0;      // check()'s state (one thread: the watchdog's, or the owner's)
  TimePoint last_change_;
  bool fired_ = false;
  std::mutex mutex_;
  std::condition_variable stop_cv_;
  bool stop_ = false;
  std::thread thread_;
};

// pause() for the life of a scope, resume() at its end; nothing for a null watchdog.
class WatchdogPause {
 public:
  explicit WatchdogPause(Watchdog* dog) : dog_(dog) {
    if (dog_) dog_->pause();
  }
  ~WatchdogPause() {
    if (dog_) dog_->resume();
  }
  WatchdogPause(const WatchdogPause&) = delete;
  WatchdogPause& operator=(const WatchdogPause&) = delete;

 private:
  Watchdog* dog_;
};

}  // namespace cohort::dist
