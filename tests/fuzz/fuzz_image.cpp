// libFuzzer target: the PNG and JPEG decoders (libpng, libjpeg-turbo) on arbitrary bytes. Any
// outcome but a consistent image or an InputError naming the file is a finding.
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>

#include "cohort/core/error.hpp"
#include "cohort/data/image_files.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const cohort::data::Image im = cohort::data::decode_image(std::span(data, size), "in.img");
    if ((im.channels != 1 && im.channels != 3) || im.height == 0 || im.width == 0 ||
        im.pixels.size() != im.channels * im.height * im.width)
      std::abort();  // accepted an inconsistent image
  } catch (const cohort::InputError& e) {
    if (std::string(e.what()).rfind("in.img", 0) != 0) std::abort();
  }
  return 0;
}
