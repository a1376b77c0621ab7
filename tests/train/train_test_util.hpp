// Shared by the train tests: the Fashion-MNIST fixture, loaded once, and an observer that
// records every step's loss and every epoch's result.
#pragma once

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

}  // namespace cohort::train::testing
