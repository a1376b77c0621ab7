// Augmentation (data/augment.hpp): the spec parser; crop and flip against a naive float64
// pad-crop-mirror reference; draws keyed by (seed, epoch, sample), never by the batch; the rates
// and offsets of many draws against their stated distributions; normalization against the
// training set's statistics; and no augmentation as assemble_batch, bit for bit.
#include "cohort/data/augment.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cohort/core/error.hpp"

namespace cohort::data {
namespace augment_test {

constexpr std::uint64_t kSeed = 20261201;  // of every test's data and draws (printed)

// A uint8 image set (N, C, H, W) of random pixels, channel c drawn from [0, 256 - 60 c) so the
// channels have different statistics; labels cycle through 10 classes.
Dataset random_images(std::size_t n, std::size_t C, std::size_t H, std::size_t W,
                      std::uint64_t seed = kSeed) {
  Dataset set;
  set.name = "train";
  set.count = n;
  set.channels = C;
  set.rows = H;
  set.cols = W;
  set.num_classes = 10;
  std::mt19937_64 gen(seed);
  set.images.resize(n * C * H * W);
  for (std::size_t s = 0; s < n; ++s)
    for (std::size_t c = 0; c < C; ++c)
      for (std::size_t i = 0; i < H * W; ++i)
        set.images[(s * C + c) * H * W + i] = static_cast<std::uint8_t>(gen() % (256 - 60 * c));
  for (std::size_t s = 0; s < n; ++s) set.labels.push_back(static_cast<std::uint32_t>(s % 10));
  return set;
}

// The same shape as float32 features (a .npy float32 image set), values in [-2, 3).
Dataset random_float_images(std::size_t n, std::size_t C, std::size_t H, std::size_t W) {
  Dataset set = random_images(n, C, H, W);
  std::mt19937_64 gen(kSeed + 1);
  std::uniform_real_distribution<float> u(-2.0f, 3.0f);
  set.float_features.resize(set.images.size());
  for (float& v : set.float_features) v = u(gen);
  set.images.clear();
  return set;
}

std::vector<std::uint32_t> iota_ids(std::size_t n) {
  std::vector<std::uint32_t> ids(n);
  for (std::size_t i = 0; i < n; ++i) ids[i] = static_cast<std::uint32_t>(i);
  return ids;
}

// Assembles `ids` of `set` and returns the rows.
std::vector<float> assembled(const Augmenter& a, const Dataset& set,
                             const std::vector<std::uint32_t>& ids, std::uint64_t epoch,
                             bool train = true) {
  std::vector<float> x(ids.size() * set.features());
  std::vector<std::int32_t> y(ids.size());
  a.assemble(set, ids, epoch, train, x.data(), y.data());
  for (std::size_t r = 0; r < ids.size(); ++r) EXPECT_EQ(y[r], static_cast<int>(ids[r] % 10));
  return x;
}

bool same_bits(const float* a, const float* b, std::size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

// --- the naive reference, float64 -----------------------------------------------------------

// Sample `id` of `set` as float64 values the network sees (pixels / 255, or as given).
std::vector<double> source_image(const Dataset& set, std::uint32_t id) {
  const std::size_t f = set.features();
  std::vector<double> v(f);
  for (std::size_t i = 0; i < f; ++i)
    v[i] = set.images.empty() ? set.float_features[id * f + i] : set.images[id * f + i] / 255.0;
  return v;
}

// The horizontal mirror of a (C, H, W) image.
std::vector<double> mirror(const std::vector<double>& v, std::size_t C, std::size_t H,
                           std::size_t W) {
  std::vector<double> out(v.size());
  for (std::size_t c = 0; c < C; ++c)
    for (std::size_t y = 0; y < H; ++y)
      for (std::size_t x = 0; x < W; ++x)
        out[(c * H + y) * W + x] = v[(c * H + y) * W + (W - 1 - x)];
  return out;
}

// Pad by P zeros on each side, take the H x W window at (dy, dx) of the padded image, mirror it
// if the draw says so: bench/peers/torch_peer.py's `crop_and_mirror`, spelled out.
std::vector<double> reference_crop_flip(const std::vector<double>& image, std::size_t C,
                                        std::size_t H, std::size_t W, std::size_t P,
                                        const AugmentDraw& d) {
  const std::size_t PH = H + 2 * P, PW = W + 2 * P;
  std::vector<double> padded(C * PH * PW, 0.0);
  for (std::size_t c = 0; c < C; ++c)
    for (std::size_t y = 0; y < H; ++y)
      for (std::size_t x = 0; x < W; ++x)
        padded[(c * PH + y + P) * PW + x + P] = image[(c * H + y) * W + x];
  std::vector<double> out(C * H * W);
  for (std::size_t c = 0; c < C; ++c)
    for (std::size_t y = 0; y < H; ++y)
      for (std::size_t x = 0; x < W; ++x) {
        // The window stays inside the padded image.
        EXPECT_LT(y + d.dy, PH);
        EXPECT_LT(x + d.dx, PW);
        out[(c * H + y) * W + x] = padded.at((c * PH + y + d.dy) * PW + x + d.dx);
      }
  return d.flip ? mirror(out, C, H, W) : out;
}

// --- the spec ---------------------------------------------------------------------------------

TEST(AugmentSpec, ParsesEveryOperationAndPrintsTheCanonicalSpec) {
  EXPECT_FALSE(parse_augment("").any());
  const AugmentConfig a = parse_augment("crop:4,flip");
  EXPECT_EQ(a.crop_pad, 4u);
  EXPECT_TRUE(a.flip);
  EXPECT_FALSE(a.normalize);
  EXPECT_EQ(a.erase, 0.0f);
  EXPECT_EQ(to_string(a), "crop:4,flip");
  const AugmentConfig b = parse_augment("erase:0.25, normalize,crop:16,flip");
  EXPECT_EQ(b.crop_pad, 16u);
  EXPECT_TRUE(b.flip && b.normalize);
  EXPECT_EQ(b.erase, 0.25f);
  EXPECT_EQ(to_string(b), "crop:16,flip,normalize,erase:0.25");  // the order of application
  EXPECT_EQ(to_string(parse_augment(to_string(b))), to_string(b));
  EXPECT_EQ(to_string(parse_augment("erase:1")), "erase:1");
  EXPECT_EQ(to_string(parse_augment("normalize")), "normalize");
  EXPECT_EQ(to_string(AugmentConfig{}), "");
}

struct BadSpec {
  const char* name;   // the test's parameter name
  const char* spec;   // what --augment was given
  const char* token;  // the token the message must quote
};

void PrintTo(const BadSpec& b, std::ostream* os) { *os << "'" << b.spec << "'"; }

class AugmentSpecError : public ::testing::TestWithParam<BadSpec> {};

TEST_P(AugmentSpecError, IsAnInputErrorNamingTheFlagTheFormAndTheToken) {
  const BadSpec& b = GetParam();
  try {
    parse_augment(b.spec);
    FAIL() << "accepted '" << b.spec << "'";
  } catch (const InputError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("--augment: expected crop:P (P in 1..16), flip, erase:P (P in (0,1]) or "
                         "normalize, comma-separated",
                         0),
              0u)
        << what;
    EXPECT_NE(what.find(std::string("found '") + b.token + "'"), std::string::npos) << what;
  }
}

INSTANTIATE_TEST_SUITE_P(Augment, AugmentSpecError,
                         ::testing::Values(BadSpec{"CropNotANumber", "crop:x", "crop:x"},
                                           BadSpec{"CropWithoutPad", "crop", "crop"},
                                           BadSpec{"CropZero", "flip,crop:0", "crop:0"},
                                           BadSpec{"CropAbove16", "crop:17", "crop:17"},
                                           BadSpec{"CropNegative", "crop:-1", "crop:-1"},
                                           BadSpec{"CropTrailingText", "crop:4px", "crop:4px"},
                                           BadSpec{"EraseZero", "erase:0", "erase:0"},
                                           BadSpec{"EraseAboveOne", "erase:1.5", "erase:1.5"},
                                           BadSpec{"EraseNan", "erase:nan", "erase:nan"},
                                           BadSpec{"EraseWithoutP", "erase", "erase"},
                                           BadSpec{"FlipWithArgument", "flip:0.5", "flip:0.5"},
                                           BadSpec{"UnknownName", "crop:4,rotate", "rotate"},
                                           BadSpec{"EmptyToken", "crop:4,,flip", ""},
                                           BadSpec{"TrailingComma", "flip,", ""},
                                           BadSpec{"Twice", "flip,normalize,flip", "flip"},
                                           BadSpec{"CropTwice", "crop:2,crop:4", "crop:4"}),
                         [](const ::testing::TestParamInfo<BadSpec>& p) {
                           return std::string(p.param.name);
                         });

// --- keyed draws --------------------------------------------------------------------------

const AugmentConfig kAll = parse_augment("crop:4,flip,erase:0.5,normalize");

TEST(Augmenter, NoAugmentationIsAssembleBatchBitwise) {
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  for (const Dataset& set : {random_images(40, 1, 28, 28), random_float_images(40, 3, 8, 5)}) {
    const std::vector<std::uint32_t> ids{7, 3, 39, 0, 3, 12, 25};
    std::vector<float> expected(ids.size() * set.features());
    std::vector<std::int32_t> y(ids.size());
    assemble_batch(set, ids, expected.data(), y.data());
    const Augmenter none(AugmentConfig{}, set, kSeed);
    EXPECT_TRUE(same_bits(assembled(none, set, ids, 0).data(), expected.data(), expected.size()));
    // Crop, flip and erase apply to training rows only: evaluation rows are assemble_batch's.
    const Augmenter random_only(parse_augment("crop:4,flip,erase:1"), set, kSeed);
    EXPECT_TRUE(same_bits(assembled(random_only, set, ids, 5, /*train=*/false).data(),
                          expected.data(), expected.size()));
    EXPECT_FALSE(
        same_bits(assembled(random_only, set, ids, 5).data(), expected.data(), expected.size()));
  }
}

TEST(Augmenter, AnImageDependsOnSeedEpochAndSampleOnlyNotOnTheBatch) {
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  const Dataset set = random_images(64, 1, 28, 28);
  const Augmenter a(kAll, set, kSeed);
  const std::size_t f = set.features();
  // Two batches holding sample 5, 17 and 40 at different positions, with different company.
  const std::vector<std::uint32_t> one{5, 17, 40, 2}, two{40, 63, 9, 17, 5};
  const std::vector<float> x1 = assembled(a, set, one, 3), x2 = assembled(a, set, two, 3);
  EXPECT_TRUE(same_bits(&x1[0 * f], &x2[4 * f], f));  // sample 5
  EXPECT_TRUE(same_bits(&x1[1 * f], &x2[3 * f], f));  // sample 17
  EXPECT_TRUE(same_bits(&x1[2 * f], &x2[0 * f], f));  // sample 40
  // Assembled one at a time (a leaf of one row), the same.
  for (std::size_t r = 0; r < one.size(); ++r)
    EXPECT_TRUE(same_bits(assembled(a, set, {one[r]}, 3).data(), &x1[r * f], f)) << one[r];
  // Another epoch or another seed draws differently for (nearly) every sample.
  const std::vector<std::uint32_t> ids = iota_ids(64);
  const std::vector<float> e3 = assembled(a, set, ids, 3), e4 = assembled(a, set, ids, 4);
  const Augmenter other_seed(kAll, set, kSeed + 1);
  const std::vector<float> s2 = assembled(other_seed, set, ids, 3);
  int epoch_differs = 0, seed_differs = 0;
  for (std::size_t r = 0; r < ids.size(); ++r) {
    epoch_differs += !same_bits(&e3[r * f], &e4[r * f], f);
    seed_differs += !same_bits(&e3[r * f], &s2[r * f], f);
  }
  // Equal draws for a sample: crop 1/81 x flip 1/2 x erase alike; a few at most.
  EXPECT_GE(epoch_differs, 60);
  EXPECT_GE(seed_differs, 60);
  EXPECT_TRUE(same_bits(e3.data(), assembled(a, set, ids, 3).data(), e3.size()));  // repeatable
}

// --- crop and flip against the reference ---------------------------------------------------

struct Geometry {
  const char* name;
  bool float_features;
  std::size_t C, H, W, P;
};

void PrintTo(const Geometry& g, std::ostream* os) { *os << g.name; }

class AugmentReference : public ::testing::TestWithParam<Geometry> {};

// Every pixel of many augmented images equals the float64 pad-crop-mirror of the source, exactly
// (one correctly rounded division from uint8, or the float as given): crops read the right
// pixels, padding reads as 0, flips mirror the crop.
TEST_P(AugmentReference, CropFlipEqualsTheNaivePadCropMirror) {
  const Geometry& g = GetParam();
  std::printf("seed %llu, %s\n", static_cast<unsigned long long>(kSeed), g.name);
  const std::size_t n = 50;
  const Dataset set =
      g.float_features ? random_float_images(n, g.C, g.H, g.W) : random_images(n, g.C, g.H, g.W);
  AugmentConfig config;
  config.crop_pad = g.P;
  config.flip = true;
  const Augmenter a(config, set, kSeed);
  const std::vector<std::uint32_t> ids = iota_ids(n);
  const std::size_t f = set.features();
  std::size_t flips = 0, mismatches = 0;
  for (std::uint64_t epoch = 0; epoch < 8; ++epoch) {
    const std::vector<float> x = assembled(a, set, ids, epoch);
    for (std::uint32_t id : ids) {
      const AugmentDraw d = a.draw(epoch, id, g.H, g.W);
      ASSERT_LE(d.dy, 2 * g.P);
      ASSERT_LE(d.dx, 2 * g.P);
      flips += d.flip;
      const std::vector<double> ref =
          reference_crop_flip(source_image(set, id), g.C, g.H, g.W, g.P, d);
      for (std::size_t i = 0; i < f; ++i)
        if (static_cast<float>(ref[i]) != x[id * f + i] && ++mismatches < 5)
          ADD_FAILURE() << "epoch " << epoch << " sample " << id << " value " << i << ": "
                        << x[id * f + i] << " != " << ref[i] << " (dy " << d.dy << ", dx " << d.dx
                        << ", flip " << d.flip << ")";
    }
  }
  EXPECT_EQ(mismatches, 0u);
  EXPECT_GT(flips, 0u);  // both branches ran
  EXPECT_LT(flips, 8 * n);
}

INSTANTIATE_TEST_SUITE_P(
    Augment, AugmentReference,
    ::testing::Values(Geometry{"Mnist28x28Pad4", false, 1, 28, 28, 4},
                      Geometry{"Rgb3x32x32Pad2", false, 3, 32, 32, 2},
                      Geometry{"Narrow2x5x7Pad1", false, 2, 5, 7, 1},
                      Geometry{"PadLargerThanImage1x5x3Pad16", false, 1, 5, 3, 16},
                      Geometry{"Float3x9x11Pad4", true, 3, 9, 11, 4}),
    [](const ::testing::TestParamInfo<Geometry>& p) { return std::string(p.param.name); });

TEST(AugmentReference, MirrorTwiceIsTheIdentityAndFlipIsAMirror) {
  const Dataset set = random_images(200, 2, 6, 9);
  const std::vector<double> image = source_image(set, 3);
  EXPECT_EQ(mirror(mirror(image, 2, 6, 9), 2, 6, 9), image);
  EXPECT_NE(mirror(image, 2, 6, 9), image);
  // Flip alone: every row is the source or its mirror, as the draw says; both occur.
  AugmentConfig flip_only;
  flip_only.flip = true;
  const Augmenter a(flip_only, set, kSeed);
  const std::vector<std::uint32_t> ids = iota_ids(200);
  const std::vector<float> x = assembled(a, set, ids, 1);
  std::size_t flipped = 0;
  for (std::uint32_t id : ids) {
    const std::vector<double> src = source_image(set, id);
    const bool flip = a.draw(1, id, 6, 9).flip;
    flipped += flip;
    const std::vector<double> want = flip ? mirror(src, 2, 6, 9) : src;
    for (std::size_t i = 0; i < want.size(); ++i)
      ASSERT_EQ(x[id * set.features() + i], static_cast<float>(want[i])) << id << " " << i;
  }
  EXPECT_GT(flipped, 50u);
  EXPECT_LT(flipped, 150u);
}

// --- the distributions of many draws ------------------------------------------------------
// Counts over many (epoch, sample) keys against their stated distributions, with bounds of
// about 5 standard deviations (a chi-square at p ~ 1e-6): with the fixed seed these are fixed
// numbers, and a flip applied always or never, a constant crop or a wrong erase rate fails.

TEST(AugmentStats, FlipRateIsOneHalf) {
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  const Dataset set = random_images(1, 1, 28, 28);
  const Augmenter a(parse_augment("flip"), set, kSeed);
  const std::size_t n = 40000;
  std::size_t flips = 0;
  for (std::size_t k = 0; k < n; ++k)
    flips += a.draw(k / 10000, static_cast<std::uint32_t>(k % 10000), 28, 28).flip;
  std::printf("flips %zu of %zu\n", flips, n);
  EXPECT_NEAR(static_cast<double>(flips), n / 2.0, 5 * std::sqrt(n * 0.25));
}

TEST(AugmentStats, CropOffsetsAreUniformOverZeroTo2P) {
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  const Dataset set = random_images(1, 1, 28, 28);
  const std::size_t P = 4, bins = 2 * P + 1, n = 81000;
  const Augmenter a(parse_augment("crop:4"), set, kSeed);
  std::vector<double> dy(bins), dx(bins), joint(bins * bins);
  for (std::size_t k = 0; k < n; ++k) {
    const AugmentDraw d = a.draw(k / 20000, static_cast<std::uint32_t>(k % 20000), 28, 28);
    ASSERT_LT(d.dy, bins);
    ASSERT_LT(d.dx, bins);
    ++dy[d.dy];
    ++dx[d.dx];
    ++joint[d.dy * bins + d.dx];
  }
  auto chi_square = [](const std::vector<double>& counts, double expected) {
    double chi = 0;
    for (double c : counts) chi += (c - expected) * (c - expected) / expected;
    return chi;
  };
  const double chi_dy = chi_square(dy, double(n) / bins), chi_dx = chi_square(dx, double(n) / bins),
               chi_joint = chi_square(joint, double(n) / (bins * bins));
  std::printf("chi-square dy %.1f, dx %.1f (8 dof), joint %.1f (80 dof)\n", chi_dy, chi_dx,
              chi_joint);
  EXPECT_LT(chi_dy, 40.0);  // 8 degrees of freedom: p(chi > 40) ~ 3e-6
  EXPECT_LT(chi_dx, 40.0);
  EXPECT_LT(chi_joint, 150.0);  // 80 degrees of freedom: p ~ 1e-6; dy and dx independent
}

class EraseRate : public ::testing::TestWithParam<float> {};

TEST_P(EraseRate, IsPAndRectanglesFollowRandomErasing) {
  const float p = GetParam();
  std::printf("seed %llu, erase:%g\n", static_cast<unsigned long long>(kSeed), p);
  const Dataset set = random_images(1, 1, 28, 28);
  AugmentConfig config;
  config.erase = p;
  const Augmenter a(config, set, kSeed);
  const std::size_t n = 40000;
  std::size_t erased = 0;
  double area_sum = 0;
  for (std::size_t k = 0; k < n; ++k) {
    const AugmentDraw d = a.draw(k / 10000, static_cast<std::uint32_t>(k % 10000), 28, 28);
    if (!d.erase) continue;
    ++erased;
    ASSERT_LT(d.eh, 28u);  // fits (torchvision's h < H, w < W), inside the image
    ASSERT_LT(d.ew, 28u);
    ASSERT_LE(d.ey + d.eh, 28u);
    ASSERT_LE(d.ex + d.ew, 28u);
    const double area = static_cast<double>(d.eh * d.ew) / (28.0 * 28);
    ASSERT_GE(area, 0.005);  // [0.02, 0.33] before rounding h and w to whole pixels
    ASSERT_LE(area, 0.40);
    const double ratio = static_cast<double>(d.eh) / static_cast<double>(d.ew);
    ASSERT_GE(ratio, 0.3 / 1.6);  // [0.3, 3.3] before rounding
    ASSERT_LE(ratio, 3.3 * 1.6);
    area_sum += area;
  }
  const double mean_area = erased ? area_sum / static_cast<double>(erased) : 0;
  std::printf("erased %zu of %zu, mean area fraction %.4f\n", erased, n, mean_area);
  // 10 tries almost never all fail on 28 x 28: the rate is P.
  EXPECT_NEAR(static_cast<double>(erased), n * p, 5 * std::sqrt(n * p * (1 - p)) + 1);
  // Uniform area in [0.02, 0.33] has mean 0.175; large thin rectangles that do not fit are
  // redrawn, which lowers it a little.
  EXPECT_GT(mean_area, 0.14);
  EXPECT_LT(mean_area, 0.19);
}

INSTANTIATE_TEST_SUITE_P(Augment, EraseRate, ::testing::Values(0.1f, 0.5f, 1.0f),
                         [](const ::testing::TestParamInfo<float>& p) {
                           return "P" + std::to_string(static_cast<int>(p.param * 100)) + "Percent";
                         });

// The erased rectangle holds 0 (the normalized value 0) in every channel, and the rest of the
// row is the normalized source.
TEST(Augmenter, EraseWritesZerosAfterNormalization) {
  const Dataset set = random_images(100, 3, 12, 10);
  const Augmenter erase(parse_augment("normalize,erase:1"), set, kSeed);
  const Augmenter plain(parse_augment("normalize"), set, kSeed);
  const std::vector<std::uint32_t> ids = iota_ids(100);
  const std::vector<float> x = assembled(erase, set, ids, 2), ref = assembled(plain, set, ids, 2);
  const std::size_t f = set.features();
  std::size_t zeros = 0;
  for (std::uint32_t id : ids) {
    const AugmentDraw d = erase.draw(2, id, 12, 10);
    for (std::size_t c = 0; c < 3; ++c)
      for (std::size_t y = 0; y < 12; ++y)
        for (std::size_t xx = 0; xx < 10; ++xx) {
          const std::size_t i = id * f + (c * 12 + y) * 10 + xx;
          const bool inside =
              d.erase && y >= d.ey && y < d.ey + d.eh && xx >= d.ex && xx < d.ex + d.ew;
          if (inside) {
            ASSERT_EQ(x[i], 0.0f);
            ++zeros;
          } else {
            ASSERT_EQ(x[i], ref[i]);
          }
        }
  }
  EXPECT_GT(zeros, 100u * 3 * 120 * 0.02);
}

// --- normalization ------------------------------------------------------------------------

TEST(Augmenter, NormalizeGivesZeroMeanAndUnitStdOnTheTrainingSet) {
  for (const bool floats : {false, true}) {
    const std::size_t n = 300, C = 3, H = 7, W = 6;
    const Dataset set = floats ? random_float_images(n, C, H, W) : random_images(n, C, H, W);
    const Augmenter a(parse_augment("normalize"), set, kSeed);
    ASSERT_EQ(a.mean().size(), C);
    const std::vector<float> x = assembled(a, set, iota_ids(n), 0, /*train=*/false);
    for (std::size_t c = 0; c < C; ++c) {
      // The statistics against a naive two-pass float64 computation over the source values.
      double src_sum = 0, src_sq = 0, sum = 0, sq = 0;
      const double count = static_cast<double>(n * H * W);
      for (std::uint32_t id = 0; id < n; ++id) {
        const std::vector<double> v = source_image(set, id);
        for (std::size_t i = 0; i < H * W; ++i) src_sum += v[c * H * W + i];
      }
      const double src_mean = src_sum / count;
      for (std::uint32_t id = 0; id < n; ++id) {
        const std::vector<double> v = source_image(set, id);
        for (std::size_t i = 0; i < H * W; ++i) {
          const double d = v[c * H * W + i] - src_mean;
          src_sq += d * d;
          sum += x[id * set.features() + c * H * W + i];
        }
      }
      EXPECT_FLOAT_EQ(a.mean()[c], static_cast<float>(src_mean)) << c;
      EXPECT_FLOAT_EQ(a.stddev()[c], static_cast<float>(std::sqrt(src_sq / count))) << c;
      const double mean = sum / count;
      for (std::uint32_t id = 0; id < n; ++id)
        for (std::size_t i = 0; i < H * W; ++i) {
          const double d = x[id * set.features() + c * H * W + i] - mean;
          sq += d * d;
        }
      EXPECT_NEAR(mean, 0.0, 1e-5) << "channel " << c << (floats ? " float" : " uint8");
      EXPECT_NEAR(std::sqrt(sq / count), 1.0, 1e-5) << "channel " << c;
    }
    // Evaluation rows (another set of the same shape) use the training set's statistics.
    const Dataset test = floats ? random_float_images(5, C, H, W) : random_images(5, C, H, W, 99);
    const std::vector<float> t = assembled(a, test, iota_ids(5), 0, /*train=*/false);
    const std::vector<double> v = source_image(test, 4);
    for (std::size_t c = 0; c < C; ++c)
      EXPECT_EQ(t[4 * test.features() + c * H * W + 5],
                (static_cast<float>(v[c * H * W + 5]) - a.mean()[c]) / a.stddev()[c]);
  }
}

TEST(Augmenter, EvaluationRowsGetNormalizeOnly) {
  const Dataset set = random_images(30, 1, 28, 28);
  const Augmenter all(kAll, set, kSeed), normalize(parse_augment("normalize"), set, kSeed);
  const std::vector<std::uint32_t> ids = iota_ids(30);
  const std::vector<float> eval = assembled(all, set, ids, 7, /*train=*/false);
  EXPECT_TRUE(same_bits(eval.data(), assembled(normalize, set, ids, 7, true).data(), eval.size()));
  EXPECT_FALSE(same_bits(eval.data(), assembled(all, set, ids, 7, true).data(), eval.size()));
}

// --- refusals -----------------------------------------------------------------------------

TEST(Augmenter, TabularDataRefusesAnyAugmentationNamingTheFlag) {
  Dataset tab = random_float_images(10, 1, 1, 12);
  tab.tabular = true;
  EXPECT_NO_THROW(Augmenter(AugmentConfig{}, tab, kSeed));
  for (const char* spec : {"flip", "crop:2", "erase:0.5", "normalize"}) {
    try {
      Augmenter(parse_augment(spec), tab, kSeed);
      ADD_FAILURE() << spec << " accepted on tabular data";
    } catch (const InputError& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.rfind("--augment: expected no augmentation on tabular data (12 tabular "
                           "features), found '",
                           0),
                0u)
          << what;
      EXPECT_NE(what.find(spec), std::string::npos) << what;
    }
  }
}

TEST(Augmenter, NormalizeRefusesAConstantChannel) {
  Dataset set = random_images(10, 2, 4, 4);
  std::fill(set.images.begin() + 16, set.images.begin() + 32, 7);      // sample 0, channel 1
  EXPECT_NO_THROW(Augmenter(parse_augment("normalize"), set, kSeed));  // varies over samples
  for (std::size_t s = 0; s < 10; ++s)
    std::fill(set.images.begin() + (s * 2 + 1) * 16, set.images.begin() + (s * 2 + 2) * 16, 7);
  try {
    Augmenter(parse_augment("normalize"), set, kSeed);
    FAIL() << "a constant channel accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--augment normalize: channel 1 "), std::string::npos)
        << e.what();
  }
}

}  // namespace augment_test
}  // namespace cohort::data
