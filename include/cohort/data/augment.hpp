// Seeded data augmentation fused into batch assembly (`--augment crop:4,flip,normalize,erase:0.5`):
// random crop of the zero-padded image, horizontal flip, per-channel normalization with the
// training set's statistics, random erasing, applied in that order while a row is converted from
// the source pixels to float -- no extra pass over memory. Every draw is keyed by (seed, epoch,
// sample id, operation), so an image's augmentation does not depend on the worker, the leaf, the
// rank, the step or its place in the batch, and a resumed run redraws the same images.
// Not a general transform pipeline: images only (tabular data refuses any augmentation).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cohort/data/dataset.hpp"

namespace cohort::data {

// What `--augment` asked for; the default is no augmentation.
struct AugmentConfig {
  std::size_t crop_pad = 0;  // crop:P -- random H x W crop of the image padded by P (1..16); 0: off
  bool flip = false;         // flip -- horizontal flip with probability 1/2
  float erase = 0;           // erase:P -- random erasing with probability P in (0, 1]; 0: off
  bool normalize = false;    // normalize -- (x - mean_c) / std_c of the training set, also in eval

  bool any() const { return crop_pad != 0 || flip || erase > 0 || normalize; }
  // Crop, flip or erase: the parts that apply to training rows only.
  bool random() const { return crop_pad != 0 || flip || erase > 0; }
};

inline constexpr std::size_t kMaxCropPad = 16;

// "crop:4,flip", "erase:0.25,normalize", ... (comma-separated, any order, each at most once;
// "" is none). Throws InputError naming --augment, the expected form and the token found.
AugmentConfig parse_augment(const std::string& spec);
// The canonical spec, in the order of application: "crop:4,flip,normalize,erase:0.5"; "" for none.
// parse_augment(to_string(c)) == c.
std::string to_string(const AugmentConfig& c);

// The random choices for one sample in one epoch: what `assemble` applies to it.
struct AugmentDraw {
  std::size_t dy = 0, dx = 0;  // crop offset into the padded image, each in [0, 2P]
  bool flip = false;
  bool erase = false;          // a rectangle was placed (the coin, then up to 10 tries)
  std::size_t ey = 0, ex = 0;  // erased rectangle: rows [ey, ey + eh), cols [ex, ex + ew)
  std::size_t eh = 0, ew = 0;
};

// Applies an AugmentConfig in batch assembly, holding the per-channel normalization statistics
// of the training set (computed once, at construction, in float64 over every training value:
// pixels / 255, or float features as given; population standard deviation).
//
// Thread-safety: immutable after construction; any number of threads may call assemble and draw
// at once (each draw builds its own keyed generator).
class Augmenter {
 public:
  // Throws InputError naming --augment if `config` asks for anything on tabular data, or for
  // normalize on a training set with a constant channel (standard deviation 0).
  Augmenter(const AugmentConfig& config, const Dataset& train, std::uint64_t seed);

  // As data::assemble_batch, then augmented: x (ids.size(), C, H, W) float, y (ids.size()) int32.
  // train: crop, flip, normalize, erase as configured, drawn for (epoch, ids[r]); !train (the
  // test set): normalize only, and `epoch` is unused. With nothing to apply, the bits of
  // assemble_batch. `set` must have the training set's sample shape.
  void assemble(const Dataset& set, std::span<const std::uint32_t> ids, std::uint64_t epoch,
                bool train, float* x, std::int32_t* y) const;

  // The draws of sample `id` in `epoch` for an image of `rows` x `cols` (a pure function of
  // the seed and those; fields of operations not configured stay at their defaults).
  AugmentDraw draw(std::uint64_t epoch, std::uint32_t id, std::size_t rows, std::size_t cols) const;

  const AugmentConfig& config() const { return config_; }
  // Per-channel mean and standard deviation of the training set (empty without normalize).
  const std::vector<float>& mean() const { return mean_; }
  const std::vector<float>& stddev() const { return std_; }

 private:
  AugmentConfig config_;
  std::uint64_t seed_;
  std::vector<float> mean_, std_;  // (C)
  std::vector<float> tables_;      // uint8 images: (C, 256), each pixel value as assembled
};

}  // namespace cohort::data
