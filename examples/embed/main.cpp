// cohort as a library: build a model from a spec, train it on a data folder with an Observer
// that prints progress, save a checkpoint and export it for PyTorch (safetensors). Built against an
// installed cohort (find_package(cohort), see CMakeLists.txt beside it); not a CLI (that is `cohort
// train`).
//
//   embed DATA_DIR CHECKPOINT [STEPS]
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>

#include "cohort/checkpoint/checkpoint.hpp"
#include "cohort/core/error.hpp"
#include "cohort/data/dataset.hpp"
#include "cohort/export/export.hpp"
#include "cohort/nn/model.hpp"
#include "cohort/train/trainer.hpp"

namespace train = cohort::train;

// Called on the thread that runs Trainer::run, between steps.
class PrintProgress : public train::Observer {
 public:
  void on_step(const train::StepEvent& e) override {
    std::printf("step %llu/%llu  loss %.4f  lr %.4f\n", static_cast<unsigned long long>(e.step),
                static_cast<unsigned long long>(e.total_steps), e.loss, e.lr);
  }
  void on_epoch(const train::EpochResult& r) override {
    std::printf("epoch %zu  test accuracy %.4f\n", r.epoch + 1, r.test_accuracy);
  }
};

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s DATA_DIR CHECKPOINT [STEPS]\n", argv[0]);
    return 2;
  }
  try {
    const cohort::data::Splits data = cohort::data::load_data_folder(argv[1]);  // IDX, .npy or CSV
    train::TrainConfig config;
    config.model = "mlp:784-64-10";  // any spec `cohort train --model` takes
    config.batch = 64;
    config.steps = argc > 3 ? std::stoull(argv[3]) : 20;
    config.optimizer.lr = 0.05f;
    // The spec parsed on its own (shapes only, nothing allocated); the Trainer does it again.
    const auto model =
        cohort::nn::Model::parse(config.model, {1, static_cast<std::int64_t>(data.train.rows),
                                                static_cast<std::int64_t>(data.train.cols)});
    std::printf("%s: %zu parameters\n", config.model.c_str(), model.layout().numel());

    train::Trainer trainer(config, data);  // validates config against data (InputError)
    PrintProgress progress;
    const train::Summary s = trainer.run(progress);
    std::printf("%llu steps, %.0f samples/s, test accuracy %.4f, weights %s\n",
                static_cast<unsigned long long>(s.steps), s.samples_per_second, s.test_accuracy,
                s.weights_digest.c_str());

    // The second argument is stored as the checkpoint's config (JSON, free-form here).
    cohort::checkpoint::save_checkpoint(argv[2], trainer.checkpoint(R"({"tool":"embed"})"));
    std::printf("checkpoint %s\n", argv[2]);

    const std::string exported = std::string(argv[2]) + ".safetensors";  // or Format::kOnnx
    cohort::exporting::export_checkpoint(argv[2], cohort::exporting::Format::kSafetensors,
                                         exported);
    std::printf("exported %s\n", exported.c_str());
    return 0;
  } catch (const cohort::InputError& e) {
    std::fprintf(stderr, "embed: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "embed: internal error: %s\n", e.what());
    return 1;
  }
}
