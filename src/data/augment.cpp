// Seeded augmentation in batch assembly: the spec parser, the training set's statistics, the
// keyed draws and the fused crop / flip / normalize / erase conversion. See augment.hpp.
#include "cohort/data/augment.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <type_traits>

#include "cohort/core/error.hpp"
#include "cohort/core/rng.hpp"

namespace cohort::data {

namespace {

constexpr std::uint64_t kPurposeAugment = 0xa06e47a11ull;
// The operation word of a draw's key: each operation has its own stream, so adding or dropping
// one operation does not change another's draws.
constexpr std::uint64_t kOpCrop = 1, kOpFlip = 2, kOpErase = 3;
// torchvision.transforms.RandomErasing's defaults.
constexpr double kEraseMinArea = 0.02, kEraseMaxArea = 0.33;
constexpr double kEraseMinRatio = 0.3, kEraseMaxRatio = 3.3;
constexpr int kEraseTries = 10;

constexpr const char* kExpected =
    "--augment: expected crop:P (P in 1..16), flip, erase:P (P in (0,1]) or normalize, "
    "comma-separated, each at most once; found '";

[[noreturn]] void bad_token(const std::string& token, const std::string& more = "") {
  throw InputError(kExpected + token + "'" + more);
}

std::string trimmed(const std::string& s) {
  const auto first = s.find_first_not_of(" \t");
  if (first == std::string::npos) return "";
  return s.substr(first, s.find_last_not_of(" \t") - first + 1);
}

std::string float_text(float f) {
  char text[32];
  return std::string(text, std::to_chars(text, text + sizeof text, f).ptr);
}

// One source value as the network sees it: pixels / 255 (a true division, as assemble_batch),
// float features as given; then, with normalization, (x - mean) / std as torchvision's Normalize.
// A pixel's value is looked up in its channel's `table` (Augmenter::tables_), which holds exactly
// those operations' result for each of the 256 values: the same bits, and faster here than
// converting and dividing in rows of 24..28 values, whose remainders GCC runs one value at a time
// (bench/data_bench's augmentation cases against assemble_batch's; figures: benchmarks.md).
template <class T, bool kNormalize>
inline float value_of(T v, float mean, float std, const float* table) {
  if constexpr (std::is_same_v<T, std::uint8_t>) {
    return table[v];
  } else {
    float f = v;
    if constexpr (kNormalize) f = (f - mean) / std;
    return f;
  }
}

// Converts one sample (C, H, W) from `src` into `dst` with the draw `d` applied: the source is
// read at the cropped (and mirrored) coordinates, padding reads as the value of a 0 source, and
// the erased rectangle is written as 0 (after normalization).
template <class T, bool kNormalize>
void convert_sample(const T* __restrict src, float* __restrict dst, std::size_t C, std::size_t H,
                    std::size_t W, std::size_t pad, const AugmentDraw& d, const float* mean,
                    const float* stddev, const float* tables) {
  const std::size_t plane = H * W;
  const auto iH = static_cast<std::ptrdiff_t>(H), iW = static_cast<std::ptrdiff_t>(W);
  // Source column of output column x: x + off, or (flipped) W - 1 - x + off.
  const std::ptrdiff_t off_y = static_cast<std::ptrdiff_t>(d.dy) - static_cast<std::ptrdiff_t>(pad);
  const std::ptrdiff_t off = static_cast<std::ptrdiff_t>(d.dx) - static_cast<std::ptrdiff_t>(pad);
  const bool identity = off_y == 0 && off == 0 && !d.flip;
  // Output columns [x0, x1) read the image; the others read the padding.
  const std::ptrdiff_t x0 =
      d.flip ? std::max<std::ptrdiff_t>(0, off) : std::max<std::ptrdiff_t>(0, -off);
  const std::ptrdiff_t x1 = d.flip ? std::min(iW, iW + off) : std::min(iW, iW - off);
  for (std::size_t c = 0; c < C; ++c) {
    const float m = kNormalize ? mean[c] : 0.0f, s = kNormalize ? stddev[c] : 1.0f;
    const float* table = tables ? tables + c * 256 : nullptr;  // uint8 only
    const float padding = value_of<T, kNormalize>(T{0}, m, s, table);
    const T* __restrict in = src + c * plane;
    float* __restrict out = dst + c * plane;
    if (identity) {  // no geometry: one pass over the plane
      if constexpr (std::is_same_v<T, std::uint8_t> && !kNormalize)
        for (std::size_t i = 0; i < plane; ++i) out[i] = static_cast<float>(in[i]) / 255.0f;
      else  // (a whole plane of conversions vectorises; assemble_batch's loop, the same bits)
        for (std::size_t i = 0; i < plane; ++i)
          out[i] = value_of<T, kNormalize>(in[i], m, s, table);
      continue;
    }
    // The padding first, as one fill of the plane (in L1), then the rows that read the image.
    std::fill(out, out + plane, padding);
    if (x0 >= x1) continue;
    const std::ptrdiff_t y0 = std::max<std::ptrdiff_t>(0, -off_y), y1 = std::min(iH, iH - off_y);
    for (std::ptrdiff_t y = y0; y < y1; ++y) {
      float* __restrict row = out + static_cast<std::size_t>(y) * W;
      const T* __restrict line = in + static_cast<std::size_t>(y + off_y) * W;
      // Indices, not pointers shifted by the offset: those could point outside the image.
      if (d.flip) {
        const std::ptrdiff_t last = iW - 1 + off;  // row[x] = line[last - x]
        for (std::ptrdiff_t x = x0; x < x1; ++x)
          row[x] = value_of<T, kNormalize>(line[last - x], m, s, table);
      } else {
        for (std::ptrdiff_t x = x0; x < x1; ++x)
          row[x] = value_of<T, kNormalize>(line[x + off], m, s, table);
      }
    }
  }
  if (d.erase)
    for (std::size_t c = 0; c < C; ++c)
      for (std::size_t y = d.ey; y < d.ey + d.eh; ++y) {
        float* row = dst + c * plane + y * W;
        std::fill(row + d.ex, row + d.ex + d.ew, 0.0f);
      }
}

// The whole batch for one source type: rows in order, the next sample's source prefetched while
// one is converted (as assemble_batch).
template <class T, bool kNormalize>
void assemble_rows(const Augmenter& a, const Dataset& set, const T* values, const float* tables,
                   std::span<const std::uint32_t> ids, std::uint64_t epoch, bool random, float* x,
                   std::int32_t* y) {
  const std::size_t f = set.features();
  const std::size_t pad = random ? a.config().crop_pad : 0;
  for (std::size_t r = 0; r < ids.size(); ++r) {
    COHORT_CHECK(ids[r] < set.count, "sample id out of range");
    if (r + 1 < ids.size()) {
      const auto* next = reinterpret_cast<const char*>(values + std::size_t{ids[r + 1]} * f);
      for (std::size_t line = 0; line < f * sizeof(T); line += 64) __builtin_prefetch(next + line);
    }
    const AugmentDraw d = random ? a.draw(epoch, ids[r], set.rows, set.cols) : AugmentDraw{};
    convert_sample<T, kNormalize>(values + std::size_t{ids[r]} * f, x + r * f, set.channels,
                                  set.rows, set.cols, pad, d, a.mean().data(), a.stddev().data(),
                                  tables);
    y[r] = static_cast<std::int32_t>(set.labels[ids[r]]);
  }
}

}  // namespace

AugmentConfig parse_augment(const std::string& spec) {
  AugmentConfig c;
  if (trimmed(spec).empty()) return c;
  bool seen_crop = false, seen_flip = false, seen_erase = false, seen_normalize = false;
  auto once = [](bool& seen, const std::string& token) {
    if (seen) bad_token(token, " a second time");
    seen = true;
  };
  std::size_t begin = 0;
  for (;;) {
    const std::size_t comma = spec.find(',', begin);
    const std::string token =
        trimmed(spec.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin));
    const std::size_t colon = token.find(':');
    const std::string name = token.substr(0, colon);
    const std::string arg = colon == std::string::npos ? "" : token.substr(colon + 1);
    const char* const first = arg.data();
    const char* const last = arg.data() + arg.size();
    if (name == "flip" && colon == std::string::npos) {
      once(seen_flip, token);
      c.flip = true;
    } else if (name == "normalize" && colon == std::string::npos) {
      once(seen_normalize, token);
      c.normalize = true;
    } else if (name == "crop" && colon != std::string::npos) {
      std::size_t p = 0;
      const auto [end, ec] = std::from_chars(first, last, p);
      if (ec != std::errc() || end != last || p < 1 || p > kMaxCropPad) bad_token(token);
      once(seen_crop, token);
      c.crop_pad = p;
    } else if (name == "erase" && colon != std::string::npos) {
      float p = 0;
      const auto [end, ec] = std::from_chars(first, last, p);
      if (ec != std::errc() || end != last || !std::isfinite(p) || !(p > 0) || p > 1)
        bad_token(token);
      once(seen_erase, token);
      c.erase = p;
    } else {
      bad_token(token);
    }
    if (comma == std::string::npos) break;
    begin = comma + 1;
  }
  return c;
}

std::string to_string(const AugmentConfig& c) {
  std::string spec;
  auto add = [&](const std::string& token) { spec += (spec.empty() ? "" : ",") + token; };
  if (c.crop_pad != 0) add("crop:" + std::to_string(c.crop_pad));
  if (c.flip) add("flip");
  if (c.normalize) add("normalize");
  if (c.erase > 0) add("erase:" + float_text(c.erase));
  return spec;
}

Augmenter::Augmenter(const AugmentConfig& config, const Dataset& train, std::uint64_t seed)
    : config_(config), seed_(seed) {
  if (train.tabular && config.any())
    throw InputError("--augment: expected no augmentation on tabular data (" +
                     train.describe_shape() + "), found '" + to_string(config) +
                     "' (crop, flip, erase and normalize need images: .npy (N, [C,] H, W) or IDX)");
  if (!train.images.empty() && !config.normalize)  // each pixel value / 255, per channel
    for (std::size_t c = 0; c < train.channels; ++c)
      for (int v = 0; v < 256; ++v) tables_.push_back(static_cast<float>(v) / 255.0f);
  if (!config.normalize) return;
  const std::size_t C = train.channels, plane = train.rows * train.cols;
  std::vector<double> sum(C, 0.0), squares(C, 0.0);
  const double values = static_cast<double>(train.count) * static_cast<double>(plane);
  if (!train.images.empty()) {
    // Exact counts of each pixel value per channel; mean and variance from them in float64.
    std::vector<std::array<std::uint64_t, 256>> counts(C);
    for (auto& h : counts) h.fill(0);
    for (std::size_t n = 0; n < train.count; ++n)
      for (std::size_t c = 0; c < C; ++c) {
        const std::uint8_t* p = train.images.data() + (n * C + c) * plane;
        auto& h = counts[c];
        for (std::size_t i = 0; i < plane; ++i) ++h[p[i]];
      }
    for (std::size_t c = 0; c < C; ++c) {
      for (int v = 0; v < 256; ++v) sum[c] += static_cast<double>(counts[c][v]) * (v / 255.0);
      const double mean = sum[c] / values;
      for (int v = 0; v < 256; ++v) {
        const double d = v / 255.0 - mean;
        squares[c] += static_cast<double>(counts[c][v]) * d * d;
      }
    }
  } else {
    // Two passes in float64: the mean, then the squared deviations from it.
    for (std::size_t n = 0; n < train.count; ++n)
      for (std::size_t c = 0; c < C; ++c) {
        const float* p = train.float_features.data() + (n * C + c) * plane;
        for (std::size_t i = 0; i < plane; ++i) sum[c] += p[i];
      }
    for (std::size_t n = 0; n < train.count; ++n)
      for (std::size_t c = 0; c < C; ++c) {
        const float* p = train.float_features.data() + (n * C + c) * plane;
        const double mean = sum[c] / values;
        for (std::size_t i = 0; i < plane; ++i) {
          const double d = p[i] - mean;
          squares[c] += d * d;
        }
      }
  }
  for (std::size_t c = 0; c < C; ++c) {
    const double mean = sum[c] / values, std = std::sqrt(squares[c] / values);
    // Rounding leaves a constant channel a standard deviation of ~1e-17, not 0.
    if (!(std > 1e-6 * std::max(1.0, std::abs(mean))))
      throw InputError("--augment normalize: channel " + std::to_string(c) +
                       " of the training set: expected varying values, found a constant channel "
                       "(mean " +
                       std::to_string(mean) + ", standard deviation " + std::to_string(std) +
                       "); drop normalize");
    mean_.push_back(static_cast<float>(mean));
    std_.push_back(static_cast<float>(std));
    if (!train.images.empty())
      for (int v = 0; v < 256; ++v)
        tables_.push_back((static_cast<float>(v) / 255.0f - mean_.back()) / std_.back());
  }
}

AugmentDraw Augmenter::draw(std::uint64_t epoch, std::uint32_t id, std::size_t rows,
                            std::size_t cols) const {
  AugmentDraw d;
  if (config_.crop_pad != 0) {
    Rng rng({seed_, kPurposeAugment, epoch, id, kOpCrop});
    d.dy = static_cast<std::size_t>(rng.below(2 * config_.crop_pad + 1));
    d.dx = static_cast<std::size_t>(rng.below(2 * config_.crop_pad + 1));
  }
  if (config_.flip) {
    Rng rng({seed_, kPurposeAugment, epoch, id, kOpFlip});
    d.flip = rng.next_unit() < 0.5f;
  }
  if (config_.erase > 0) {
    Rng rng({seed_, kPurposeAugment, epoch, id, kOpErase});
    if (rng.next_unit() < config_.erase) {
      // torchvision's RandomErasing.get_params: an area fraction and a log-uniform aspect ratio,
      // kept only if the rectangle fits, up to 10 tries (else no erasing).
      const double area = static_cast<double>(rows) * static_cast<double>(cols);
      for (int t = 0; t < kEraseTries; ++t) {
        const double target =
            area * (kEraseMinArea + (kEraseMaxArea - kEraseMinArea) * rng.next_unit());
        const double log_ratio =
            std::log(kEraseMinRatio) + (std::log(kEraseMaxRatio) - std::log(kEraseMinRatio)) *
                                           static_cast<double>(rng.next_unit());
        const double ratio = std::exp(log_ratio);
        const auto h = static_cast<std::size_t>(std::lround(std::sqrt(target * ratio)));
        const auto w = static_cast<std::size_t>(std::lround(std::sqrt(target / ratio)));
        if (!(h < rows && w < cols)) continue;
        d.ey = static_cast<std::size_t>(rng.below(rows - h + 1));
        d.ex = static_cast<std::size_t>(rng.below(cols - w + 1));
        d.eh = h;
        d.ew = w;
        d.erase = true;
        break;
      }
    }
  }
  return d;
}

void Augmenter::assemble(const Dataset& set, std::span<const std::uint32_t> ids,
                         std::uint64_t epoch, bool train, float* x, std::int32_t* y) const {
  const bool random = train && config_.random();
  if (!random && !config_.normalize) {
    assemble_batch(set, ids, x, y);  // nothing to apply: exactly its bits
    return;
  }
  COHORT_CHECK(!set.tabular, "augmentation of tabular data (refused at construction)");
  COHORT_CHECK(!config_.normalize || mean_.size() == set.channels,
               "the set's channels differ from the training set's");
  COHORT_CHECK(set.images.empty() || tables_.size() == set.channels * 256,
               "uint8 rows with an Augmenter built on float32 training features");
  if (!set.images.empty()) {
    if (config_.normalize)
      assemble_rows<std::uint8_t, true>(*this, set, set.images.data(), tables_.data(), ids, epoch,
                                        random, x, y);
    else
      assemble_rows<std::uint8_t, false>(*this, set, set.images.data(), tables_.data(), ids, epoch,
                                         random, x, y);
  } else {
    if (config_.normalize)
      assemble_rows<float, true>(*this, set, set.float_features.data(), nullptr, ids, epoch, random,
                                 x, y);
    else
      assemble_rows<float, false>(*this, set, set.float_features.data(), nullptr, ids, epoch,
                                  random, x, y);
  }
}

}  // namespace cohort::data
