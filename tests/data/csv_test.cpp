// The CSV reader: tabular files with and without a header line (the header rule), with a UTF-8
// byte-order mark and CRLF line ends, load as float32 features and integer labels as given; every
// malformed file is refused with an InputError naming the file, the line and the problem.
#include "cohort/data/csv.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "cohort/core/error.hpp"

namespace cohort::data {
namespace csv_test {

const std::string kUtf8Bom = "\xEF\xBB\xBF";

Dataset read(const std::string& text, const CsvLimits& limits = {}) {
  return read_csv_split(text, "train.csv", "train", limits);
}

TEST(Csv, ReadsHeaderlessFile) {
  const Dataset d = read("1,0.5,2\n0,-1e-3,3.25\n4,0,1\n");
  EXPECT_EQ(d.count, 3u);
  EXPECT_TRUE(d.tabular);
  EXPECT_EQ(d.rows, 1u);
  EXPECT_EQ(d.cols, 2u);
  EXPECT_EQ(d.num_classes, 5u);
  EXPECT_TRUE(d.images.empty());
  EXPECT_EQ(d.float_features, (std::vector<float>{0.5f, 2.f, -1e-3f, 3.25f, 0.f, 1.f}));
  EXPECT_EQ(d.labels, (std::vector<std::uint32_t>{1, 0, 4}));
}

TEST(Csv, DetectsHeaderAndAcceptsCrlfAndMissingFinalNewline) {
  const Dataset d = read("label,a,b\r\n2,1,2\r\n0,3,4");
  EXPECT_EQ(d.count, 2u);
  EXPECT_EQ(d.float_features, (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(d.num_classes, 3u);
}

TEST(Csv, FeaturesAreTakenAsGivenAndRoundTripFloat32) {
  // 9 significant digits name every float32 exactly: what convert_dataset.py writes.
  const Dataset d = read("0,0.00392156886,0.333333343,255\n");
  EXPECT_EQ(d.float_features[0], 1.0f / 255.0f);
  EXPECT_EQ(d.float_features[1], 85.0f / 255.0f);
  EXPECT_EQ(d.float_features[2], 255.0f);
  std::vector<float> x(3);
  std::vector<std::int32_t> y(1);
  const std::uint32_t ids[] = {0};
  assemble_batch(d, ids, x.data(), y.data());
  EXPECT_EQ(x, d.float_features);
}

// A UTF-8 byte-order mark at the start (Excel's "CSV UTF-8", Notepad) is skipped: the first
// line is then read like any other, a sample here.
TEST(Csv, ByteOrderMarkIsSkipped) {
  const Dataset d = read(kUtf8Bom + "1,0.5,2\n0,1,2\n2,3,4\n");
  EXPECT_EQ(d.count, 3u);
  EXPECT_EQ(d.labels, (std::vector<std::uint32_t>{1, 0, 2}));
  EXPECT_EQ(d.float_features, (std::vector<float>{0.5f, 2, 1, 2, 3, 4}));
}

TEST(Csv, ByteOrderMarkWithHeaderAndCrlf) {
  const Dataset d = read(kUtf8Bom + "label,a,b\r\n2,1,2\r\n0,3,4\r\n");
  EXPECT_EQ(d.count, 2u);
  EXPECT_EQ(d.labels, (std::vector<std::uint32_t>{2, 0}));
  EXPECT_EQ(d.float_features, (std::vector<float>{1, 2, 3, 4}));
  const Dataset n = read(kUtf8Bom + "1,5\r\n0,6\r\n");
  EXPECT_EQ(n.count, 2u);
  EXPECT_EQ(n.float_features, (std::vector<float>{5, 6}));
}

// The header rule: a first line with any cell that is not a number is a header, wherever that
// cell is; a first line of numbers only is a sample.
TEST(Csv, FirstLineWithAnyNonNumericCellIsAHeader) {
  for (const std::string first : {"label,a,b", "0,a,b", "1,2,x", ",0,1", "y,x1,2"}) {
    SCOPED_TRACE(first);
    const Dataset d = read(first + "\n1,0.5,2\r\n0,3,4\n");
    EXPECT_EQ(d.count, 2u);
    EXPECT_EQ(d.labels, (std::vector<std::uint32_t>{1, 0}));
    EXPECT_EQ(d.float_features, (std::vector<float>{0.5f, 2, 3, 4}));
  }
}

TEST(Csv, FirstLineOfNumbersIsASample) {
  // pandas' to_csv(index=False) of unnamed columns writes "0,1,2": numbers, so a sample.
  const Dataset d = read("0,1,2\n1,0.5,2\n");
  EXPECT_EQ(d.count, 2u);
  EXPECT_EQ(d.labels, (std::vector<std::uint32_t>{0, 1}));
  EXPECT_EQ(d.float_features, (std::vector<float>{1, 2, 0.5f, 2}));
}

struct BadCsv {
  std::string name;
  std::string text;
  std::string problem;  // after "train.csv"
  CsvLimits limits = {};
};
class CsvBadInput : public ::testing::TestWithParam<BadCsv> {};

TEST_P(CsvBadInput, IsRefusedNamingFileLineAndProblem) {
  try {
    read(GetParam().text, GetParam().limits);
    FAIL() << "accepted";
  } catch (const InputError& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind("train.csv", 0), 0u) << m;
    EXPECT_NE(m.find(GetParam().problem), std::string::npos) << m;
  }
}

const BadCsv kBadCsv[] = {
    {"Empty", "", "train.csv: file: expected a header line or samples, found 0 bytes (empty)"},
    {"HeaderOnly", "label,x1,x2\n", "found only the header (header-only file)"},
    {"ShortRow", "1,2,3\n0,1\n",
     "train.csv:2: columns: expected 3 cells (as on line 1), found 2 (ragged row)"},
    {"LongRow", "1,2,3\n0,1,2\n1,1,1,1\n", ":3: columns: expected 3 cells"},
    {"HeaderOfOtherWidth", "label,x\n1,2,3\n",
     ":2: columns: expected 2 cells (as on line 1), the header"},
    {"OneColumn", "1\n2\n", ":1: columns: expected a label and at least one feature"},
    {"SemicolonSeparated", "1;0.5;2\n", ":1: columns: expected a label and at least one feature"},
    {"NonNumericFeature", "1,0.5\n0,abc\n",
     ":2: column 2: expected a number, found 'abc' (non-numeric)"},
    {"EmptyCell", "1,0,2\n1,,2\n", ":2: column 2: expected a number, found '' (non-numeric)"},
    {"SpaceInCell", "1,2\n1, 2\n", ":2: column 2: expected a number, found ' 2'"},
    {"QuotedCell", "1,2\n1,\"2\"\n", ":2: column 2: expected a number, found '\"2\"'"},
    {"PlusSign", "1,2\n1,+2\n", ":2: column 2: expected a number, found '+2'"},
    {"NonNumericLabel", "1,2\nx,3\n",
     ":2: column 1 (label): expected an integer class in [0, 65536), found 'x' (not an integer)"},
    {"FractionalLabel", "1.5,2\n", ":1: column 1 (label): expected an integer class"},
    {"EmptyLabel", "1,2\n,3\n", ":2: column 1 (label)"},
    {"NegativeLabel", "1,2\n-1,3\n",
     ":2: column 1 (label): expected a class in [0, 65536), found '-1' (negative)"},
    {"LabelTooLarge", "70000,2\n", "found '70000' (too large)"},
    {"NaNFeature", "1,2\n0,nan\n", ":2: column 2: expected a finite number, found 'nan' (NaN)"},
    {"InfiniteFeature", "1,-inf\n",
     ":1: column 2: expected a finite number, found '-inf' (infinite"},
    {"OutOfFloatRange", "1,1e999\n", "found '1e999' (infinite or out of float range)"},
    {"EmptyLineInside", "1,2\n\n0,3\n",
     ":2: line: expected a sample (label, features...), found an empty line"},
    {"BinaryJunk", "1,2\n1,\x01\x02\n",
     ":2: column 2: expected a number, found '\\x01\\x02' (non-numeric)"},
    // On line 1 the same cells make a header (any non-numeric cell): a file of it alone is
    // header-only.
    {"EmptyCellOnLineOne", "1,,2\n", "found only the header (header-only file)"},
    {"SpaceInCellOnLineOne", "1, 2\n", "found only the header (header-only file)"},
    {"OnlyAByteOrderMark", "\xEF\xBB\xBF",
     "train.csv: file: expected a header line or samples, found only a UTF-8 byte-order mark"},
    {"ByteOrderMarkAndHeaderOnly", "\xEF\xBB\xBFlabel,x\r\n",
     "found only the header (header-only file)"},
    {"Utf16LittleEndian", std::string{'\xFF', '\xFE', '1', '\0', ',', '\0', '2', '\0', '\n', '\0'},
     "train.csv: file: expected ASCII or UTF-8 text, found a UTF-16 byte-order mark"},
    {"Utf16BigEndian", std::string{'\xFE', '\xFF', '\0', '1', '\0', ',', '\0', '2', '\0', '\n'},
     "found a UTF-16 byte-order mark"},
    {"TooManyFeatures",
     "1,2,3,4\n",
     ":1: columns: expected at most 2 features, found 3",
     {.max_features = 2}},
    {"SizeLimit",
     "1,2,3\n0,1,2\n1,1,1\n",
     ":3: size: expected at most 4 feature values in all",
     {.max_values = 4}},
};

INSTANTIATE_TEST_SUITE_P(Csv, CsvBadInput, ::testing::ValuesIn(kBadCsv),
                         [](const auto& test) { return test.param.name; });

TEST(CsvFolder, ChecksBothFilesAndClassCountCoversBoth) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("cohort_csv_test_folder_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "train.csv") << "label,a,b\n0,1,2\n1,3,4\n";
  std::ofstream(dir / "test.csv") << "8,1,2\n";
  Splits s = load_data_folder(dir);
  EXPECT_EQ(s.train.num_classes, 9u);
  EXPECT_EQ(s.test.num_classes, 9u);
  std::ofstream(dir / "test.csv") << "8,1,2,3\n";
  try {
    load_data_folder(dir);
    ADD_FAILURE() << "accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "test.csv: sample shape: expected 2 tabular features (as in the training "
                  "split), found 3 tabular features"),
              std::string::npos)
        << e.what();
  }
  std::ofstream(dir / "test.csv", std::ios::trunc).flush();
  try {
    load_data_folder(dir);
    ADD_FAILURE() << "accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("test.csv: file: expected a non-empty file"),
              std::string::npos)
        << e.what();
  }
  std::filesystem::remove_all(dir);
}

}  // namespace csv_test
}  // namespace cohort::data
