// A classification dataset held as uint8 pixels (IDX, uint8 .npy) or float32 features (float32
// .npy, CSV) with integer labels, loaded from a folder and validated (counts agree, every label
// below the class count, every feature finite) before training starts; the Sampler that orders
// each epoch; and batch assembly (pixels / 255 -> float; float features as given).
// Images and tables live in memory (Fashion-MNIST is 55 MB); a text split's tokens may be pages
// of files mapped read-only (tokens.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "cohort/data/tokens.hpp"
#include "cohort/tensor/bf16.hpp"

namespace cohort::data {

struct Dataset {
  std::string name;                // "train", "test"
  std::size_t count = 0;           // N
  std::size_t channels = 1;        // C: only (N, C, H, W) .npy files have C > 1
  std::size_t rows = 0, cols = 0;  // image height, width; tabular data: 1, features
  bool tabular = false;            // (N, features) .npy or CSV: no image shape
  std::size_t num_classes = 0;
  std::vector<std::uint8_t> images;   // (N, C, rows, cols) pixels, scaled by 1/255; or empty
  std::vector<float> float_features;  // (N, C, rows, cols) as given, when `images` is empty
  std::vector<std::uint32_t> labels;  // (N), each < num_classes
  // A text split (text.hpp, text_splits): windows of cols = block + 1 tokens of `tokens` at
  // offsets id * window_stride (1 for training: every offset; block for evaluation: the split
  // in non-overlapping windows). channels = rows = 1, tabular; num_classes is the vocabulary;
  // no labels (a window's targets are its own tokens, one position on).
  Tokens tokens;
  std::size_t window_stride = 0;  // 0: not text
  bool text() const { return window_stride != 0; }
  std::size_t features() const { return channels * rows * cols; }
  // "28x28 images", "3x32x32 images" or "784 tabular features", for messages.
  std::string describe_shape() const;
};

// The largest class count a dataset may have (labels are checked against it before anything
// is sized by it).
inline constexpr std::size_t kMaxClasses = std::size_t{1} << 16;

// Loads one split from an images/labels IDX pair and validates it. Throws InputError.
Dataset load_idx_pair(const std::filesystem::path& images, const std::filesystem::path& labels,
                      std::size_t num_classes, std::string name);

struct Splits {
  Dataset train, test;
  // Text from input.txt: the vocabulary's characters (code points) in token order; empty
  // otherwise (token arrays: tokens 0 .. vocabulary - 1).
  std::vector<std::uint32_t> characters;
};

// The four Fashion-MNIST / MNIST files in `dir`, each as `<name>.gz` or `<name>`:
// train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte.
// Also checks that train and test images have the same size.
Splits load_image_folder(const std::filesystem::path& dir, std::size_t num_classes = 10);

// `--data DIR`: dispatches on what `dir` holds -- the four IDX files (load_image_folder), the
// four .npy files train_x/train_y/test_x/test_y (load_npy_folder, npy.hpp), train.csv and
// test.csv (load_csv_folder, csv.hpp) or the folders train/ and test/ of class folders of PNG
// or JPEG images (load_class_folders, image_files.hpp). A folder with files of more than one set,
// or of none, is refused naming what was looked for. For .npy and CSV the class count is the
// largest label of both splits + 1; image folders have one class a training class folder; IDX
// keeps `num_classes`. Text (input.txt, or train_tokens.npy and val_tokens.npy: text.hpp) is read
// as windows of `text_block` + 1 tokens (text_splits), for a language model of that block; with
// text_block 0 (no such model) a text folder is refused. Throws InputError.
Splits load_data_folder(const std::filesystem::path& dir, std::size_t idx_num_classes = 10,
                        std::size_t text_block = 0);

// Whether `path` (existing or not; links followed) is data load_data_folder(dir) reads or could
// read: a file of any format's names directly in `dir` (input.txt, train_x.npy, train.csv, an
// llm.c shard's *_train_*.bin, ...)
// or anything under its train/ and test/ folders. The commands refuse such a path as an output.
bool is_data_file(const std::filesystem::path& dir, const std::filesystem::path& path);

// Checks what every loader promises: both splits non-empty, the same features per sample, the
// labels of both below `num_classes`, which both get. `test_source` names the test split's
// file(s) in messages.
void check_splits(Splits& s, const std::string& test_source);

// Reads a whole file into memory after checking it is a regular, non-empty file no larger than
// `max_bytes`. Throws InputError naming the path.
std::vector<std::uint8_t> read_file_bytes(const std::filesystem::path& path,
                                          std::uint64_t max_bytes);

// Debian's dataset-fashion-mnist package installs here.
inline const char* kDefaultDataDir = "/usr/share/datasets/fashion-mnist";

// Orders the samples of each epoch: a Fisher-Yates shuffle keyed by (seed, epoch), so epoch e's
// order is a pure function of the seed, whoever asks and however often. Or, for text windows
// (draws()), nanoGPT's sampling: each row of each batch an independent draw of a window, keyed by
// (seed, epoch, batch, row) — never by worker, leaf or rank — so windows repeat within an epoch
// as nanoGPT's do.
class Sampler {
 public:
  Sampler(std::size_t count, std::uint64_t seed, bool shuffle = true)
      : count_(count), seed_(seed), shuffle_(shuffle) {}
  // Epoch orders whose element b * batch + r is batch b's row r, drawn uniformly from [0, count).
  static Sampler draws(std::size_t count, std::uint64_t seed, std::size_t batch) {
    Sampler s(count, seed);
    s.draw_batch_ = batch;
    return s;
  }
  std::vector<std::uint32_t> epoch_order(std::uint64_t epoch) const;
  // draws(): batch b of `epoch` alone, its elements b * batch .. of epoch_order(epoch) (the last
  // batch possibly shorter), into `out` (resized).
  void draw_batch(std::uint64_t epoch, std::size_t b, std::vector<std::uint32_t>& out) const;
  bool is_draws() const { return draw_batch_ != 0; }
  std::size_t count() const { return count_; }

 private:
  std::size_t count_;
  std::uint64_t seed_;
  bool shuffle_;
  std::size_t draw_batch_ = 0;  // draws(): the batch; 0: a shuffle
};

// One epoch's batches of `batch` samples, in order: a shuffle's whole order, drawn when made; a
// draws() sampler's batches one at a time, when first asked, never the epoch's whole order (an
// epoch of a corpus has a window per token: its order would take 4 bytes a token). A batch's span
// stays valid, at the same address, while the next batch is asked for, and across a move of the
// object; asking for batch b + 2 reuses batch b's storage.
class EpochBatches {
 public:
  EpochBatches() = default;
  EpochBatches(const Sampler& sampler, std::uint64_t epoch, std::size_t batch);
  std::span<const std::uint32_t> batch(std::size_t b);
  bool empty() const { return sampler_ == nullptr; }

 private:
  const Sampler* sampler_ = nullptr;
  std::uint64_t epoch_ = 0;
  std::size_t batch_ = 0;
  std::vector<std::uint32_t> order_;  // a shuffle's
  std::vector<std::uint32_t> drawn_[2];
  std::size_t drawn_b_[2] = {SIZE_MAX, SIZE_MAX};
};

// Copies the samples `ids` into a batch: x (n, features) as float, pixel / 255 for `images`,
// as given for `float_features`, a text window's token ids as floats (exact: ids < 2^24);
// y (n) as int32 class ids (0 for text windows). x and y must have room for ids.size() rows.
void assemble_batch(const Dataset& set, std::span<const std::uint32_t> ids, float* x,
                    std::int32_t* y);
// The same rows straight into bf16, each value rounded once to nearest even: a pixel is
// to_bf16(pixel * (1 / 255)), which is to_bf16(pixel / 255) bit for bit for every byte value
// (tested; in f32 the two differ in the last bit for 126 of them), without a division and
// without an f32 copy of the rows. Not for text (its token ids would not survive bf16).
void assemble_batch(const Dataset& set, std::span<const std::uint32_t> ids, bf16* x,
                    std::int32_t* y);

}  // namespace cohort::data
