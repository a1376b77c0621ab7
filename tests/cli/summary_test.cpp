// The summary's roofline line (cli::print_summary): it names what the floor counted, oneDNN's
// rate and the sweep as timed alone, or the run's own time where a part timed alone was slower
// (train/roofline.hpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>
#include <string>

#include "cohort/train/trainer.hpp"
#include "progress.hpp"

namespace cohort::cli {
namespace summary_test {

std::string roofline_line(const train::Roofline& r) {
  train::Summary s;
  s.roofline = r;
  std::ostringstream out;
  print_summary(out, s);
  const std::string text = out.str();
  const auto at = text.find("  roofline a step:");
  if (at == std::string::npos) return "";
  return text.substr(at, text.find('\n', at) - at);
}

train::Roofline floor_of(double gemm_alone, double run_gemm, double sweep, double run_root) {
  train::Roofline r;
  r.gemm_alone_seconds = gemm_alone;
  r.run_gemm_seconds = run_gemm;
  r.gemm_seconds = std::min(gemm_alone, run_gemm);
  r.root_bytes = 10.84e6;
  r.sweep_seconds = sweep;
  r.run_root_seconds = run_root;
  r.root_seconds = std::min(sweep, run_root);
  r.floor_seconds = r.gemm_seconds + r.root_seconds;
  r.step_seconds = 0.002;
  r.fraction = r.floor_seconds / r.step_seconds;
  return r;
}

TEST(SummaryRoofline, NamesTheTimedPartsOrTheRunsOwnWhereTheyWereFaster) {
  EXPECT_EQ(roofline_line(floor_of(0.0014, 0.0016, 0.00005, 0.0002)),
            "  roofline a step: GEMMs at oneDNN's rate 1.400 ms + root sweep of 10.84 MB 0.050 ms "
            "= 1.450 ms; step 2.000 ms: 72.5% of the roofline");
  EXPECT_EQ(roofline_line(floor_of(0.0025, 0.0016, 0.00005, 0.0002)),
            "  roofline a step: GEMMs as the run ran them 1.600 ms (timed alone 2.500 ms, slower) "
            "+ root sweep of 10.84 MB 0.050 ms = 1.650 ms; step 2.000 ms: 82.5% of the roofline");
  EXPECT_EQ(roofline_line(floor_of(0.0014, 0.0016, 0.0003, 0.0002)),
            "  roofline a step: GEMMs at oneDNN's rate 1.400 ms + root as the run ran it, 10.84 MB "
            "0.200 ms (timed alone 0.300 ms, slower) = 1.600 ms; step 2.000 ms: 80.0% of the "
            "roofline");
  EXPECT_EQ(roofline_line(train::Roofline{}), "");  // no step measured: no line
}

}  // namespace summary_test
}  // namespace cohort::cli
