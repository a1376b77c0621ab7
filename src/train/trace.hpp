// Trace recording for --trace: timed spans of each step's phases, kept in one buffer per arena
// slot (slots are unique among running threads, so no locks) plus one for threads outside the
// arena (the controller, the parameter server). Not a file writer: the CLI turns the spans into a
// Chrome trace.
//
// Thread-safety: record/root_span from the thread doing the work; enter_replica on a replica's
// thread before its spans; begin_step, end_step and the readers on the controller between steps.
// A span recorded outside the arena goes to the shared outside buffer: only the controller and the
// parameter server's thread record there, never at once (the controller waits for the server).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "cohort/train/trainer.hpp"
#include "time_account.hpp"

namespace cohort::train {

class Tracer {
 public:
  static constexpr std::size_t kMaxSpans = std::size_t{1} << 21;

  // Tracks: replica 0 .. W-1, then the root's helpers, then the controller. Disabled: every call
  // is a no-op and callers skip their clock reads (check on()).
  Tracer(std::size_t workers, bool enabled);
  bool on() const { return enabled_; }
  std::uint32_t helper_track() const { return static_cast<std::uint32_t>(workers_); }
  std::uint32_t controller_track() const { return helper_track() + 1; }

  void begin_step(std::uint64_t step) { step_ = step; }
  // The calling thread runs replica `track` in this step: root chunks it takes go on that track.
  void enter_replica(std::uint32_t track);
  // [begin, end) on `track`; `index_name` ("leaf", "chunk" or null) says what `index` counts.
  void record(const char* name, std::uint32_t track, const char* index_name, std::size_t index,
              Clock::time_point begin, Clock::time_point end);
  // A root chunk's span, on the track of the replica this thread ran in this step (else the
  // helpers' track).
  void root_span(const char* name, std::size_t chunk, Clock::time_point begin);
  // The step's "wait" spans (each replica track that ran, from its last span to now) and the
  // step itself on the controller's track.
  void end_step(Clock::time_point step_begin, std::size_t replicas_run);

  std::vector<TraceSpan> spans() const;  // by track, then start; enclosing spans first
  std::vector<std::string> tracks() const;
  bool truncated() const { return full_.load(std::memory_order_relaxed); }

 private:
  struct Slot {
    std::vector<TraceSpan> spans;
    std::uint64_t step = 0;  // the step in which this slot's thread last entered a replica
    std::uint32_t replica = 0;
  };
  Slot& slot();

  const bool enabled_;
  const std::size_t workers_;
  const Clock::time_point origin_ = Clock::now();
  std::uint64_t step_ = 0;                    // set by the controller before the step's tasks
  std::vector<Slot> slots_;                   // arena slots, then one for outside the arena
  std::vector<Clock::time_point> track_end_;  // per replica track: its latest span's end
  std::atomic<bool> full_{false};
};

}  // namespace cohort::train
