// Image folders (image_files.hpp): PNG and JPEG decoding, the labels and the sample order (class
// folder, then file name, both sorted), planar RGB, and every refusal naming the file. The
// images are written here with libpng's and libjpeg-turbo's encoders; the fixture as PNG folders
// against .npy files of the same order is scripts/check_data_formats.sh (ctest data_formats).
#include "cohort/data/image_files.hpp"

#include <gtest/gtest.h>
#include <png.h>
#include <turbojpeg.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cohort/core/error.hpp"

namespace cohort::data {
namespace image_files_test {

namespace fs = std::filesystem;
using Bytes = std::vector<std::uint8_t>;

// A PNG of (H, W, C) interleaved pixels, C = 1 (grey), 3 (RGB) or 4 (RGBA); 16-bit grey with
// `wide`.
Bytes png(std::size_t w, std::size_t h, std::size_t c, const Bytes& hwc, bool wide = false) {
  png_image im{};
  im.version = PNG_IMAGE_VERSION;
  im.width = static_cast<png_uint_32>(w);
  im.height = static_cast<png_uint_32>(h);
  im.format = c == 1 ? PNG_FORMAT_GRAY : c == 3 ? PNG_FORMAT_RGB : PNG_FORMAT_RGBA;
  std::vector<std::uint16_t> wide_pixels(hwc.begin(), hwc.end());
  if (wide) im.format = PNG_FORMAT_LINEAR_Y;
  const void* data = wide ? static_cast<const void*>(wide_pixels.data()) : hwc.data();
  png_alloc_size_t size = 0;
  EXPECT_TRUE(png_image_write_to_memory(&im, nullptr, &size, 0, data, 0, nullptr));
  Bytes out(size);
  EXPECT_TRUE(png_image_write_to_memory(&im, out.data(), &size, 0, data, 0, nullptr)) << im.message;
  out.resize(size);
  return out;
}

Bytes jpeg(std::size_t w, std::size_t h, std::size_t c, const Bytes& hwc) {
  tjhandle tj = tjInitCompress();
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  EXPECT_EQ(tjCompress2(tj, hwc.data(), static_cast<int>(w), 0, static_cast<int>(h),
                        c == 1 ? TJPF_GRAY : TJPF_RGB, &buf, &size,
                        c == 1 ? TJSAMP_GRAY : TJSAMP_444, 100, 0),
            0);
  Bytes out(buf, buf + size);
  tjFree(buf);
  tjDestroy(tj);
  return out;
}

Bytes grey(std::size_t w, std::size_t h, std::uint8_t seed) {
  Bytes p(w * h);
  for (std::size_t i = 0; i < p.size(); ++i) p[i] = static_cast<std::uint8_t>(seed * 31 + i * 7);
  return p;
}

class ImageFolders : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        fs::temp_directory_path() /
        ("cohort_image_files_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
         "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path put(const std::string& rel, const Bytes& bytes) {
    const fs::path p = dir_ / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()),
               static_cast<std::streamsize>(bytes.size()));
    return p;
  }
  // A valid two-class set of 3x2 grey images, with a test split.
  void valid_set() {
    put("train/a/1.png", png(3, 2, 1, grey(3, 2, 1)));
    put("train/b/1.png", png(3, 2, 1, grey(3, 2, 2)));
    put("test/a/1.png", png(3, 2, 1, grey(3, 2, 3)));
  }
  // Loading refuses with a message that names `culprit`.
  void refused(const fs::path& culprit, const std::string& phrase) {
    try {
      load_class_folders(dir_);
      ADD_FAILURE() << "accepted; expected a refusal naming " << culprit;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(culprit.string()), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(phrase), std::string::npos) << e.what();
    }
  }
  fs::path dir_;
};

TEST_F(ImageFolders, LabelsAreSortedClassFoldersAndSamplesFollowFileNames) {
  // Byte order of names: "10.png" before "9.png", class "cat" before "dog"; other files and
  // hidden ones are ignored.
  put("train/dog/9.png", png(3, 2, 1, grey(3, 2, 1)));
  put("train/dog/10.png", png(3, 2, 1, grey(3, 2, 2)));
  put("train/cat/x.jpg", jpeg(3, 2, 1, Bytes(6, 128)));
  put("train/cat/notes.txt", Bytes{'h', 'i'});
  put("train/cat/.hidden.png", Bytes{'x'});
  put("test/dog/a.PNG", png(3, 2, 1, grey(3, 2, 3)));
  const Splits s = load_class_folders(dir_);
  ASSERT_EQ(s.train.count, 3u);
  EXPECT_EQ(s.train.num_classes, 2u);
  EXPECT_EQ((std::vector<std::uint32_t>{0, 1, 1}), s.train.labels);  // cat, dog/10, dog/9
  EXPECT_EQ(s.train.channels, 1u);
  EXPECT_EQ(s.train.rows, 2u);
  EXPECT_EQ(s.train.cols, 3u);
  const Bytes ten = grey(3, 2, 2), nine = grey(3, 2, 1);
  EXPECT_EQ(Bytes(s.train.images.begin() + 6, s.train.images.begin() + 12), ten);
  EXPECT_EQ(Bytes(s.train.images.begin() + 12, s.train.images.end()), nine);
  for (std::size_t i = 0; i < 6; ++i) EXPECT_EQ(s.train.images[i], 128) << i;  // JPEG, q 100
  ASSERT_EQ(s.test.count, 1u);
  EXPECT_EQ(s.test.labels[0], 1u);  // "dog" in train's numbering
  EXPECT_EQ(s.test.num_classes, 2u);
}

TEST_F(ImageFolders, RgbIsStoredChannelByChannel) {
  Bytes hwc(2 * 2 * 3);
  for (std::size_t p = 0; p < 4; ++p)
    for (std::size_t c = 0; c < 3; ++c) hwc[p * 3 + c] = static_cast<std::uint8_t>(10 * c + p);
  const Image im = decode_image(png(2, 2, 3, hwc), "rgb.png");
  ASSERT_EQ(im.channels, 3u);
  EXPECT_EQ(im.pixels, (Bytes{0, 1, 2, 3, 10, 11, 12, 13, 20, 21, 22, 23}));
  const Image j = decode_image(jpeg(2, 2, 3, Bytes(12, 200)), "rgb.jpg");
  EXPECT_EQ(j.channels, 3u);
  for (std::uint8_t v : j.pixels) EXPECT_NEAR(v, 200, 1);
}

TEST_F(ImageFolders, RefusesAClassFolderWithoutImages) {
  valid_set();
  fs::create_directories(dir_ / "train/c");
  put("train/c/readme.txt", Bytes{'x'});
  refused(dir_ / "train/c", "expected at least one .png or .jpg image, found none");
}

TEST_F(ImageFolders, RefusesAFileThatIsNotAnImage) {
  valid_set();
  refused(put("train/b/2.png", Bytes{'n', 'o', 't', ' ', 'a', 'n', ' ', 'i', 'm', 'a', 'g', 'e'}),
          "expected a PNG or JPEG image");
}

TEST_F(ImageFolders, RefusesATruncatedPng) {
  valid_set();
  Bytes p = png(3, 2, 1, grey(3, 2, 9));
  p.resize(p.size() - 20);  // inside the image data or its trailer
  refused(put("train/b/2.png", p), "expected a PNG image");
}

TEST_F(ImageFolders, RefusesATruncatedJpeg) {
  valid_set();
  Bytes j = jpeg(16, 16, 1, grey(16, 16, 4));
  j.resize(j.size() / 2);
  put("train/a/1.png", jpeg(16, 16, 1, grey(16, 16, 5)));
  put("train/b/1.png", jpeg(16, 16, 1, grey(16, 16, 6)));
  put("test/a/1.png", jpeg(16, 16, 1, grey(16, 16, 7)));
  refused(put("train/b/2.jpg", j), "JPEG");
}

TEST_F(ImageFolders, RefusesAnImageOfAnotherSize) {
  valid_set();
  refused(put("train/b/2.png", png(2, 3, 1, grey(2, 3, 1))), "1x2x3");
}

TEST_F(ImageFolders, RefusesATestImageOfAnotherSize) {
  valid_set();
  refused(put("test/a/2.png", png(4, 2, 1, grey(4, 2, 1))), "as the first training image");
}

TEST_F(ImageFolders, RefusesMixedGreyAndColour) {
  valid_set();
  refused(put("train/b/2.png", png(3, 2, 3, Bytes(18, 1))), "3x2x3");
}

TEST_F(ImageFolders, RefusesAlphaAndSixteenBitPngs) {
  valid_set();
  refused(put("train/b/2.png", png(3, 2, 4, Bytes(24, 1))), "alpha");
  fs::remove(dir_ / "train/b/2.png");
  refused(put("train/b/3.png", png(3, 2, 1, grey(3, 2, 1), true)), "16-bit");
}

TEST_F(ImageFolders, RefusesATestClassTrainDoesNotHave) {
  valid_set();
  refused(put("test/zebra/1.png", png(3, 2, 1, grey(3, 2, 1))).parent_path(),
          "expected one of the training classes");
}

TEST_F(ImageFolders, RefusesAMissingSplit) {
  put("train/a/1.png", png(3, 2, 1, grey(3, 2, 1)));
  refused(dir_ / "test", "expected a folder of class folders, found nothing");
}

TEST(ImageDecode, RefusesAHeaderClaimingMorePixelsThanAllowed) {
  // A PNG whose IHDR claims 2^20 x 2^20 pixels (checksum fixed up): refused before allocating.
  Bytes p = png(1, 1, 1, Bytes{7});
  const std::uint32_t big = 1u << 20;
  for (int k = 0; k < 2; ++k)
    for (int b = 0; b < 4; ++b) p[16 + 4 * k + b] = static_cast<std::uint8_t>(big >> (24 - 8 * b));
  const std::uint32_t crc = static_cast<std::uint32_t>(crc32(0, p.data() + 12, 17));
  for (int b = 0; b < 4; ++b) p[29 + b] = static_cast<std::uint8_t>(crc >> (24 - 8 * b));
  try {
    decode_image(p, "huge.png");
    ADD_FAILURE() << "accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("huge.png"), std::string::npos) << e.what();
  }
}

}  // namespace image_files_test
}  // namespace cohort::data
