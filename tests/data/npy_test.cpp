// The .npy reader: files as numpy.save writes them (built byte by byte here, and by numpy in the
// conversion test) load with the right shape, values and class count; every malformed file is
// refused with an InputError naming the file and the problem.
#include "cohort/data/npy.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>

#include "cohort/core/error.hpp"

namespace cohort::data {
namespace npy_test {

using Bytes = std::vector<std::uint8_t>;

// A .npy file as numpy.save writes it: magic, version, header length, the dict padded with
// spaces so that the payload starts at a multiple of 64, a newline, the payload.
Bytes npy(const std::string& dict, const Bytes& payload, int major = 1) {
  const std::size_t pre = major == 1 ? 10 : 12;
  std::string header = dict;
  while ((pre + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  Bytes out = {0x93, 'N', 'U', 'M', 'P', 'Y', static_cast<std::uint8_t>(major), 0};
  // Reserved up front, which also spares GCC 12 a false -Wstringop-overflow in the pushes below.
  out.reserve(pre + header.size() + payload.size());
  for (std::size_t b = 0; b < pre - 8; ++b)
    out.push_back(static_cast<std::uint8_t>(header.size() >> (8 * b)));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

std::string dict(const std::string& descr, const std::string& shape, bool fortran = false) {
  return "{'descr': '" + descr + "', 'fortran_order': " + (fortran ? "True" : "False") +
         ", 'shape': " + shape + ", }";
}

// The values' bytes; the test machine is little-endian, as .npy's '<' requires.
template <typename T>
Bytes le_bytes(const std::vector<T>& values) {
  static_assert(std::endian::native == std::endian::little);
  Bytes out(values.size() * sizeof(T));
  if (!values.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

// A valid split: X float32 (3, 2), y int64 (3,) with labels 0, 2, 1.
struct Pair {
  Bytes x = npy(dict("<f4", "(3, 2)"), le_bytes<float>({0.f, 0.5f, 1.f, -1.f, 2.f, 3.5f}));
  Bytes y = npy(dict("<i8", "(3,)"), le_bytes<std::int64_t>({0, 2, 1}));
};

Dataset read(const Pair& p, const NpyLimits& limits = {}) {
  return read_npy_split(p.x, "train_x.npy", p.y, "train_y.npy", "train", limits);
}

TEST(Npy, ReadsFloatTabularSplit) {
  const Dataset d = read(Pair{});
  EXPECT_EQ(d.count, 3u);
  EXPECT_TRUE(d.tabular);
  EXPECT_EQ(d.features(), 2u);
  EXPECT_EQ(d.num_classes, 3u);
  EXPECT_TRUE(d.images.empty());
  EXPECT_EQ(d.float_features, (std::vector<float>{0.f, 0.5f, 1.f, -1.f, 2.f, 3.5f}));
  EXPECT_EQ(d.labels, (std::vector<std::uint32_t>{0, 2, 1}));
  EXPECT_EQ(d.describe_shape(), "2 tabular features");
}

TEST(Npy, ReadsUint8ImagesVersion2) {
  Pair p;
  p.x = npy(dict("|u1", "(2, 2, 3)"), {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 255}, 2);
  p.y = npy(dict("|u1", "(2,)"), {4, 1}, 2);
  const Dataset d = read(p);
  EXPECT_FALSE(d.tabular);
  EXPECT_EQ(d.rows, 2u);
  EXPECT_EQ(d.cols, 3u);
  EXPECT_EQ(d.images.back(), 255);
  EXPECT_EQ(d.num_classes, 5u);
  std::vector<float> x(12);
  std::vector<std::int32_t> y(2);
  const std::uint32_t ids[] = {1, 0};
  assemble_batch(d, ids, x.data(), y.data());
  EXPECT_EQ(x[5], 1.0f);
  EXPECT_EQ(x[6], 0.0f);
  EXPECT_EQ(y, (std::vector<std::int32_t>{1, 4}));
}

TEST(Npy, ReadsChannelsAndAcceptsLittleEndianU1) {
  Pair p;
  p.x = npy(dict("<u1", "(1, 2, 1, 1)"), {7, 9});
  p.y = npy(dict("<u2", "(1,)"), {3, 0});
  const Dataset d = read(p);
  EXPECT_EQ(d.channels, 2u);
  EXPECT_EQ(d.describe_shape(), "2x1x1 images");
}

// Labels of every integer width numpy has, signed and unsigned.
struct LabelType {
  std::string descr;
  Bytes payload;  // the labels 1, 0, 2
};
class NpyLabels : public ::testing::TestWithParam<LabelType> {};
TEST_P(NpyLabels, ReadsEveryIntegerWidth) {
  Pair p;
  p.y = npy(dict(GetParam().descr, "(3,)"), GetParam().payload);
  EXPECT_EQ(read(p).labels, (std::vector<std::uint32_t>{1, 0, 2}));
}
INSTANTIATE_TEST_SUITE_P(Npy, NpyLabels,
                         ::testing::Values(LabelType{"|u1", {1, 0, 2}}, LabelType{"|i1", {1, 0, 2}},
                                           LabelType{"<u2", le_bytes<std::uint16_t>({1, 0, 2})},
                                           LabelType{"<i2", le_bytes<std::int16_t>({1, 0, 2})},
                                           LabelType{"<u4", le_bytes<std::uint32_t>({1, 0, 2})},
                                           LabelType{"<i4", le_bytes<std::int32_t>({1, 0, 2})},
                                           LabelType{"<u8", le_bytes<std::uint64_t>({1, 0, 2})},
                                           LabelType{"<i8", le_bytes<std::int64_t>({1, 0, 2})}),
                         [](const auto& test) {
                           std::string n = test.param.descr.substr(1);
                           return (n[0] == 'u' ? "uint" : "int") + std::to_string(8 * (n[1] - '0'));
                         });

// One malformed input: how to break the valid pair, which file the message must name, and a
// phrase naming the problem.
struct BadNpy {
  std::string name;
  std::function<void(Pair&)> break_it;
  std::string file;
  std::string problem;
};
class NpyBadInput : public ::testing::TestWithParam<BadNpy> {};

TEST_P(NpyBadInput, IsRefusedNamingFileAndProblem) {
  Pair p;
  GetParam().break_it(p);
  NpyLimits limits;
  try {
    read(p, limits);
    FAIL() << "accepted";
  } catch (const InputError& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind(GetParam().file + ": ", 0), 0u) << m;
    EXPECT_NE(m.find(GetParam().problem), std::string::npos) << m;
  }
}

Bytes x_with(const std::string& d, Bytes payload = le_bytes<float>({0, 0, 0, 0, 0, 0})) {
  return npy(d, payload);
}

const BadNpy kBadNpy[] = {
    {"EmptyFile", [](Pair& p) { p.x.clear(); }, "train_x.npy", "0 bytes"},
    {"BadMagic", [](Pair& p) { p.x[5] = 'Z'; }, "train_x.npy", "magic"},
    {"NotNpyAtAll",
     [](Pair& p) {
       p.y = {'1', ',', '2'};
     },
     "train_y.npy", "magic"},
    {"Version3", [](Pair& p) { p.x[6] = 3; }, "train_x.npy", "3.0 (unsupported)"},
    {"Version1Minor1", [](Pair& p) { p.x[7] = 1; }, "train_x.npy", "1.1 (unsupported)"},
    {"CutInHeaderLength", [](Pair& p) { p.x.resize(9); }, "train_x.npy", "header length"},
    {"HeaderPastEnd", [](Pair& p) { p.x.resize(40); }, "train_x.npy", "(file truncated)"},
    {"HeaderNotDict", [](Pair& p) { p.x = x_with("['<f4', False, (3, 2)]"); }, "train_x.npy",
     "a dict literal"},
    {"MissingShape", [](Pair& p) { p.x = x_with("{'descr': '<f4', 'fortran_order': False}"); },
     "train_x.npy", "the key 'shape'"},
    {"MissingDescr", [](Pair& p) { p.y = npy("{'fortran_order': False, 'shape': (3,)}", {}); },
     "train_y.npy", "the key 'descr'"},
    {"JunkAfterDict", [](Pair& p) { p.x = x_with(dict("<f4", "(3, 2)") + "x"); }, "train_x.npy",
     "after the dict"},
    {"UnknownKey",
     [](Pair& p) {
       p.x = x_with("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), 'x': 1}");
     },
     "train_x.npy", "extra key 'x'"},
    {"DuplicateKey",
     [](Pair& p) {
       p.x = x_with("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (3, 2)}");
     },
     "train_x.npy", "twice"},
    {"EvalBait",
     [](Pair& p) { p.x = x_with("{'descr': __import__('os'), 'fortran_order': False}"); },
     "train_x.npy", "a quoted string"},
    {"Float64", [](Pair& p) { p.x = x_with(dict("<f8", "(3, 2)"), Bytes(48)); }, "train_x.npy",
     "unsupported dtype"},
    {"ObjectDtype", [](Pair& p) { p.x = x_with(dict("|O", "(3, 2)"), Bytes(48)); }, "train_x.npy",
     "unsupported dtype"},
    {"Int32Features", [](Pair& p) { p.x = x_with(dict("<i4", "(3, 2)")); }, "train_x.npy",
     "unsupported dtype for X"},
    {"FloatLabels", [](Pair& p) { p.y = npy(dict("<f4", "(3,)"), Bytes(12)); }, "train_y.npy",
     "unsupported dtype for y"},
    {"BigEndianX", [](Pair& p) { p.x = x_with(dict(">f4", "(3, 2)")); }, "train_x.npy",
     "big-endian"},
    {"BigEndianY", [](Pair& p) { p.y = npy(dict(">i8", "(3,)"), Bytes(24)); }, "train_y.npy",
     "big-endian"},
    {"FortranOrder", [](Pair& p) { p.x = x_with(dict("<f4", "(3, 2)", true)); }, "train_x.npy",
     "Fortran order"},
    {"ShapeNotTuple", [](Pair& p) { p.x = x_with(dict("<f4", "[3, 2]")); }, "train_x.npy",
     "a tuple starting with '('"},
    {"ShapeNoComma", [](Pair& p) { p.x = x_with(dict("<f4", "(3 2)")); }, "train_x.npy",
     "',' or ')' in the tuple"},
    {"ShapeOneElementNoComma", [](Pair& p) { p.y = npy(dict("<i8", "(3)"), Bytes(24)); },
     "train_y.npy", "one-element tuple"},
    {"ShapeNegative", [](Pair& p) { p.x = x_with(dict("<f4", "(-3, 2)")); }, "train_x.npy",
     "a non-negative integer"},
    {"ShapeIntegerOverflow",
     [](Pair& p) { p.x = x_with(dict("<f4", "(99999999999999999999, 2)")); }, "train_x.npy",
     "overflows"},
    {"SizeArithmeticOverflow",
     [](Pair& p) { p.x = x_with(dict("<f4", "(2147483647, 2147483647, 2147483647)")); },
     "train_x.npy", "size overflows the limit"},
    {"ZeroSamples", [](Pair& p) { p.x = x_with(dict("<f4", "(0, 2)"), {}); }, "train_x.npy",
     "a size >= 1"},
    {"XOneDimensional", [](Pair& p) { p.x = x_with(dict("<f4", "(6,)")); }, "train_x.npy",
     "(N, features), (N, H, W) or (N, C, H, W)"},
    {"YTwoDimensional", [](Pair& p) { p.y = npy(dict("<i8", "(3, 1)"), Bytes(24)); }, "train_y.npy",
     "(N,) labels"},
    {"TruncatedPayload", [](Pair& p) { p.x.pop_back(); }, "train_x.npy", "(file truncated)"},
    {"TrailingData", [](Pair& p) { p.y.push_back(0); }, "train_y.npy", "trailing data"},
    {"LabelCountMismatch",
     [](Pair& p) {
       p.y = npy(dict("<i8", "(2,)"), le_bytes<std::int64_t>({0, 1}));
     },
     "train_y.npy", "(the sample count of train_x.npy)"},
    {"NegativeLabel",
     [](Pair& p) {
       p.y = npy(dict("<i8", "(3,)"), le_bytes<std::int64_t>({0, -1, 1}));
     },
     "train_y.npy", "label 1: expected a class in [0, 65536), found -1 (negative)"},
    {"LabelAboveMaxClasses",
     [](Pair& p) {
       p.y = npy(dict("<u4", "(3,)"), le_bytes<std::uint32_t>({0, 1, 70000}));
     },
     "train_y.npy", "label 2"},
    {"HugeUnsignedLabel",
     [](Pair& p) {
       p.y = npy(dict("<u8", "(3,)"), le_bytes<std::uint64_t>({~std::uint64_t{0}, 1, 0}));
     },
     "train_y.npy", "above 2^63"},
    {"NaNFeature",
     [](Pair& p) {
       p.x = x_with(dict("<f4", "(3, 2)"),
                    le_bytes<float>({0, 0, 0, std::numeric_limits<float>::quiet_NaN(), 0, 0}));
     },
     "train_x.npy", "sample 1 feature 1: expected a finite float, found NaN"},
    {"InfiniteFeature",
     [](Pair& p) {
       p.x = x_with(dict("<f4", "(3, 2)"),
                    le_bytes<float>({0, 0, 0, 0, -std::numeric_limits<float>::infinity(), 0}));
     },
     "train_x.npy", "infinity"},
    {"NonAsciiHeader", [](Pair& p) { p.x = x_with("{\xff}"); }, "train_x.npy", "\\xff"},
};

INSTANTIATE_TEST_SUITE_P(Npy, NpyBadInput, ::testing::ValuesIn(kBadNpy),
                         [](const auto& test) { return test.param.name; });

// --- folders -------------------------------------------------------------------------------

class TempDir {
 public:
  TempDir() {
    path_ = std::filesystem::temp_directory_path() /
            ("cohort_npy_test_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::filesystem::path& path() const { return path_; }
  void write(const std::string& name, const Bytes& bytes) const {
    std::ofstream(path_ / name, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()),
               static_cast<std::streamsize>(bytes.size()));
  }

 private:
  std::filesystem::path path_;
};

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(NpyFolder, ClassCountIsLargestLabelOfBothSplitsPlusOne) {
  TempDir dir;
  Pair p;
  dir.write("train_x.npy", p.x);
  dir.write("train_y.npy", p.y);
  dir.write("test_x.npy", npy(dict("<f4", "(1, 2)"), le_bytes<float>({1, 2})));
  dir.write("test_y.npy", npy(dict("|u1", "(1,)"), {6}));
  const Splits s = load_data_folder(dir.path());
  EXPECT_EQ(s.train.num_classes, 7u);
  EXPECT_EQ(s.test.num_classes, 7u);
  EXPECT_EQ(s.test.count, 1u);
}

TEST(NpyFolder, RefusesTestSplitOfAnotherShapeOrDtype) {
  TempDir dir;
  Pair p;
  dir.write("train_x.npy", p.x);
  dir.write("train_y.npy", p.y);
  dir.write("test_x.npy", npy(dict("<f4", "(1, 3)"), le_bytes<float>({1, 2, 3})));
  dir.write("test_y.npy", npy(dict("|u1", "(1,)"), {0}));
  EXPECT_NE(message_of([&] { load_data_folder(dir.path()); })
                .find("test_x.npy: sample shape: expected 2 tabular features (as in the "
                      "training split), found 3 tabular features"),
            std::string::npos);
  dir.write("test_x.npy", npy(dict("|u1", "(1, 2)"), {1, 2}));
  EXPECT_NE(
      message_of([&] { load_data_folder(dir.path()); }).find("test_x.npy: dtype: expected float32"),
      std::string::npos);
}

TEST(NpyFolder, NamesTheFirstMissingFile) {
  TempDir dir;
  Pair p;
  dir.write("train_x.npy", p.x);
  const std::string m = message_of([&] { load_data_folder(dir.path()); });
  EXPECT_NE(m.find("train_y.npy: file: expected an existing file"), std::string::npos) << m;
}

TEST(DataFolder, RefusesFolderWithNoKnownSetNamingWhatWasLookedFor) {
  TempDir dir;
  dir.write("notes.txt", {'h', 'i'});
  const std::string m = message_of([&] { load_data_folder(dir.path()); });
  for (const char* f : {"train-images-idx3-ubyte", "train_x.npy", "test_y.npy", "train.csv",
                        "test.csv", "found none"})
    EXPECT_NE(m.find(f), std::string::npos) << f << " in " << m;
  EXPECT_EQ(m.rfind(dir.path().string(), 0), 0u) << m;
}

TEST(DataFolder, RefusesFolderWithTwoFormats) {
  TempDir dir;
  dir.write("train.csv", {'1', ',', '2', '\n'});
  dir.write("train_x.npy", Pair{}.x);
  const std::string m = message_of([&] { load_data_folder(dir.path()); });
  EXPECT_NE(m.find("found NumPy and CSV files"), std::string::npos) << m;
}

TEST(DataFolder, LoadsTheIdxFixture) {
  const Splits s = load_data_folder(COHORT_FIXTURE_DIR);
  EXPECT_EQ(s.train.count, 512u);
  EXPECT_EQ(s.train.describe_shape(), "28x28 images");
  EXPECT_EQ(s.train.num_classes, 10u);
}

}  // namespace npy_test
}  // namespace cohort::data
