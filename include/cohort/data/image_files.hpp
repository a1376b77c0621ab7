// Image folders, torchvision's ImageFolder layout: DIR/train/<class>/<image> and
// DIR/test/<class>/<image>, each image a PNG or JPEG file, decoded once at load (libpng,
// libjpeg-turbo) into the same in-memory uint8 dataset as the other formats.
//
// Labels: the class folders of train/, sorted by name (byte order), are 0, 1, ...; test/'s class
// folders must each be one of them. Sample order: class folder, then file name, both sorted.
// Files are recognised by extension (.png, .jpg, .jpeg, any case) and decoded by content; other
// files and hidden ones (a leading '.') are ignored, as torchvision does. Every image must have
// the first image's size and channels (grey: 1, RGB: 3); pixels are stored (C, H, W).
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "cohort/data/dataset.hpp"

namespace cohort::data {

struct Image {
  std::size_t channels = 0, height = 0, width = 0;
  std::vector<std::uint8_t> pixels;  // (channels, height, width)
};

// The largest image decoded, in pixels (a header claiming more is refused before allocating).
inline constexpr std::size_t kMaxImagePixels = std::size_t{1} << 26;

// Decodes a PNG (8-bit grey, grey below 8 bits, RGB or palette without transparency) or a JPEG
// (grey or colour; CMYK is refused). Throws InputError naming `name`: not an image, truncated or
// corrupt data, an alpha channel, 16-bit samples, too many pixels.
Image decode_image(std::span<const std::uint8_t> bytes, const std::string& name);

// `dir`/train and `dir`/test as above. Throws InputError naming the file or folder: a class
// folder with no image, a file that does not decode, an image of another size or channel count,
// a test class absent from train/.
Splits load_class_folders(const std::filesystem::path& dir);

}  // namespace cohort::data
