// The export module: the safetensors file parsed back with nlohmann-json (contiguous offsets,
// byte count, the PyTorch names and shapes of the mlp, the cnn and a layer list, the bytes
// themselves), the ONNX model parsed back with protobuf, and `cohort export` end to end with its
// errors. PyTorch and onnx.checker run the files in check_safetensors.py and check_onnx.py.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>

#include "cohort/checkpoint/checkpoint.hpp"
#include "cohort/core/error.hpp"
#include "cohort/export/export.hpp"
#include "testing.hpp"

namespace cohort::exporting {
namespace {

using cli::testing::cohort;
using nlohmann::json;

// Canonical weights of `spec` from the default initialisation, seed 7.
std::vector<float> canonical_weights(const nn::Model& m) {
  std::vector<float> stored(m.layout().total()), canonical(m.layout().total());
  m.init(stored.data(), 7);
  m.to_canonical(stored.data(), canonical.data());
  return canonical;
}

struct Parsed {
  json header;
  std::size_t data_begin = 0;
};

Parsed parse_safetensors(const std::vector<std::uint8_t>& file) {
  EXPECT_GE(file.size(), 8u);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | file[static_cast<std::size_t>(i)];
  EXPECT_LE(8 + n, file.size());
  EXPECT_EQ((8 + n) % 8, 0u) << "the data section starts 8-byte aligned";
  const std::string text(file.begin() + 8, file.begin() + 8 + static_cast<std::ptrdiff_t>(n));
  return {json::parse(text), 8 + n};
}

// Every tensor's offsets follow the previous one's, the last ends at the file's end, each holds
// its shape's bytes, and the bytes are the canonical weights at that tensor's offset.
void check_layout(const std::vector<std::uint8_t>& file, const nn::Model& m,
                  const std::vector<float>& canonical) {
  const Parsed p = parse_safetensors(file);
  const std::vector<Tensor> tensors = torch_tensors(m);
  ASSERT_EQ(p.header.size(), tensors.size() + 1);  // + __metadata__
  std::uint64_t expected_begin = 0;
  // nlohmann's json sorts keys; the offsets define the order, so walk the tensors in ours.
  for (const Tensor& t : tensors) {
    SCOPED_TRACE(t.name);
    ASSERT_TRUE(p.header.contains(t.name));
    const json& e = p.header[t.name];
    EXPECT_EQ(e["dtype"], "F32");
    EXPECT_EQ(e["shape"].get<std::vector<std::int64_t>>(), t.shape);
    const auto offsets = e["data_offsets"].get<std::vector<std::uint64_t>>();
    ASSERT_EQ(offsets.size(), 2u);
    EXPECT_EQ(offsets[0], expected_begin);
    EXPECT_EQ(offsets[1] - offsets[0], t.numel() * sizeof(float));
    expected_begin = offsets[1];
    ASSERT_LE(p.data_begin + offsets[1], file.size());
    EXPECT_EQ(std::memcmp(file.data() + p.data_begin + offsets[0], canonical.data() + t.offset,
                          t.numel() * sizeof(float)),
              0);
  }
  EXPECT_EQ(p.data_begin + expected_begin, file.size()) << "no bytes after the last tensor";
}

using Shapes = std::vector<std::pair<std::string, std::vector<std::int64_t>>>;

Shapes names_and_shapes(const std::vector<std::uint8_t>& file) {
  const Parsed p = parse_safetensors(file);
  // Back in file order (by begin offset), which is layer order.
  Shapes out;
  std::vector<std::pair<std::uint64_t, std::string>> order;
  for (const auto& [name, e] : p.header.items())
    if (name != "__metadata__") order.emplace_back(e["data_offsets"][0].get<std::uint64_t>(), name);
  std::sort(order.begin(), order.end());
  for (const auto& [begin, name] : order)
    out.emplace_back(name, p.header[name]["shape"].get<std::vector<std::int64_t>>());
  return out;
}

TEST(Safetensors, MlpHasThePeersNamesAndShapes) {
  const nn::Model m = nn::Model::parse("mlp:784-512-256-10");
  const auto w = canonical_weights(m);
  const auto file = encode_safetensors(m, w.data(), {.model = m.spec(), .step = 42});
  check_layout(file, m, w);
  EXPECT_EQ(names_and_shapes(file), (Shapes{{"fc1.weight", {512, 784}},
                                            {"fc1.bias", {512}},
                                            {"fc2.weight", {256, 512}},
                                            {"fc2.bias", {256}},
                                            {"fc3.weight", {10, 256}},
                                            {"fc3.bias", {10}}}));
  const json meta = parse_safetensors(file).header["__metadata__"];
  EXPECT_EQ(meta["model"], "mlp:784-512-256-10");
  EXPECT_EQ(meta["step"], "42");
  EXPECT_EQ(meta["naming"], "peer");
  EXPECT_EQ(meta["cohort_version"], cohort_version());
  for (const auto& [k, v] : meta.items()) EXPECT_TRUE(v.is_string()) << k;
}

TEST(Safetensors, CnnHasThePeersNamesAndShapes) {
  const nn::Model m = nn::Model::parse("cnn");
  const auto w = canonical_weights(m);
  const auto file = encode_safetensors(m, w.data(), {.model = m.spec()});
  check_layout(file, m, w);
  EXPECT_EQ(names_and_shapes(file), (Shapes{{"c1.weight", {32, 1, 5, 5}},
                                            {"c1.bias", {32}},
                                            {"c2.weight", {64, 32, 5, 5}},
                                            {"c2.bias", {64}},
                                            {"fc1.weight", {256, 1024}},
                                            {"fc1.bias", {256}},
                                            {"fc2.weight", {10, 256}},
                                            {"fc2.bias", {10}}}));
}

// A linear weight is exported (OC, IC): element (o, i) is the layout's (i, o).
TEST(Safetensors, LinearWeightsAreInPyTorchOrder) {
  const nn::Model m = nn::Model::parse("mlp:3-2");
  std::vector<float> stored(m.layout().total(), 0.0f), canonical(m.layout().total());
  const std::size_t w = m.layout().at("fc1.weight").offset;
  for (std::size_t k = 0; k < 6; ++k) stored[w + k] = static_cast<float>(k);  // (IC=3, OC=2)
  m.to_canonical(stored.data(), canonical.data());
  const auto file = encode_safetensors(m, canonical.data(), {.model = m.spec()});
  const Parsed p = parse_safetensors(file);
  float got[6];
  std::memcpy(got, file.data() + p.data_begin, sizeof got);
  // stored (i, o) = 2i + o; exported (o, i) row-major.
  const float want[6] = {0, 2, 4, 1, 3, 5};
  for (int k = 0; k < 6; ++k) EXPECT_EQ(got[k], want[k]) << k;
}

TEST(Safetensors, LayerListUsesSequentialIndices) {
  const std::string spec = "conv(4,3,1,1)-relu-avgpool(2)-dropout(0.5)-flatten-linear(10)";
  const nn::Model m = nn::Model::parse(spec);
  const auto w = canonical_weights(m);
  const auto file = encode_safetensors(m, w.data(), {.model = spec});
  check_layout(file, m, w);
  EXPECT_EQ(names_and_shapes(file), (Shapes{{"0.weight", {4, 1, 3, 3}},
                                            {"0.bias", {4}},
                                            {"5.weight", {10, 4 * 14 * 14}},
                                            {"5.bias", {10}}}));
  EXPECT_EQ(parse_safetensors(file).header["__metadata__"]["naming"], "sequential");
}

TEST(Onnx, GraphHasOneNodePerLayerAndTheWeights) {
  const std::string spec = "conv(4,3,2,1)-relu-maxpool(2)-dropout(0.5)-flatten-linear(10)";
  const nn::Model m = nn::Model::parse(spec);
  const auto w = canonical_weights(m);
  onnx::ModelProto proto;
  ASSERT_TRUE(proto.ParseFromString(encode_onnx(m, w.data(), {.model = spec})));
  EXPECT_EQ(proto.opset_import(0).version(), 13);
  const onnx::GraphProto& g = proto.graph();
  std::vector<std::string> ops;
  for (const auto& n : g.node()) ops.push_back(n.op_type());
  EXPECT_EQ(ops, (std::vector<std::string>{"Conv", "Relu", "MaxPool", "Flatten", "Gemm"}));
  EXPECT_EQ(g.input(0).name(), "input");
  EXPECT_EQ(g.input(0).type().tensor_type().shape().dim(0).dim_param(), "N");
  EXPECT_EQ(g.input(0).type().tensor_type().shape().dim_size(), 4);
  EXPECT_EQ(g.output(0).name(), "logits");
  EXPECT_EQ(g.node(4).output(0), "logits");
  ASSERT_EQ(g.initializer_size(), 4);
  EXPECT_EQ(g.initializer(2).name(), "5.weight");
  const Tensor conv = torch_tensors(m)[0];
  ASSERT_EQ(g.initializer(0).raw_data().size(), conv.numel() * sizeof(float));
  EXPECT_EQ(std::memcmp(g.initializer(0).raw_data().data(), w.data() + conv.offset,
                        conv.numel() * sizeof(float)),
            0);
}

TEST(Onnx, FlatModelHasAFlatInput) {
  const nn::Model m = nn::Model::parse("mlp:784-32-10");
  const auto w = canonical_weights(m);
  onnx::ModelProto proto;
  ASSERT_TRUE(proto.ParseFromString(encode_onnx(m, w.data(), {.model = m.spec()})));
  const auto& shape = proto.graph().input(0).type().tensor_type().shape();
  ASSERT_EQ(shape.dim_size(), 2);
  EXPECT_EQ(shape.dim(1).dim_value(), 784);
}

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
    c.weights = canonical_weights(m);
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
  check_layout(read(st), m, canonical_weights(m));
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

TEST_F(ExportCommand, MissingOutputFolderExitsTwo) {
  const auto out = (dir_ / "no_such_folder" / "m.onnx").string();
  const auto r =
      cohort({"export", "--checkpoint", save("mlp:784-10"), "--format", "onnx", "-o", out});
  EXPECT_EQ(r.code, cli::kExitBadInput);
  EXPECT_NE(r.err.find("no_such_folder missing"), std::string::npos) << r.err;
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

}  // namespace
}  // namespace cohort::exporting
