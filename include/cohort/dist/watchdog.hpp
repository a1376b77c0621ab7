// The stall watchdog of a multi-rank run: a thread that calls `on_stall` once if `beat()` has not
// been called for `timeout` (a peer that hangs leaves every other rank waiting in a collective,
// where no exception can reach them). Not MPI-specific: on_stall decides what ending means.
//
// Thread-safety: beat() from any thread; construction and destruction on one thread. on_stall
// runs on the watchdog's own thread (it is expected not to return, e.g. MPI_Abort).
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
  // timeout <= 0: no thread, beat() does nothing.
  Watchdog(std::chrono::duration<double> timeout,
           std::function<void(double idle_seconds)> on_stall);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  void beat() { beats_.fetch_add(1, std::memory_order_relaxed); }

 private:
  void watch();

  const std::chrono::duration<double> timeout_;
  const std::function<void(double)> on_stall_;
  std::atomic<std::uint64_t> beats_{0};
  std::mutex mutex_;
  std::condition_variable stop_cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace cohort::dist
