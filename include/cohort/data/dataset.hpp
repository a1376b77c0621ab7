// An image-classification dataset held as uint8 pixels and uint8 labels, loaded from an IDX pair
// and validated (counts agree, every label below the class count) before training starts;
// the Sampler that orders each epoch; and batch assembly (pixels / 255 -> float).
// Not a streaming loader: Fashion-MNIST is 55 MB and lives in memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

namespace cohort::data {

struct Dataset {
  std::string name;                // "train", "test"
  std::size_t count = 0;           // N
  std::size_t rows = 0, cols = 0;  // image height, width
  std::size_t num_classes = 0;
  std::vector<std::uint8_t> images;  // (N, rows, cols)
  std::vector<std::uint8_t> labels;  // (N)
  std::size_t features() const { return rows * cols; }
};

// Loads one split from an images/labels IDX pair and validates it. Throws InputError.
Dataset load_idx_pair(const std::filesystem::path& images, const std::filesystem::path& labels,
                      std::size_t num_classes, std::string name);

struct Splits {
  Dataset train, test;
};

// The four Fashion-MNIST / MNIST files in `dir`, each as `<name>.gz` or `<name>`:
// train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte.
// Also checks that train and test images have the same size.
Splits load_image_folder(const std::filesystem::path& dir, std::size_t num_classes = 10);

// Debian's dataset-fashion-mnist package installs here.
inline const char* kDefaultDataDir = "/usr/share/datasets/fashion-mnist";

// Orders the samples of each epoch: a Fisher-Yates shuffle keyed by (seed, epoch), so epoch e's
// order is a pure function of the seed, whoever asks and however often.
class Sampler {
 public:
  Sampler(std::size_t count, std::uint64_t seed, bool shuffle = true)
      : count_(count), seed_(seed), shuffle_(shuffle) {}
  std::vector<std::uint32_t> epoch_order(std::uint64_t epoch) const;
  std::size_t count() const { return count_; }

 private:
  std::size_t count_;
  std::uint64_t seed_;
  bool shuffle_;
};

// Copies the samples `ids` into a batch: x (n, features) as float in [0, 1] (pixel / 255),
// y (n) as int32 class ids. x and y must have room for ids.size() rows.
void assemble_batch(const Dataset& set, std::span<const std::uint32_t> ids, float* x,
                    std::int32_t* y);

}  // namespace cohort::data
