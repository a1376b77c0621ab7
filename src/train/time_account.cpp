// Per-step time accounting; see time_account.hpp.
#include "time_account.hpp"

#include <algorithm>

#include "cohort/train/root.hpp"

namespace cohort::train {

void TimeAccount::add_root(std::span<const ChunkStats> chunks, bool fused) {
  TimePoint first = TimePoint::max(), last = TimePoint::min();
  for (const ChunkStats& c : chunks) {
    if (c.begin == TimePoint{}) continue;  // not run (an abandoned chunk)
    const double seconds = std::chrono::duration<double>(c.end - c.begin).count();
    // The root's GEMMs are compute (matmul), not reduction.
    if (fused) total_.optimizer += seconds - c.gemm_seconds;
    total_.weight_grad += c.gemm_seconds;
    total_.matmul += c.gemm_seconds;
    total_.compute += c.gemm_seconds;
    if (c.inside_reducer_call) {
      total_.reduce -= c.gemm_seconds;  // the replica's reducer call counted it
    } else {
      total_.reduce += seconds - c.gemm_seconds;
      busy_ += seconds;
    }
    first = std::min(first, c.begin);
    last = std::max(last, c.end);
  }
  if (first < last) total_.reduce_critical += std::chrono::duration<double>(last - first).count();
}

void TimeAccount::add_second_phase(std::span<const ChunkStats> chunks, double wall) {
  for (const ChunkStats& c : chunks) {
    total_.optimizer += c.apply_seconds;
    total_.reduce += c.apply_seconds;
    busy_ += c.apply_seconds;
  }
  total_.reduce_critical += wall;
}

void TimeAccount::add_replica(ReplicaClock& clock, nn::Net& net) {
  const nn::PhaseTimes& t = net.times();
  total_.matmul += t.matmul;
  total_.attention += t.attention;
  total_.eltwise += t.eltwise;
  total_.loss += t.loss;
  total_.other += t.other;
  total_.compute += t.total();
  total_.data += clock.data;
  total_.reduce += clock.reduce;
  busy_ += t.total() + clock.data + clock.reduce;
  net.reset_times();
  clock = {};
}

void TimeAccount::end_step(double wall, std::size_t workers) {
  total_.step += wall;
  total_.idle += std::max(0.0, static_cast<double>(workers) * wall - busy_);
  busy_ = 0;
}

}  // namespace cohort::train
