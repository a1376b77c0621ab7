// The stall watchdog; see include/cohort/dist/watchdog.hpp.
#include "cohort/dist/watchdog.hpp"

#include <algorithm>

namespace cohort::dist {

Watchdog::Watchdog(std::chrono::duration<double> timeout,
                   std::function<void(double idle_seconds)> on_stall,
                   std::function<TimePoint()> now)
    : timeout_(timeout),
      on_stall_(std::move(on_stall)),
      now_(std::move(now)),
      last_change_(now_()) {}

Watchdog::Watchdog(std::chrono::duration<double> timeout,
                   std::function<void(double idle_seconds)> on_stall)
    : Watchdog(timeout, std::move(on_stall), [] { return std::chrono::steady_clock::now(); }) {
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

bool Watchdog::check() {
  if (fired_ || timeout_.count() <= 0) return false;
  const bool paused = paused_.load(std::memory_order_acquire) > 0;  // before the beats
  const std::uint64_t beats = beats_.load(std::memory_order_relaxed);
  const TimePoint now = now_();
  if (paused || beats != seen_) {
    seen_ = beats;
    last_change_ = now;
    return false;
  }
  const std::chrono::duration<double> idle = now - last_change_;
  if (idle < timeout_) return false;
  fired_ = true;
  on_stall_(idle.count());
  return true;
}

void Watchdog::watch() {
  const auto period = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::min(timeout_ / 4, std::chrono::duration<double>(1.0)));
  std::unique_lock lock(mutex_);
  while (!stop_cv_.wait_for(lock, period, [this] { return stop_; })) {
    lock.unlock();
    const bool fired = check();
    lock.lock();
    if (fired) return;
  }
}

}  // namespace cohort::dist
