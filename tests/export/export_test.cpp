// `cohort export` end to end: a checkpoint of the cnn, of resnet20 (its running statistics) or of
// 3-channel images written in both formats, no temporary file left; its errors, exit 2 naming the
// checkpoint, the flag or the folder; and the --format names. The files' contents are tested in
// safetensors_test.cpp and onnx_test.cpp.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "cohort/checkpoint/checkpoint.hpp"
#include "cohort/core/error.hpp"
#include "cohort/export/export.hpp"
#include "export_test_util.hpp"
#include "testing.hpp"

namespace cohort::exporting {
namespace export_test {

using cli::testing::cohort;
using nlohmann::json;
using testing::canonical_weights;
using testing::check_layout;
using testing::Exported;
using testing::parse_safetensors;
using testing::some_stats;

TEST(Format, UnknownNameIsRefusedNamingTheFlag) {
  EXPECT_EQ(parse_format("onnx"), Format::kOnnx);
  EXPECT_EQ(parse_format("safetensors"), Format::kSafetensors);
  try {
    parse_format("pickle");
    FAIL() << "no exception";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--format"), std::string::npos) << e.what();
  }
}

class ExportCommand : public cli::testing::TempDirTest {
 protected:
  std::string save(const std::string& spec) {
    const nn::Model m = nn::Model::parse(spec);
    checkpoint::Checkpoint c;
    c.model = spec;
    c.step = 3;
    c.updates = 3;
    c.batch = 64;
    c.micro_batch = 32;
    c.train_count = 512;
    c.weights = canonical_weights(m);
    c.running_stats = some_stats(m);
    const auto path = (dir_ / "model.ckpt").string();
    checkpoint::save_checkpoint(path, c);
    return path;
  }
  static std::vector<std::uint8_t> read(const std::filesystem::path& p) {
    std::ifstream f(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
  }
};

TEST_F(ExportCommand, WritesBothFormatsAndNoTemporaryFile) {
  const std::string ck = save("cnn");
  const auto st = (dir_ / "m.safetensors").string(), ox = (dir_ / "m.onnx").string();
  auto r = cohort({"export", "--checkpoint", ck, "--format", "safetensors", "-o", st});
  ASSERT_EQ(r.code, cli::kExitOk) << r.err;
  const nn::Model m = nn::Model::parse("cnn");
  const auto w = canonical_weights(m);
  check_layout(read(st), m, {.params = w.data()});
  EXPECT_EQ(parse_safetensors(read(st)).header["__metadata__"]["step"], "3");
  r = cohort({"export", "--checkpoint", ck, "--format", "onnx", "--output", ox});
  ASSERT_EQ(r.code, cli::kExitOk) << r.err;
  onnx::ModelProto proto;
  const auto bytes = read(ox);
  EXPECT_TRUE(proto.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())));
  std::size_t files = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir_)) ++files;
  EXPECT_EQ(files, 3u) << "checkpoint and two exports, no temporary file left";
}

// A resnet20 checkpoint exports in both formats: its running statistics as the bn buffers,
// num_batches_tracked 6 (3 steps of 2 leaves).
TEST_F(ExportCommand, ExportsResnet20WithItsRunningStatistics) {
  const std::string ck = save("resnet20");
  const auto st = (dir_ / "r.safetensors").string(), ox = (dir_ / "r.onnx").string();
  auto r = cohort({"export", "--checkpoint", ck, "--format", "safetensors", "-o", st});
  ASSERT_EQ(r.code, cli::kExitOk) << r.err;
  const Exported e("resnet20");
  check_layout(read(st), e.model, e.weights(/*batches=*/6));
  r = cohort({"export", "--checkpoint", ck, "--format", "onnx", "-o", ox});
  ASSERT_EQ(r.code, cli::kExitOk) << r.err;
  onnx::ModelProto proto;
  const auto bytes = read(ox);
  ASSERT_TRUE(proto.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())));
  EXPECT_EQ(proto.graph().initializer_size(), 128 - 21);
}

// A checkpoint whose running statistics do not fit its model's bn layers (here: none) is refused.
TEST_F(ExportCommand, BnModelWithoutRunningStatisticsIsRefused) {
  const std::string spec = "conv(4,3)-bn-relu-flatten-linear(10)";
  checkpoint::Checkpoint c;
  c.model = spec;
  c.weights = canonical_weights(nn::Model::parse(spec));
  const auto path = (dir_ / "nostats.ckpt").string();
  checkpoint::save_checkpoint(path, c);
  const auto r = cohort(
      {"export", "--checkpoint", path, "--format", "onnx", "-o", (dir_ / "m.onnx").string()});
  EXPECT_EQ(r.code, cli::kExitBadInput);
  EXPECT_NE(r.err.find(path), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("running-statistics"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir_ / "m.onnx"));
}

TEST_F(ExportCommand, MissingCheckpointExitsTwoNamingTheFile) {
  const auto missing = (dir_ / "nope.ckpt").string();
  const auto r = cohort(
      {"export", "--checkpoint", missing, "--format", "onnx", "-o", (dir_ / "m.onnx").string()});
  EXPECT_EQ(r.code, cli::kExitBadInput);
  EXPECT_NE(r.err.find(missing), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir_ / "m.onnx"));
}

TEST_F(ExportCommand, CorruptCheckpointExitsTwo) {
  const auto bad = dir_ / "bad.ckpt";
  std::ofstream(bad) << "not a checkpoint";
  const auto r = cohort({"export", "--checkpoint", bad.string(), "--format", "safetensors", "-o",
                         (dir_ / "m.safetensors").string()});
  EXPECT_EQ(r.code, cli::kExitBadInput);
  EXPECT_NE(r.err.find(bad.string()), std::string::npos) << r.err;
}

TEST_F(ExportCommand, UnknownFormatExitsTwoNamingTheFlag) {
  const auto r = cohort({"export", "--checkpoint", save("mlp:784-10"), "--format", "pickle", "-o",
                         (dir_ / "m.pt").string()});
  EXPECT_EQ(r.code, cli::kExitBadInput);
  EXPECT_NE(r.err.find("--format"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("pickle"), std::string::npos) << r.err;
}

// -o's missing folders are created; a folder that cannot be (a file stands in its place) is exit
// 2 naming it.
TEST_F(ExportCommand, CreatesTheOutputsFoldersOrExitsTwo) {
  const auto out = (dir_ / "no_such_folder" / "deeper" / "m.onnx").string();
  auto r = cohort({"export", "--checkpoint", save("mlp:784-10"), "--format", "onnx", "-o", out});
  EXPECT_EQ(r.code, cli::kExitOk) << r.err;
  EXPECT_TRUE(std::filesystem::is_regular_file(out));
  std::ofstream(dir_ / "a_file") << "a file, not a folder\n";
  const auto blocked = (dir_ / "a_file" / "m.onnx").string();
  r = cohort({"export", "--checkpoint", save("mlp:784-10"), "--format", "onnx", "-o", blocked});
  EXPECT_EQ(r.code, cli::kExitBadInput);
  EXPECT_NE(r.err.find("a_file is not a folder"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--output"), std::string::npos) << r.err;
}

// A checkpoint of 3-channel 8x8 images (its META input) exports with that input: the first
// convolution's weight is (OC, 3, KH, KW) and the ONNX input (N, 3, 8, 8).
TEST_F(ExportCommand, UsesTheCheckpointsInputShape) {
  const std::string spec = "conv(4,3)-relu-flatten-linear(5)";
  const nn::Model m = nn::Model::parse(spec, {3, 8, 8});
  checkpoint::Checkpoint c;
  c.model = spec;
  c.input = {3, 8, 8};
  c.weights = canonical_weights(m);
  const auto path = (dir_ / "rgb.ckpt").string();
  checkpoint::save_checkpoint(path, c);
  const auto st = (dir_ / "rgb.safetensors").string(), ox = (dir_ / "rgb.onnx").string();
  ASSERT_EQ(cohort({"export", "--checkpoint", path, "--format", "safetensors", "-o", st}).code,
            cli::kExitOk);
  const auto header = parse_safetensors(read(st)).header;
  EXPECT_EQ(header["__metadata__"]["input"], "3,8,8");
  EXPECT_EQ(header["0.weight"]["shape"], json::array({4, 3, 3, 3}));
  ASSERT_EQ(cohort({"export", "--checkpoint", path, "--format", "onnx", "-o", ox}).code,
            cli::kExitOk);
  onnx::ModelProto proto;
  const auto bytes = read(ox);
  ASSERT_TRUE(proto.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())));
  const auto& dims = proto.graph().input(0).type().tensor_type().shape().dim();
  ASSERT_EQ(dims.size(), 4);
  EXPECT_EQ(dims[1].dim_value(), 3);
  EXPECT_EQ(dims[2].dim_value(), 8);
}

TEST_F(ExportCommand, WeightsOfAnotherModelAreRefused) {
  const nn::Model small = nn::Model::parse("mlp:784-10");
  checkpoint::Checkpoint c;
  c.model = "mlp:784-20-10";  // a spec that does not match the weights
  c.weights = canonical_weights(small);
  const auto path = (dir_ / "mismatch.ckpt").string();
  checkpoint::save_checkpoint(path, c);
  const auto r = cohort(
      {"export", "--checkpoint", path, "--format", "onnx", "-o", (dir_ / "m.onnx").string()});
  EXPECT_EQ(r.code, cli::kExitBadInput);
  EXPECT_NE(r.err.find(path), std::string::npos) << r.err;
}

}  // namespace export_test
}  // namespace cohort::exporting
