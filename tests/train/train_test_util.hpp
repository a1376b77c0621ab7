// Shared by the train tests: the Fashion-MNIST fixture, loaded once, an observer that records
// every step's loss and every epoch's result, the name of a worker-count parameter, and the skip
// of a bf16 run where oneDNN has no bf16 at all.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cohort/data/dataset.hpp"
#include "cohort/nn/version.hpp"
#include "cohort/train/trainer.hpp"

// In a test body: skips the test where oneDNN cannot create a bf16 primitive (no AVX-512), where
// `--precision bf16` is refused (Bf16Refusal tests that). Emulated bf16 (AVX-512 without
// AVX512_BF16) runs: its bits are the native kernels' concern, not the promise's.
#define COHORT_SKIP_WITHOUT_BF16()                                         \
  if (::cohort::nn::bf16_support() == ::cohort::nn::Bf16Support::kNone)    \
  GTEST_SKIP() << "oneDNN has no bf16 kernels on this CPU (it dispatches " \
               << ::cohort::nn::onednn_isa() << "): --precision bf16 is refused here"

namespace cohort::train::testing {

inline const data::Splits& fixture() {
  static const data::Splits splits = data::load_image_folder(COHORT_FIXTURE_DIR);
  return splits;
}

class Recorder : public Observer {
 public:
  void on_step(const StepEvent& e) override {
    losses.push_back(e.loss);
    steps.push_back(e);
  }
  void on_epoch(const EpochResult& r) override { epochs.push_back(r); }
  std::vector<double> losses;
  std::vector<StepEvent> steps;
  std::vector<EpochResult> epochs;
};

// Workers/WorkerCount.Name/W3 for the parameter 3.
inline std::string worker_name(const ::testing::TestParamInfo<std::size_t>& info) {
  return "W" + std::to_string(info.param);
}

}  // namespace cohort::train::testing
