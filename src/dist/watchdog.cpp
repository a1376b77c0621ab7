// The stall watchdog; see include/cohort/dist/watchdog.hpp.
#include "cohort/dist/watchdog.hpp"

#include <algorithm>

namespace cohort::dist {

Watchdog::Watchdog(std::chrono::duration<double> timeout,
                   std::function<void(double idle_seconds)> on_stall)
    : timeout_(timeout), on_stall_(std::move(on_stall)) {
  if (timeout_.count() > 0) thread_ = std::thread([this] { watch(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Watchdog::watch() {
  using Clock = std::chrono::steady_clock;
  // Checks a few times per timeout (at most once a second), so a stall is caught within
  // timeout + one period.
  const auto period = std::chrono::duration_cast<Clock::duration>(
      std::min(timeout_ / 4, std::chrono::duration<double>(1.0)));
  std::uint64_t seen = beats_.load(std::memory_order_relaxed);
  auto last_change = Clock::now();
  std::unique_lock lock(mutex_);
  while (!stop_cv_.wait_for(lock, period, [this] { return stop_; })) {
    const std::uint64_t now_beats = beats_.load(std::memory_order_relaxed);
    const auto now = Clock::now();
    if (now_beats != seen) {
      seen = now_beats;
      last_change = now;
      continue;
    }
    const std::chrono::duration<double> idle = now - last_change;
    if (idle >= timeout_) {
      lock.unlock();
      on_stall_(idle.count());
      return;
    }
  }
}

}  // namespace cohort::dist
