// Image folders; see include/cohort/data/image_files.hpp. PNG through libpng's classic API (the
// simplified one would convert files with a gAMA chunk to sRGB; these are the file's own
// values, as PIL and torchvision read them), JPEG through libjpeg-turbo's TurboJPEG API (its
// accurate integer IDCT, bit-exact whatever SIMD the CPU has).
#include "cohort/data/image_files.hpp"

#include <png.h>
#include <turbojpeg.h>

#include <algorithm>
#include <csetjmp>
#include <cstring>

#include "cohort/core/error.hpp"

namespace cohort::data {

namespace {

[[noreturn]] void refuse_image(const std::string& name, const std::string& expected,
                               const std::string& found) {
  throw InputError(name + ": image: expected " + expected + ", found " + found);
}

void check_pixels(const std::string& name, std::size_t width, std::size_t height) {
  if (width == 0 || height == 0 || width > kMaxImagePixels / height)
    refuse_image(name, "at most " + std::to_string(kMaxImagePixels) + " pixels",
                 std::to_string(width) + "x" + std::to_string(height));
}

// (H, W, C) interleaved rows to (C, H, W).
std::vector<std::uint8_t> planar(const std::vector<std::uint8_t>& hwc, std::size_t channels,
                                 std::size_t pixels) {
  if (channels == 1) return hwc;
  std::vector<std::uint8_t> chw(hwc.size());
  for (std::size_t p = 0; p < pixels; ++p)
    for (std::size_t c = 0; c < channels; ++c) chw[c * pixels + p] = hwc[p * channels + c];
  return chw;
}

// libpng reports errors by longjmp: the decoder below holds no object with a destructor between
// setjmp and the calls that may jump; what it fills lives in its caller.
struct PngRead {
  const std::uint8_t* data = nullptr;
  std::size_t size = 0, at = 0;
  char error[256] = {};
  std::size_t width = 0, height = 0, channels = 0;
  std::vector<std::uint8_t>* pixels =
      nullptr;  // (H, W, C), sized by the decoder before it reads rows
};

void png_fail(png_structp png, png_const_charp message) {
  auto* r = static_cast<PngRead*>(png_get_error_ptr(png));
  std::snprintf(r->error, sizeof r->error, "%s", message);
  png_longjmp(png, 1);
}
void png_quiet(png_structp, png_const_charp) {}

void png_read_bytes(png_structp png, png_bytep out, png_size_t n) {
  auto* r = static_cast<PngRead*>(png_get_io_ptr(png));
  if (n > r->size - r->at) png_error(png, "truncated data (the file ends inside the image)");
  std::memcpy(out, r->data + r->at, n);
  r->at += n;
}

// Returns false with r.error set when libpng or a check refuses the file.
bool decode_png(PngRead& r) {
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &r, png_fail, png_quiet);
  if (png == nullptr) return false;
  png_infop info = png_create_info_struct(png);
  if (info == nullptr || setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, &info, nullptr);
    return false;
  }
  png_set_read_fn(png, &r, png_read_bytes);
  png_set_crc_action(png, PNG_CRC_ERROR_QUIT, PNG_CRC_ERROR_QUIT);
  png_read_info(png, info);
  const int type = png_get_color_type(png, info), depth = png_get_bit_depth(png, info);
  if ((type & PNG_COLOR_MASK_ALPHA) || png_get_valid(png, info, PNG_INFO_tRNS))
    png_error(png, "an alpha channel or transparency (expected grey or RGB)");
  if (depth == 16) png_error(png, "16-bit samples (expected 8-bit)");
  if (type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (type == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  const int passes = png_set_interlace_handling(png);
  png_read_update_info(png, info);
  r.width = png_get_image_width(png, info);
  r.height = png_get_image_height(png, info);
  r.channels = png_get_channels(png, info);
  if (r.width == 0 || r.height == 0 || r.width > kMaxImagePixels / r.height)
    png_error(png, "too many pixels");
  const std::size_t row = r.width * r.channels;
  if (png_get_rowbytes(png, info) != row) png_error(png, "an unexpected row layout");
  r.pixels->assign(row * r.height, 0);
  for (int pass = 0; pass < passes; ++pass)
    for (std::size_t y = 0; y < r.height; ++y)
      png_read_row(png, r.pixels->data() + y * row, nullptr);
  png_read_end(png, nullptr);  // the chunks after the image data, with their checksums
  png_destroy_read_struct(&png, &info, nullptr);
  return true;
}

Image decode_jpeg(std::span<const std::uint8_t> bytes, const std::string& name) {
  tjhandle tj = tjInitDecompress();
  if (tj == nullptr)
    throw InternalError(std::string("tjInitDecompress: ") + tjGetErrorStr2(nullptr));
  struct Close {
    tjhandle h;
    ~Close() { tjDestroy(h); }
  } close{tj};
  int width = 0, height = 0, subsampling = 0, colorspace = 0;
  if (tjDecompressHeader3(tj, bytes.data(), static_cast<unsigned long>(bytes.size()), &width,
                          &height, &subsampling, &colorspace) != 0)
    refuse_image(name, "a JPEG image", std::string("corrupt data (") + tjGetErrorStr2(tj) + ")");
  if (colorspace == TJCS_CMYK || colorspace == TJCS_YCCK)
    refuse_image(name, "a grey or colour JPEG", "CMYK");
  check_pixels(name, static_cast<std::size_t>(width), static_cast<std::size_t>(height));
  Image im;
  im.channels = colorspace == TJCS_GRAY ? 1 : 3;
  im.height = static_cast<std::size_t>(height);
  im.width = static_cast<std::size_t>(width);
  std::vector<std::uint8_t> hwc(im.channels * im.height * im.width);
  // A warning (e.g. data that ends early) fails the decode too: no half-decoded image is kept.
  if (tjDecompress2(tj, bytes.data(), static_cast<unsigned long>(bytes.size()), hwc.data(), width,
                    0, height, im.channels == 1 ? TJPF_GRAY : TJPF_RGB,
                    TJFLAG_ACCURATEDCT | TJFLAG_STOPONWARNING) != 0)
    refuse_image(name, "a complete JPEG image",
                 std::string("corrupt data (") + tjGetErrorStr2(tj) + ")");
  im.pixels = planar(hwc, im.channels, im.height * im.width);
  return im;
}

bool image_extension(const std::filesystem::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext == ".png" || ext == ".jpg" || ext == ".jpeg";
}

bool hidden(const std::filesystem::path& p) { return p.filename().string().starts_with("."); }

// The sorted entries of `dir` that pass `keep`.
template <class Keep>
std::vector<std::filesystem::path> sorted_entries(const std::filesystem::path& dir, Keep keep) {
  std::vector<std::filesystem::path> out;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (!hidden(it->path()) && keep(*it)) out.push_back(it->path());
  if (ec)
    throw InputError(dir.string() + ": folder: expected a readable folder, found " + ec.message());
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return a.filename().string() < b.filename().string();
  });
  return out;
}

std::vector<std::filesystem::path> class_folders(const std::filesystem::path& split) {
  std::error_code ec;
  if (!std::filesystem::is_directory(split, ec))
    throw InputError(split.string() + ": split folder: expected a folder of class folders, found " +
                     (std::filesystem::exists(split, ec) ? "a file" : "nothing"));
  auto classes = sorted_entries(split, [](const auto& e) {
    std::error_code loop;  // a link loop is no folder (below, no image: read_file_bytes names it)
    return e.is_directory(loop);
  });
  if (classes.empty())
    throw InputError(split.string() + ": split folder: expected class folders, found none");
  return classes;
}

// One split: every image of the class folders, labelled by `labels` (class name to label).
Dataset load_split(const std::filesystem::path& split, const std::vector<std::string>& class_names,
                   std::size_t num_classes, const Image* shape, std::string set_name) {
  Dataset set;
  set.name = std::move(set_name);
  set.num_classes = num_classes;
  for (const auto& folder : class_folders(split)) {
    const std::string cls = folder.filename().string();
    const auto known = std::lower_bound(class_names.begin(), class_names.end(), cls);
    if (known == class_names.end() || *known != cls)
      throw InputError(folder.string() + ": class folder: expected one of the training classes (" +
                       std::to_string(class_names.size()) + " folders of train/), found '" + cls +
                       "'");
    const auto label = static_cast<std::uint32_t>(known - class_names.begin());
    const auto files = sorted_entries(folder, [](const auto& e) {
      std::error_code loop;
      return !e.is_directory(loop) && image_extension(e.path());
    });
    if (files.empty())
      throw InputError(folder.string() +
                       ": class folder: expected at least one .png or .jpg "
                       "image, found none");
    for (const auto& file : files) {
      const std::vector<std::uint8_t> bytes =
          read_file_bytes(file, std::uint64_t{1} << 32);  // 4 GiB: larger is no single image
      Image im = decode_image(bytes, file.string());
      if (shape == nullptr && set.count == 0) {
        set.channels = im.channels;
        set.rows = im.height;
        set.cols = im.width;
      }
      const std::size_t c = shape ? shape->channels : set.channels,
                        h = shape ? shape->height : set.rows, w = shape ? shape->width : set.cols;
      if (im.channels != c || im.height != h || im.width != w)
        refuse_image(file.string(),
                     std::to_string(c) + "x" + std::to_string(h) + "x" + std::to_string(w) +
                         " (channels x height x width, as the first training image)",
                     std::to_string(im.channels) + "x" + std::to_string(im.height) + "x" +
                         std::to_string(im.width));
      set.images.insert(set.images.end(), im.pixels.begin(), im.pixels.end());
      set.labels.push_back(label);
      ++set.count;
    }
  }
  if (shape != nullptr) {
    set.channels = shape->channels;
    set.rows = shape->height;
    set.cols = shape->width;
  }
  return set;
}

}  // namespace

Image decode_image(std::span<const std::uint8_t> bytes, const std::string& name) {
  static constexpr std::uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (bytes.size() >= 8 && std::memcmp(bytes.data(), kPng, 8) == 0) {
    std::vector<std::uint8_t> hwc;
    PngRead r;
    r.data = bytes.data();
    r.size = bytes.size();
    r.pixels = &hwc;
    if (!decode_png(r))
      refuse_image(name, "a PNG image", std::string(r.error[0] ? r.error : "corrupt data"));
    Image im;
    im.channels = r.channels;
    im.height = r.height;
    im.width = r.width;
    im.pixels = planar(hwc, im.channels, im.height * im.width);
    return im;
  }
  if (bytes.size() >= 3 && bytes[0] == 0xff && bytes[1] == 0xd8 && bytes[2] == 0xff)
    return decode_jpeg(bytes, name);
  refuse_image(name, "a PNG or JPEG image",
               "neither signature (" + std::to_string(bytes.size()) + " bytes)");
}

Splits load_class_folders(const std::filesystem::path& dir) {
  const auto train_classes = class_folders(dir / "train");
  std::vector<std::string> names;
  for (const auto& f : train_classes) names.push_back(f.filename().string());
  if (names.size() > kMaxClasses)
    throw InputError((dir / "train").string() + ": class folders: expected at most " +
                     std::to_string(kMaxClasses) + ", found " + std::to_string(names.size()));
  Splits s;
  s.train = load_split(dir / "train", names, names.size(), nullptr, "train");
  const Image shape{s.train.channels, s.train.rows, s.train.cols, {}};
  s.test = load_split(dir / "test", names, names.size(), &shape, "test");
  check_splits(s, (dir / "test").string());
  return s;
}

}  // namespace cohort::data
