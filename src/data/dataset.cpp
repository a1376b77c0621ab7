// Dataset loading and validation, epoch ordering, batch assembly.
#include "cohort/data/dataset.hpp"

#include <cstring>
#include <numeric>

#include "cohort/core/error.hpp"
#include "cohort/core/rng.hpp"
#include "cohort/data/idx.hpp"

namespace cohort::data {

Dataset load_idx_pair(const std::filesystem::path& images_path,
                      const std::filesystem::path& labels_path, std::size_t num_classes,
                      std::string name) {
  IdxArray images = read_idx(images_path, 3);
  IdxArray labels = read_idx(labels_path, 1);
  if (labels.dims[0] != images.dims[0])
    throw InputError(labels_path.string() + ": dimension 0 (label count): expected " +
                     std::to_string(images.dims[0]) + " (the image count of " +
                     images_path.string() + "), found " + std::to_string(labels.dims[0]));
  for (std::size_t i = 0; i < labels.values.size(); ++i)
    if (labels.values[i] >= num_classes)
      throw InputError(labels_path.string() + ": label " + std::to_string(i) + " (byte offset " +
                       std::to_string(8 + i) + "): expected a class below " +
                       std::to_string(num_classes) + ", found " + std::to_string(labels.values[i]));
  Dataset set;
  set.name = std::move(name);
  set.count = images.dims[0];
  set.rows = images.dims[1];
  set.cols = images.dims[2];
  set.num_classes = num_classes;
  set.images = std::move(images.values);
  set.labels = std::move(labels.values);
  return set;
}

namespace {
std::filesystem::path find_file(const std::filesystem::path& dir, const std::string& stem) {
  for (const char* suffix : {".gz", ""}) {
    auto p = dir / (stem + suffix);
    if (std::filesystem::exists(p)) return p;
  }
  throw InputError(dir.string() + ": " + stem + "[.gz]: expected an existing file, found none " +
                   "(install Debian's dataset-fashion-mnist or pass --data DIR)");
}
}  // namespace

Splits load_image_folder(const std::filesystem::path& dir, std::size_t num_classes) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    throw InputError(dir.string() + ": data folder: expected a directory, found " +
                     (std::filesystem::exists(dir, ec) ? "a file" : "nothing") +
                     " (install Debian's dataset-fashion-mnist or pass --data DIR)");
  // Resolve the paths one by one so the first missing file is the one reported.
  auto train_images = find_file(dir, "train-images-idx3-ubyte");
  auto train_labels = find_file(dir, "train-labels-idx1-ubyte");
  auto test_images = find_file(dir, "t10k-images-idx3-ubyte");
  auto test_labels = find_file(dir, "t10k-labels-idx1-ubyte");
  Splits s;
  s.train = load_idx_pair(train_images, train_labels, num_classes, "train");
  s.test = load_idx_pair(test_images, test_labels, num_classes, "test");
  if (s.test.rows != s.train.rows || s.test.cols != s.train.cols)
    throw InputError(test_images.string() + ": image size: expected " +
                     std::to_string(s.train.rows) + "x" + std::to_string(s.train.cols) +
                     " (as in the training images), found " + std::to_string(s.test.rows) + "x" +
                     std::to_string(s.test.cols));
  return s;
}

std::vector<std::uint32_t> Sampler::epoch_order(std::uint64_t epoch) const {
  std::vector<std::uint32_t> order(count_);
  std::iota(order.begin(), order.end(), 0u);
  if (!shuffle_) return order;
  Rng rng({seed_, 0x5a3b1e5ull /* purpose: shuffle */, epoch});
  for (std::size_t i = count_; i > 1; --i) std::swap(order[i - 1], order[rng.below(i)]);
  return order;
}

void assemble_batch(const Dataset& set, std::span<const std::uint32_t> ids, float* x,
                    std::int32_t* y) {
  const std::size_t f = set.features();
  for (std::size_t r = 0; r < ids.size(); ++r) {
    COHORT_CHECK(ids[r] < set.count, "sample id out of range");
    const std::uint8_t* __restrict src = set.images.data() + static_cast<std::size_t>(ids[r]) * f;
    float* __restrict dst = x + r * f;
    // A true division, as torch_peer.py's `/ 255.0` in float32 (x * (1/255) differs in the last
    // bit for some pixels); it vectorises (convert + divide), unlike a table lookup.
    for (std::size_t i = 0; i < f; ++i) dst[i] = static_cast<float>(src[i]) / 255.0f;
    y[r] = set.labels[ids[r]];
  }
}

}  // namespace cohort::data
