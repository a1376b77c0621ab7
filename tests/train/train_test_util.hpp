// Shared by the train tests: the Fashion-MNIST fixture, loaded once, an observer that records
// every step's loss and every epoch's result, and the name of a worker-count parameter.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cohort/data/dataset.hpp"
#include "cohort/train/trainer.hpp"

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
