// Dataset loading and validation, epoch ordering, batch assembly.
#include "cohort/data/dataset.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <fstream>
#include <numeric>

#include "cohort/core/cpu.hpp"
#include "cohort/core/error.hpp"
#include "cohort/core/rng.hpp"
#include "cohort/data/csv.hpp"
#include "cohort/data/idx.hpp"
#include "cohort/data/image_files.hpp"
#include "cohort/data/npy.hpp"
#include "cohort/data/text.hpp"
#include "pixels.hpp"

#ifdef COHORT_X86_DISPATCH
#include <immintrin.h>
#endif

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
  set.labels.assign(labels.values.begin(), labels.values.end());
  return set;
}

namespace {
std::filesystem::path find_file(const std::filesystem::path& dir, const std::string& stem) {
  for (const char* suffix : {".gz", ""}) {
    auto p = dir / (stem + suffix);
    std::error_code ec;  // a link loop is there: read_file_bytes names it
    if (std::filesystem::exists(std::filesystem::symlink_status(p, ec))) return p;
  }
  throw InputError(dir.string() + ": " + stem + "[.gz]: expected an existing file, found none " +
                   "(install Debian's dataset-fashion-mnist or pass --data DIR)");
}

void require_directory(const std::filesystem::path& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    throw InputError(dir.string() + ": data folder: expected a directory, found " +
                     (std::filesystem::exists(dir, ec) ? "a file" : "nothing") +
                     " (install Debian's dataset-fashion-mnist or pass --data DIR)");
}
}  // namespace

Splits load_image_folder(const std::filesystem::path& dir, std::size_t num_classes) {
  require_directory(dir);
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

std::string Dataset::describe_shape() const {
  if (text()) return "windows of " + std::to_string(cols) + " tokens";
  if (tabular) return std::to_string(features()) + " tabular features";
  return (channels != 1 ? std::to_string(channels) + "x" : std::string()) + std::to_string(rows) +
         "x" + std::to_string(cols) + " images";
}

void check_splits(Splits& s, const std::string& test_source) {
  const Dataset &train = s.train, &test = s.test;
  if (test.channels != train.channels || test.rows != train.rows || test.cols != train.cols ||
      test.tabular != train.tabular)
    throw InputError(test_source + ": sample shape: expected " + train.describe_shape() +
                     " (as in the training split), found " + test.describe_shape());
  if (test.images.empty() != train.images.empty())
    throw InputError(
        test_source + ": dtype: expected " + (train.images.empty() ? "float32" : "uint8") +
        " (as in the training split), found " + (test.images.empty() ? "float32" : "uint8"));
  const std::size_t classes = std::max(train.num_classes, test.num_classes);
  s.train.num_classes = s.test.num_classes = classes;
}

std::vector<std::uint8_t> read_file_bytes(const std::filesystem::path& path,
                                          std::uint64_t max_bytes) {
  auto fail = [&](const std::string& expected, const std::string& found) {
    throw InputError(path.string() + ": file: expected " + expected + ", found " + found);
  };
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(status))
    fail("an existing file",
         ec && ec != std::errc::no_such_file_or_directory ? ec.message() : "no such file");
  if (!std::filesystem::is_regular_file(status))
    fail("a regular file", "a directory or special file");
  const std::uint64_t size = std::filesystem::file_size(path, ec);
  if (ec) fail("a readable file", ec.message());
  if (size == 0) fail("a non-empty file", "0 bytes (empty)");
  if (size > max_bytes)
    fail("at most " + std::to_string(max_bytes) + " bytes", std::to_string(size) + " bytes");
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(size));
  std::ifstream in(path, std::ios::binary);
  if (!in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(size)))
    fail(std::to_string(size) + " readable bytes", "a read error");
  return bytes;
}

namespace {

// The files of each format load_data_folder reads directly in its folder; an image folder's are
// under train/ and test/.
struct FolderFormat {
  const char* what;
  std::vector<std::string> files;
};
const std::array<FolderFormat, 4>& folder_formats() {
  static const std::array<FolderFormat, 4> formats{{
      {"IDX",
       {"train-images-idx3-ubyte", "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte",
        "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte", "t10k-images-idx3-ubyte.gz",
        "t10k-labels-idx1-ubyte", "t10k-labels-idx1-ubyte.gz"}},
      {"NumPy", {"train_x.npy", "train_y.npy", "test_x.npy", "test_y.npy"}},
      {"CSV", {"train.csv", "test.csv"}},
      {"image folder", {"train", "test"}},
  }};
  return formats;
}

}  // namespace

bool is_data_file(const std::filesystem::path& dir, const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  std::error_code e;
  std::vector<std::string> names(std::begin(kTextFiles), std::end(kTextFiles));
  for (const FolderFormat& format : folder_formats())
    names.insert(names.end(), format.files.begin(), format.files.end());
  // A data file that is there, through links (a folder of links to the data elsewhere).
  if (fs::exists(path, e))
    for (const std::string& name : names)
      if (fs::exists(dir / name, e) && fs::equivalent(dir / name, path, e) && !e) return true;
  // A name the loader would read, there or not.
  const fs::path folder = fs::weakly_canonical(fs::absolute(dir, e), e);
  if (e) return false;
  const fs::path file = fs::weakly_canonical(fs::absolute(path, e), e);
  if (e) return false;
  const std::string name = file.filename().string();
  if (file.parent_path() == folder && (std::find(names.begin(), names.end(), name) != names.end() ||
                                       is_shard(name, "train") || is_shard(name, "val")))
    return true;
  // Anything under an image folder's train/ or test/, wherever a link takes them.
  for (const char* images : {"train", "test"}) {
    if (!fs::is_directory(folder / images, e)) continue;
    const fs::path tree = fs::weakly_canonical(folder / images, e);
    if (e) continue;
    const fs::path inside = file.lexically_relative(tree);
    if (!inside.empty() && *inside.begin() != ".." && *inside.begin() != ".") return true;
  }
  return false;
}

Splits load_data_folder(const std::filesystem::path& dir, std::size_t idx_num_classes,
                        std::size_t text_block) {
  require_directory(dir);
  if (is_text_folder(dir)) {
    if (text_block == 0)
      throw InputError(dir.string() +
                       ": data folder: holds text (input.txt or token arrays): expected --model "
                       "gpt:LAYERS-HEADS-EMBD-BLOCK, a language model, for it");
    return text_splits(load_text_folder(dir, text_block), text_block);
  }
  std::error_code ec;
  const auto& sets = folder_formats();
  // A set is present when any of its files is; the loader then names the first missing one.
  std::vector<std::size_t> present;
  for (std::size_t i = 0; i < sets.size(); ++i)
    for (const auto& f : sets[i].files)
      if (std::filesystem::exists(dir / f, ec)) {
        present.push_back(i);
        break;
      }
  if (present.size() > 1) {
    std::string found;
    for (std::size_t i : present)
      found += (found.empty() ? "" : " and ") + std::string(sets[i].what);
    throw InputError(dir.string() + ": data folder: expected the files of one format, found " +
                     found + " files (keep one set per folder)");
  }
  if (present.empty())
    throw InputError(
        dir.string() +
        ": data folder: expected one of: the IDX files train-images-idx3-ubyte, "
        "train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte (each "
        "optionally .gz); the NumPy files train_x.npy, train_y.npy, test_x.npy, test_y.npy; "
        "train.csv and test.csv; or the folders train/ and test/ of class folders of PNG or JPEG "
        "images; found none of them");
  switch (present[0]) {
    case 0:
      return load_image_folder(dir, idx_num_classes);
    case 1:
      return load_npy_folder(dir);
    case 2:
      return load_csv_folder(dir);
    default:
      return load_class_folders(dir);
  }
}

namespace {
std::uint32_t draw(std::uint64_t seed, std::uint64_t epoch, std::size_t b, std::size_t r,
                   std::size_t count) {
  Rng rng({seed, 0x77696e64ull /* purpose: windows */, epoch, b, r});
  return static_cast<std::uint32_t>(rng.below(count));
}
}  // namespace

void Sampler::draw_batch(std::uint64_t epoch, std::size_t b,
                         std::vector<std::uint32_t>& out) const {
  COHORT_CHECK(draw_batch_ != 0, "Sampler::draw_batch: not a draws() sampler");
  const std::size_t first = b * draw_batch_;
  out.resize(first < count_ ? std::min(draw_batch_, count_ - first) : 0);
  for (std::size_t r = 0; r < out.size(); ++r) out[r] = draw(seed_, epoch, b, r, count_);
}

std::vector<std::uint32_t> Sampler::epoch_order(std::uint64_t epoch) const {
  std::vector<std::uint32_t> order(count_);
  if (draw_batch_ != 0) {
    for (std::size_t j = 0; j < count_; ++j)
      order[j] = draw(seed_, epoch, j / draw_batch_, j % draw_batch_, count_);
    return order;
  }
  std::iota(order.begin(), order.end(), 0u);
  if (!shuffle_) return order;
  Rng rng({seed_, 0x5a3b1e5ull /* purpose: shuffle */, epoch});
  for (std::size_t i = count_; i > 1; --i) std::swap(order[i - 1], order[rng.below(i)]);
  return order;
}

EpochBatches::EpochBatches(const Sampler& sampler, std::uint64_t epoch, std::size_t batch)
    : sampler_(&sampler), epoch_(epoch), batch_(batch) {
  if (!sampler.is_draws()) order_ = sampler.epoch_order(epoch);
}

std::span<const std::uint32_t> EpochBatches::batch(std::size_t b) {
  if (!sampler_->is_draws()) {
    const std::size_t first = std::min(b * batch_, order_.size());
    return std::span<const std::uint32_t>(order_).subspan(first,
                                                          std::min(batch_, order_.size() - first));
  }
  const std::size_t slot = b % 2;
  if (drawn_b_[slot] != b) {
    sampler_->draw_batch(epoch_, b, drawn_[slot]);
    drawn_b_[slot] = b;
  }
  return drawn_[slot];
}

namespace detail {

namespace {
constexpr float kInv255 = 1.0f / 255.0f;

#ifdef COHORT_X86_DISPATCH
COHORT_TARGET_AVX512_BF16_BEGIN
namespace avx512_bf16 {  // the namespace tests/build/check_baseline_isa.py lets past x86-64-v3
// VCVTNEPS2BF16 rounds to nearest even, as to_bf16 does; a pixel times 1/255 is 0 or a normal
// float (never a NaN or a subnormal, which the two treat apart), so the bits are the same.
void pixels_to_bf16(const std::uint8_t* __restrict src, bf16* __restrict dst, std::size_t n) {
  const __m512 scale = _mm512_set1_ps(kInv255);
  for (std::size_t i = 0; i < n; i += 16) {
    const auto m = static_cast<__mmask16>(n - i >= 16 ? 0xffffu : (1u << (n - i)) - 1);
    // The maskz forms: GCC 12 warns that the plain ones' "undefined" pass-through is
    // uninitialized.
    const __m512i bytes = _mm512_maskz_cvtepu8_epi32(m, _mm_maskz_loadu_epi8(m, src + i));
    const __m256bh h = _mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_maskz_cvtepi32_ps(m, bytes), scale));
    _mm256_mask_storeu_epi16(dst + i, m, reinterpret_cast<__m256i>(h));
  }
}
}  // namespace avx512_bf16
COHORT_TARGET_END
#endif
}  // namespace

bool pixels_in_lanes16() {
#ifdef COHORT_X86_DISPATCH
  return cpu_features().avx512_bf16_kernels();
#else
  return false;
#endif
}

void pixels_to_bf16(const std::uint8_t* __restrict src, bf16* __restrict dst, std::size_t n,
                    bool lanes16) {
#ifdef COHORT_X86_DISPATCH
  if (lanes16) return avx512_bf16::pixels_to_bf16(src, dst, n);
#else
  (void)lanes16;
#endif
  for (std::size_t i = 0; i < n; ++i) dst[i] = to_bf16(static_cast<float>(src[i]) * kInv255);
}

}  // namespace detail

namespace {
// One row of the batch from sample `offset`: f32 pixels as a true division by 255 (as
// torch_peer.py's `/ 255.0` in float32; x * (1/255) differs in the last bit for some pixels),
// which vectorises (convert + divide), unlike a table lookup; bf16 pixels by the multiply, the
// same bits once rounded (dataset.hpp).
void convert_row(const Dataset& set, std::size_t offset, float* __restrict dst) {
  const std::size_t f = set.features();
  if (set.images.empty()) {
    std::memcpy(dst, set.float_features.data() + offset, f * sizeof(float));
    return;
  }
  const std::uint8_t* __restrict src = set.images.data() + offset;
  for (std::size_t i = 0; i < f; ++i) dst[i] = static_cast<float>(src[i]) / 255.0f;
}
void convert_row(const Dataset& set, std::size_t offset, bf16* __restrict dst) {
  const std::size_t f = set.features();
  if (set.images.empty()) {
    to_bf16(set.float_features.data() + offset, dst, f);
    return;
  }
  detail::pixels_to_bf16(set.images.data() + offset, dst, f, detail::pixels_in_lanes16());
}

template <class T>
void assemble(const Dataset& set, std::span<const std::uint32_t> ids, T* x, std::int32_t* y) {
  const std::size_t f = set.features();
  if (set.text()) {
    if constexpr (std::is_same_v<T, float>) {
      for (std::size_t r = 0; r < ids.size(); ++r) {
        COHORT_CHECK(ids[r] < set.count, "window id out of range");
        set.tokens.copy_to(std::size_t{ids[r]} * set.window_stride, f, x + r * f);
        y[r] = 0;
      }
      return;
    } else {
      COHORT_CHECK(false, "text windows are assembled as floats (token ids do not survive bf16)");
    }
  }
  for (std::size_t r = 0; r < ids.size(); ++r) {
    COHORT_CHECK(ids[r] < set.count, "sample id out of range");
    // The next sample's image is at a random place in the set: ask for its lines now, so they
    // arrive while this one is converted.
    if (!set.images.empty() && r + 1 < ids.size()) {
      const std::uint8_t* next = set.images.data() + static_cast<std::size_t>(ids[r + 1]) * f;
      for (std::size_t line = 0; line < f; line += 64) __builtin_prefetch(next + line);
    }
    convert_row(set, static_cast<std::size_t>(ids[r]) * f, x + r * f);
    y[r] = static_cast<std::int32_t>(set.labels[ids[r]]);
  }
}
}  // namespace

void assemble_batch(const Dataset& set, std::span<const std::uint32_t> ids, float* x,
                    std::int32_t* y) {
  assemble(set, ids, x, y);
}

void assemble_batch(const Dataset& set, std::span<const std::uint32_t> ids, bf16* x,
                    std::int32_t* y) {
  assemble(set, ids, x, y);
}

}  // namespace cohort::data
