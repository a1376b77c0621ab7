// Trace spans per arena slot; see trace.hpp.
#include "trace.hpp"

#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <tuple>

namespace cohort::train {

Tracer::Tracer(std::size_t workers, bool enabled) : enabled_(enabled), workers_(workers) {
  if (!enabled_) return;
  slots_.resize(workers + 1);
  track_end_.resize(workers);
}

Tracer::Slot& Tracer::slot() {
  const int index = oneapi::tbb::this_task_arena::current_thread_index();
  const bool in_arena = index >= 0 && static_cast<std::size_t>(index) + 1 < slots_.size();
  return slots_[in_arena ? static_cast<std::size_t>(index) : slots_.size() - 1];
}

void Tracer::enter_replica(std::uint32_t track) {
  if (!enabled_) return;
  Slot& s = slot();
  s.step = step_;
  s.replica = track;
}

void Tracer::record(const char* name, std::uint32_t track, const char* index_name,
                    std::size_t index, Clock::time_point begin, Clock::time_point end) {
  if (!enabled_) return;
  Slot& s = slot();
  if (s.spans.size() >= kMaxSpans / slots_.size()) {
    full_.store(true, std::memory_order_relaxed);  // relaxed: read after the run
    return;
  }
  auto us = [&](Clock::time_point t) {
    return std::chrono::duration<double, std::micro>(t - origin_).count();
  };
  s.spans.push_back({name, track, step_, index_name, index, us(begin), us(end)});
  if (track < workers_) track_end_[track] = end;  // each replica track has one writer per step
}

void Tracer::root_span(const char* name, std::size_t chunk, Clock::time_point begin) {
  if (!enabled_) return;
  const Slot& s = slot();
  const std::uint32_t track = s.step == step_ ? s.replica : helper_track();
  record(name, track, "chunk", chunk, begin, Clock::now());
}

void Tracer::end_step(Clock::time_point step_begin, std::size_t replicas_run) {
  if (!enabled_) return;
  const auto now = Clock::now();
  for (std::uint32_t track = 0; track < replicas_run; ++track)
    if (track_end_[track] > step_begin) record("wait", track, nullptr, 0, track_end_[track], now);
  record("step", controller_track(), nullptr, 0, step_begin, now);
}

std::vector<TraceSpan> Tracer::spans() const {
  std::vector<TraceSpan> all;
  for (const auto& s : slots_) all.insert(all.end(), s.spans.begin(), s.spans.end());
  std::sort(all.begin(), all.end(), [](const TraceSpan& a, const TraceSpan& b) {
    return std::tie(a.track, a.begin_us, b.end_us) < std::tie(b.track, b.begin_us, a.end_us);
  });
  return all;
}

std::vector<std::string> Tracer::tracks() const {
  std::vector<std::string> names;
  for (std::size_t w = 0; w < workers_; ++w) names.push_back("replica " + std::to_string(w));
  names.push_back("root helpers");
  names.push_back("controller");
  return names;
}

}  // namespace cohort::train
