// The export module: the safetensors file parsed back with nlohmann-json (contiguous offsets,
// byte count, dtypes, the PyTorch names and shapes of the mlp, the cnn, resnet20 and layer lists
// with conv biases or none, bn, gap and residual blocks, the bytes themselves, bn's
// num_batches_tracked), the ONNX model parsed back with protobuf (its node types, inputs and
// initializers), and `cohort export` end to end with its errors. PyTorch and onnx.checker run the
// files in check_safetensors.py and check_onnx.py.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>

#include "cohort/checkpoint/checkpoint.hpp"
#include "cohort/core/error.hpp"
#include "cohort/export/export.hpp"
#include "testing.hpp"

namespace cohort::exporting {
namespace {

using cli::testing::cohort;
using nlohmann::json;
using Source = Tensor::Source;

// Canonical weights of `spec` from the default initialisation, seed 7.
std::vector<float> canonical_weights(const nn::Model& m) {
  std::vector<float> stored(m.layout().total()), canonical(m.layout().total());
  m.init(stored.data(), 7);
  m.to_canonical(stored.data(), canonical.data());
  return canonical;
}

// Running statistics unlike PyTorch's initial ones, so that a mix-up with the weights or between
// means and variances shows: element k of the array is 0.5 + k / 1000 (padding included).
std::vector<float> some_stats(const nn::Model& m) {
  std::vector<float> stats(m.stats_layout().total());
  for (std::size_t k = 0; k < stats.size(); ++k) stats[k] = 0.5f + static_cast<float>(k) / 1000;
  return stats;
}

// A model with its weights and running statistics, as a checkpoint holds them.
struct Exported {
  explicit Exported(const std::string& spec, nn::SampleShape input = {1, 28, 28})
      : model(nn::Model::parse(spec, input)),
        params(canonical_weights(model)),
        stats(some_stats(model)) {}
  Weights weights(std::int64_t batches = 0) const {
    return {.params = params.data(),
            .stats = stats.empty() ? nullptr : stats.data(),
            .batches_tracked = batches};
  }
  std::vector<std::uint8_t> safetensors(std::int64_t batches = 0) const {
    return encode_safetensors(model, weights(batches), {.model = model.spec()});
  }
  onnx::ModelProto onnx() const {
    onnx::ModelProto proto;
    EXPECT_TRUE(proto.ParseFromString(encode_onnx(model, weights(), {.model = model.spec()})));
    return proto;
  }
  nn::Model model;
  std::vector<float> params, stats;
};

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
// its shape's bytes of its dtype (F32, or I64 for num_batches_tracked), and the bytes are the
// canonical weights or running statistics at that tensor's offset, or `batches`.
void check_layout(const std::vector<std::uint8_t>& file, const nn::Model& m, const Weights& w) {
  const Parsed p = parse_safetensors(file);
  const std::vector<Tensor> tensors = torch_tensors(m);
  ASSERT_EQ(p.header.size(), tensors.size() + 1);  // + __metadata__
  std::uint64_t expected_begin = 0;
  // nlohmann's json sorts keys; the offsets define the order, so walk the tensors in ours.
  for (const Tensor& t : tensors) {
    SCOPED_TRACE(t.name);
    ASSERT_TRUE(p.header.contains(t.name));
    const json& e = p.header[t.name];
    const bool count = t.source == Source::kBatchesTracked;
    EXPECT_EQ(e["dtype"], count ? "I64" : "F32");
    EXPECT_EQ(e["shape"].get<std::vector<std::int64_t>>(), t.shape);
    const auto offsets = e["data_offsets"].get<std::vector<std::uint64_t>>();
    ASSERT_EQ(offsets.size(), 2u);
    EXPECT_EQ(offsets[0], expected_begin);
    EXPECT_EQ(offsets[1] - offsets[0], t.numel() * (count ? 8 : 4));
    expected_begin = offsets[1];
    ASSERT_LE(p.data_begin + offsets[1], file.size());
    const void* want = static_cast<const void*>(&w.batches_tracked);
    if (t.source == Source::kParams) want = w.params + t.offset;
    if (t.source == Source::kStats) want = w.stats + t.offset;
    EXPECT_EQ(std::memcmp(file.data() + p.data_begin + offsets[0], want, offsets[1] - offsets[0]),
              0);
  }
  EXPECT_EQ(p.data_begin + expected_begin, file.size()) << "no bytes after the last tensor";
}

using Shapes = std::vector<std::pair<std::string, std::vector<std::int64_t>>>;

Shapes names_and_shapes(const std::vector<std::uint8_t>& file) {
  const Parsed p = parse_safetensors(file);
  // Back in file order (by begin offset), which is state_dict order.
  Shapes out;
  std::vector<std::pair<std::uint64_t, std::string>> order;
  for (const auto& [name, e] : p.header.items())
    if (name != "__metadata__") order.emplace_back(e["data_offsets"][0].get<std::uint64_t>(), name);
  std::sort(order.begin(), order.end());
  for (const auto& [begin, name] : order)
    out.emplace_back(name, p.header[name]["shape"].get<std::vector<std::int64_t>>());
  return out;
}

// The state_dict entries of a PyTorch BatchNorm of C features named `module`.
void add_bn(Shapes& s, const std::string& module, std::int64_t C) {
  for (const char* t : {"weight", "bias", "running_mean", "running_var"})
    s.push_back({module + "." + t, {C}});
  s.push_back({module + ".num_batches_tracked", {}});
}

// The state_dict entries of torch_peer.py's BasicBlock(in, out, stride) named `module`.
void add_block(Shapes& s, const std::string& module, std::int64_t in, std::int64_t out,
               std::int64_t stride) {
  s.push_back({module + ".c1.weight", {out, in, 3, 3}});
  add_bn(s, module + ".b1", out);
  s.push_back({module + ".c2.weight", {out, out, 3, 3}});
  add_bn(s, module + ".b2", out);
  if (stride != 1 || in != out) {
    s.push_back({module + ".short.0.weight", {out, in, 1, 1}});
    add_bn(s, module + ".short.1", out);
  }
}

std::vector<std::string> op_types(const onnx::GraphProto& g) {
  std::vector<std::string> ops;
  for (const auto& n : g.node()) ops.push_back(n.op_type());
  return ops;
}

std::vector<std::string> initializer_names(const onnx::GraphProto& g) {
  std::vector<std::string> names;
  for (const auto& init : g.initializer()) names.push_back(init.name());
  return names;
}

const onnx::NodeProto& node_named(const onnx::GraphProto& g, const std::string& name) {
  for (const auto& n : g.node())
    if (n.name() == name) return n;
  ADD_FAILURE() << "no node " << name;
  return g.node(0);
}

std::vector<std::string> inputs(const onnx::NodeProto& n) {
  return {n.input().begin(), n.input().end()};
}

TEST(Safetensors, MlpHasThePeersNamesAndShapes) {
  const nn::Model m = nn::Model::parse("mlp:784-512-256-10");
  const auto w = canonical_weights(m);
  const auto file = encode_safetensors(m, {.params = w.data()}, {.model = m.spec(), .step = 42});
  check_layout(file, m, {.params = w.data()});
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
  const auto file = encode_safetensors(m, {.params = w.data()}, {.model = m.spec()});
  check_layout(file, m, {.params = w.data()});
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
  const auto file = encode_safetensors(m, {.params = canonical.data()}, {.model = m.spec()});
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
  const auto file = encode_safetensors(m, {.params = w.data()}, {.model = spec});
  check_layout(file, m, {.params = w.data()});
  EXPECT_EQ(names_and_shapes(file), (Shapes{{"0.weight", {4, 1, 3, 3}},
                                            {"0.bias", {4}},
                                            {"5.weight", {10, 4 * 14 * 14}},
                                            {"5.bias", {10}}}));
  EXPECT_EQ(parse_safetensors(file).header["__metadata__"]["naming"], "sequential");
}

// conv(..., nobias) is PyTorch's Conv2d(..., bias=False): a weight and no bias entry, so a
// strict load_state_dict into that module accepts the file, and every parameter float of the
// layout (padding excluded) is written once.
TEST(Safetensors, NobiasConvHasNoBiasTensor) {
  const std::string spec = "conv(4,3,1,1,nobias)-relu-maxpool(2)-flatten-linear(10)";
  const nn::Model m = nn::Model::parse(spec);
  const auto w = canonical_weights(m);
  const auto file = encode_safetensors(m, {.params = w.data()}, {.model = spec});
  check_layout(file, m, {.params = w.data()});
  EXPECT_EQ(
      names_and_shapes(file),
      (Shapes{{"0.weight", {4, 1, 3, 3}}, {"4.weight", {10, 4 * 14 * 14}}, {"4.bias", {10}}}));
  const Parsed p = parse_safetensors(file);
  EXPECT_FALSE(p.header.contains("0.bias"));
  EXPECT_EQ(file.size() - p.data_begin, m.layout().numel() * sizeof(float));
}

// resnet20 under the names of torch_peer.py's ResNet20, in its state_dict's order (128 entries):
// 21 convolutions without bias, 21 BatchNorm2d with their running statistics and
// num_batches_tracked, fc; its 272,186 parameters.
TEST(Safetensors, Resnet20HasThePeersNamesShapesAndStatistics) {
  const Exported e("resnet20");
  const auto file = e.safetensors(/*batches=*/96);
  check_layout(file, e.model, e.weights(96));
  Shapes want{{"stem.0.weight", {16, 1, 3, 3}}};
  add_bn(want, "stem.1", 16);
  std::int64_t in = 16;
  int block = 0;
  for (const std::int64_t out : {16, 32, 64})
    for (int i = 0; i < 3; ++i, ++block, in = out)
      add_block(want, "blocks." + std::to_string(block), in, out, i == 0 && out != 16 ? 2 : 1);
  want.push_back({"fc.weight", {10, 64}});
  want.push_back({"fc.bias", {10}});
  ASSERT_EQ(want.size(), 128u);
  EXPECT_EQ(names_and_shapes(file), want);
  EXPECT_EQ(parse_safetensors(file).header["__metadata__"]["naming"], "peer");
  std::size_t params = 0;
  for (const Tensor& t : torch_tensors(e.model))
    if (t.source == Source::kParams) params += t.numel();
  EXPECT_EQ(params, 272186u);
  EXPECT_EQ(params, e.model.layout().numel());
}

// Each exported tensor is the cohort tensor of the same member: the names map layer to module
// (blocks.3 is res4, its short.1 the shortcut's bn), not merely in the same order.
TEST(Safetensors, Resnet20NamesPointAtTheirCohortTensors) {
  const nn::Model m = nn::Model::parse("resnet20");
  std::map<std::string, const Tensor*> by_name;
  const std::vector<Tensor> tensors = torch_tensors(m);
  for (const Tensor& t : tensors) by_name[t.name] = &t;
  const std::pair<const char*, const char*> params[] = {
      {"stem.0.weight", "conv1.weight"},
      {"stem.1.bias", "bn1.bias"},
      {"blocks.0.c1.weight", "res1.conv1.weight"},
      {"blocks.3.b2.weight", "res4.bn2.weight"},
      {"blocks.3.short.0.weight", "res4.short.conv.weight"},
      {"blocks.6.short.1.bias", "res7.short.bn.bias"},
      {"blocks.8.c2.weight", "res9.conv2.weight"},
      {"fc.weight", "fc1.weight"}};
  for (const auto& [torch_name, cohort_name] : params) {
    ASSERT_TRUE(by_name.count(torch_name)) << torch_name;
    EXPECT_EQ(by_name[torch_name]->source, Source::kParams) << torch_name;
    EXPECT_EQ(by_name[torch_name]->offset, m.layout().at(cohort_name).offset) << torch_name;
  }
  const std::pair<const char*, const char*> stats[] = {
      {"stem.1.running_mean", "bn1.running_mean"},
      {"blocks.3.short.1.running_var", "res4.short.bn.running_var"},
      {"blocks.8.b1.running_mean", "res9.bn1.running_mean"}};
  for (const auto& [torch_name, cohort_name] : stats) {
    ASSERT_TRUE(by_name.count(torch_name)) << torch_name;
    EXPECT_EQ(by_name[torch_name]->source, Source::kStats) << torch_name;
    EXPECT_EQ(by_name[torch_name]->offset, m.stats_layout().at(cohort_name).offset) << torch_name;
  }
}

// A layer list with bn (after a conv, after a linear layer), residual blocks (identity and
// projection shortcut), a nobias conv and gap: module i of the nn.Sequential; a block's members
// are BasicBlock's (i.c1, i.b1, i.c2, i.b2, i.short.0, i.short.1).
constexpr const char* kBnList =
    "conv(4,3,1,1)-bn-relu-res(4)-res(8,2)-conv(8,3,1,1,nobias)-gap-linear(6)-bn-relu-"
    "dropout(0.5)-linear(10)";

TEST(Safetensors, LayerListWithBnGapAndResidualBlocks) {
  const Exported e(kBnList);
  const auto file = e.safetensors(/*batches=*/7);
  check_layout(file, e.model, e.weights(7));
  Shapes want{{"0.weight", {4, 1, 3, 3}}, {"0.bias", {4}}};
  add_bn(want, "1", 4);
  add_block(want, "3", 4, 4, 1);  // identity shortcut
  add_block(want, "4", 4, 8, 2);  // projection shortcut
  want.push_back({"5.weight", {8, 8, 3, 3}});
  want.push_back({"7.weight", {6, 8}});
  want.push_back({"7.bias", {6}});
  add_bn(want, "8", 6);  // BatchNorm1d
  want.push_back({"11.weight", {10, 6}});
  want.push_back({"11.bias", {10}});
  EXPECT_EQ(names_and_shapes(file), want);
  EXPECT_EQ(parse_safetensors(file).header["__metadata__"]["naming"], "sequential");
}

TEST(Modules, NamesOfEveryLayerWithTensors) {
  const nn::Model m = nn::Model::parse(kBnList);
  std::vector<std::pair<std::string, std::string>> got;
  for (const Module& mod : torch_modules(m)) got.emplace_back(mod.layer->name, mod.name);
  const std::vector<std::pair<std::string, std::string>> want{{"conv1", "0"},
                                                              {"bn1", "1"},
                                                              {"res1.conv1", "3.c1"},
                                                              {"res1.bn1", "3.b1"},
                                                              {"res1.conv2", "3.c2"},
                                                              {"res1.bn2", "3.b2"},
                                                              {"res2.conv1", "4.c1"},
                                                              {"res2.bn1", "4.b1"},
                                                              {"res2.conv2", "4.c2"},
                                                              {"res2.bn2", "4.b2"},
                                                              {"res2.short.conv", "4.short.0"},
                                                              {"res2.short.bn", "4.short.1"},
                                                              {"conv2", "5"},
                                                              {"fc1", "7"},
                                                              {"bn2", "8"},
                                                              {"fc2", "11"}};
  EXPECT_EQ(got, want);
  EXPECT_EQ(naming_for("resnet20"), Naming::kPeer);
  EXPECT_EQ(naming_for(nn::kResnet20Preset), Naming::kSequential);  // the list, not the preset
}

// num_batches_tracked counts the running statistics' updates: one per leaf of every applied
// step.
TEST(BatchesTracked, OnePerLeafOfEveryAppliedStep) {
  checkpoint::Checkpoint c;
  c.batch = 64;
  c.micro_batch = 32;
  c.train_count = 512;
  c.drop_last = true;
  c.step = c.updates = 10;
  EXPECT_EQ(batches_tracked(c), 20);  // 2 leaves a step
  c.micro_batch = 64;
  EXPECT_EQ(batches_tracked(c), 10);
  c.micro_batch = 0;  // none recorded: the batch is one leaf
  EXPECT_EQ(batches_tracked(c), 10);
  // Without drop_last an epoch of 520 rows ends with a batch of 8 rows: one leaf, not two.
  c.micro_batch = 32;
  c.train_count = 520;
  c.drop_last = false;
  c.step = c.updates = 20;  // 9 steps an epoch: 2 epochs (8 x 2 + 1 leaves each), then 2 steps
  EXPECT_EQ(batches_tracked(c), 2 * 17 + 2 * 2);
  c.updates = 17;
  c.skipped = 3;  // no fold, taken off as full batches
  EXPECT_EQ(batches_tracked(c), 2 * 17 + 2 * 2 - 3 * 2);
  // No sampler fields (a checkpoint made by hand): one per update.
  checkpoint::Checkpoint bare;
  bare.step = bare.updates = 5;
  EXPECT_EQ(batches_tracked(bare), 5);
}

TEST(Onnx, GraphHasOneNodePerLayerAndTheWeights) {
  const std::string spec = "conv(4,3,2,1)-relu-maxpool(2)-dropout(0.5)-flatten-linear(10)";
  const nn::Model m = nn::Model::parse(spec);
  const auto w = canonical_weights(m);
  onnx::ModelProto proto;
  ASSERT_TRUE(proto.ParseFromString(encode_onnx(m, {.params = w.data()}, {.model = spec})));
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

// A nobias conv is a Conv node with two inputs (X, W): ONNX's B is optional, and no initializer
// stands in for it.
TEST(Onnx, NobiasConvHasTwoInputs) {
  const std::string spec = "conv(4,3,1,1,nobias)-relu-maxpool(2)-flatten-linear(10)";
  const nn::Model m = nn::Model::parse(spec);
  const auto w = canonical_weights(m);
  onnx::ModelProto proto;
  ASSERT_TRUE(proto.ParseFromString(encode_onnx(m, {.params = w.data()}, {.model = spec})));
  const onnx::GraphProto& g = proto.graph();
  ASSERT_EQ(g.node_size(), 5);
  ASSERT_EQ(g.node(0).op_type(), "Conv");
  ASSERT_EQ(g.node(0).input_size(), 2);
  EXPECT_EQ(g.node(0).input(0), "input");
  EXPECT_EQ(g.node(0).input(1), "0.weight");
  ASSERT_EQ(g.node(4).op_type(), "Gemm");
  ASSERT_EQ(g.node(4).input_size(), 3);
  EXPECT_EQ(g.node(4).input(1), "4.weight");
  EXPECT_EQ(g.node(4).input(2), "4.bias");
  std::vector<std::string> names;
  for (const auto& init : g.initializer()) names.push_back(init.name());
  EXPECT_EQ(names, (std::vector<std::string>{"0.weight", "4.weight", "4.bias"}));
}

TEST(Onnx, FlatModelHasAFlatInput) {
  const nn::Model m = nn::Model::parse("mlp:784-32-10");
  const auto w = canonical_weights(m);
  onnx::ModelProto proto;
  ASSERT_TRUE(proto.ParseFromString(encode_onnx(m, {.params = w.data()}, {.model = m.spec()})));
  const auto& shape = proto.graph().input(0).type().tensor_type().shape();
  ASSERT_EQ(shape.dim_size(), 2);
  EXPECT_EQ(shape.dim(1).dim_value(), 784);
}

// resnet20: the stem (Conv, BatchNormalization, Relu), per block its body (Conv, BN, Relu, Conv,
// BN), the projection shortcut's Conv and BN where there is one, Add and Relu; then
// GlobalAveragePool, Flatten and Gemm. The initializers are the float tensors of the
// safetensors file under the same names (no num_batches_tracked), the statistics among them.
TEST(Onnx, Resnet20GraphHasBatchNormAddAndGlobalAveragePool) {
  const Exported e("resnet20");
  const onnx::ModelProto proto = e.onnx();
  const onnx::GraphProto& g = proto.graph();
  std::vector<std::string> want{"Conv", "BatchNormalization", "Relu"};
  for (int block = 0; block < 9; ++block) {
    for (const char* op : {"Conv", "BatchNormalization", "Relu", "Conv", "BatchNormalization"})
      want.push_back(op);
    if (block == 3 || block == 6) {
      want.push_back("Conv");
      want.push_back("BatchNormalization");
    }
    want.push_back("Add");
    want.push_back("Relu");
  }
  for (const char* op : {"GlobalAveragePool", "Flatten", "Gemm"}) want.push_back(op);
  EXPECT_EQ(op_types(g), want);

  std::vector<std::string> floats;
  for (const Tensor& t : torch_tensors(e.model))
    if (t.source != Source::kBatchesTracked) floats.push_back(t.name);
  EXPECT_EQ(initializer_names(g), floats);
  EXPECT_EQ(floats.size(), 128u - 21u);

  const onnx::NodeProto& stem_bn = node_named(g, "bn1");
  EXPECT_EQ(inputs(stem_bn),
            (std::vector<std::string>{"conv1", "stem.1.weight", "stem.1.bias",
                                      "stem.1.running_mean", "stem.1.running_var"}));
  ASSERT_EQ(stem_bn.attribute_size(), 1);
  EXPECT_EQ(stem_bn.attribute(0).name(), "epsilon");
  EXPECT_EQ(stem_bn.attribute(0).f(), 1e-5f);
  EXPECT_EQ(inputs(node_named(g, "res4.conv1")),
            (std::vector<std::string>{"res3", "blocks.3.c1.weight"}));  // no bias
  EXPECT_EQ(inputs(node_named(g, "res4.short.conv")),
            (std::vector<std::string>{"res3", "blocks.3.short.0.weight"}));
  EXPECT_EQ(inputs(node_named(g, "res4.add")),
            (std::vector<std::string>{"res4.bn2", "res4.short.bn"}));
  EXPECT_EQ(inputs(node_named(g, "res2.add")), (std::vector<std::string>{"res2.bn2", "res1"}));
  EXPECT_EQ(inputs(node_named(g, "res2")), (std::vector<std::string>{"res2.add"}));
  EXPECT_EQ(inputs(node_named(g, "gap1.pool")), (std::vector<std::string>{"res9"}));
  EXPECT_EQ(inputs(node_named(g, "gap1")), (std::vector<std::string>{"gap1.pool"}));
  EXPECT_EQ(inputs(node_named(g, "logits")),
            (std::vector<std::string>{"gap1", "fc.weight", "fc.bias"}));

  // The running statistics' bytes.
  const auto& stats = e.model.stats_layout().at("res4.short.bn.running_var");
  for (const auto& init : g.initializer())
    if (init.name() == "blocks.3.short.1.running_var") {
      ASSERT_EQ(init.raw_data().size(), 32 * sizeof(float));
      EXPECT_EQ(
          std::memcmp(init.raw_data().data(), e.stats.data() + stats.offset, 32 * sizeof(float)),
          0);
    }
}

// A layer list: bn after a linear layer is a BatchNormalization on (N, C); gap is
// GlobalAveragePool and Flatten; dropout has no node.
TEST(Onnx, LayerListWithBnGapAndResidualBlocks) {
  const Exported e(kBnList);
  const onnx::ModelProto proto = e.onnx();
  const onnx::GraphProto& g = proto.graph();
  using Ops = std::vector<std::string>;
  const Ops identity_block{
      "Conv", "BatchNormalization", "Relu", "Conv", "BatchNormalization", "Add", "Relu"};
  const Ops projection_block{"Conv", "BatchNormalization", "Relu", "Conv", "BatchNormalization",
                             "Conv", "BatchNormalization", "Add",  "Relu"};
  Ops want;
  for (const Ops& layer :
       {Ops{"Conv"}, Ops{"BatchNormalization"}, Ops{"Relu"}, identity_block, projection_block,
        Ops{"Conv"}, Ops{"GlobalAveragePool", "Flatten"}, Ops{"Gemm"}, Ops{"BatchNormalization"},
        Ops{"Relu"}, Ops{/*dropout*/}, Ops{"Gemm"}})
    want.insert(want.end(), layer.begin(), layer.end());
  EXPECT_EQ(op_types(g), want);
  EXPECT_EQ(inputs(node_named(g, "conv1")),
            (std::vector<std::string>{"input", "0.weight", "0.bias"}));
  EXPECT_EQ(inputs(node_named(g, "res1.add")), (std::vector<std::string>{"res1.bn2", "relu1"}));
  EXPECT_EQ(
      inputs(node_named(g, "bn2")),
      (std::vector<std::string>{"fc1", "8.weight", "8.bias", "8.running_mean", "8.running_var"}));
  EXPECT_EQ(inputs(node_named(g, "logits")),
            (std::vector<std::string>{"relu2", "11.weight", "11.bias"}));
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
