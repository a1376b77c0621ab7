// Time accounting of the training steps: the clock, per-replica accounts, and the sum into the
// public TimeBreakdown (docs/architecture.md, "Observability"). Not a profiler: it adds up the
// spans the trainer already measures, once per step, on the controller.
#pragma once

#include <chrono>
#include <cstddef>
#include <span>

#include "cohort/nn/net.hpp"
#include "cohort/train/trainer.hpp"

namespace cohort::train {

struct ChunkStats;

using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// What one replica spent outside its Net in a step (the Net keeps its own PhaseTimes). Written
// only by the thread running the replica's node, read by the controller after the graph's wait.
struct ReplicaClock {
  double data = 0;    // batch assembly of its leaves
  double reduce = 0;  // inside reducer calls (contribute, finish), root chunks run there included
};

class TimeAccount {
 public:
  // The root's chunks of this step: their GEMM seconds, and with `fused` (the chunks applied the
  // optimizer as they summed) the rest as the optimizer's; a two-phase root's chunks only sum.
  // Chunks run outside a replica's reducer call (stolen by an idle thread, or on the parameter
  // server's thread) are reduce work of no replica, counted as busy time of their own. The
  // root's critical path is the wall time from its first chunk's start to its last chunk's end.
  void add_root(std::span<const ChunkStats> chunks, bool fused);
  // The second phase of the two-phase root: each chunk's optimizer seconds (apply_seconds) are
  // reduce work and busy time, as a fused chunk's; `wall` seconds (the phase, with a sharded
  // root's sending of its weights) join the critical path.
  void add_second_phase(std::span<const ChunkStats> chunks, double wall);
  void add_exchange(double seconds) { total_.exchange += seconds; }
  // Collects and clears one replica's accounts of the step (its clock and its Net's times).
  void add_replica(ReplicaClock& clock, nn::Net& net);
  // Ends the step: idle = workers x wall - everything collected since the last end_step.
  void end_step(double wall, std::size_t workers);
  const TimeBreakdown& total() const { return total_; }

 private:
  TimeBreakdown total_;
  double busy_ = 0;  // this step's busy seconds so far, over every thread
};

}  // namespace cohort::train
