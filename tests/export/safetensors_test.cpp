// The safetensors export parsed back with nlohmann-json (contiguous offsets, byte count, dtypes,
// the PyTorch names and shapes of the mlp, the cnn, resnet20 and layer lists with conv biases or
// none, bn, gap and residual blocks, the bytes themselves, bn's num_batches_tracked), the PyTorch
// module name of every layer with tensors, and num_batches_tracked counted from a checkpoint.
// PyTorch loads the files in check_safetensors.py.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <map>

#include "cohort/checkpoint/checkpoint.hpp"
#include "cohort/export/export.hpp"
#include "export_test_util.hpp"

namespace cohort::exporting {
namespace safetensors_test {

using nlohmann::json;
using testing::canonical_weights;
using testing::check_layout;
using testing::Exported;
using testing::kBnList;
using testing::parse_safetensors;
using testing::Parsed;
using Source = Tensor::Source;

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
  EXPECT_FALSE(meta.contains("vocab"));  // a classifier
  EXPECT_FALSE(meta.contains("characters"));
  for (const auto& [k, v] : meta.items()) EXPECT_TRUE(v.is_string()) << k;
}

// A language model's metadata carries its vocabulary: the size, and the characters of a text
// vocabulary in token order (UTF-8: "é" is two bytes, one token); token arrays have no characters.
TEST(Safetensors, LanguageModelRecordsItsVocabulary) {
  const nn::Model m = nn::Model::parse("gpt:1-1-4-3", {1, 1, 4}, 4);
  const auto w = canonical_weights(m);
  const Metadata text_meta{.model = m.spec(), .vocab = 4, .characters = "\n a\xc3\xa9"};
  const json text = parse_safetensors(encode_safetensors(m, {.params = w.data()}, text_meta))
                        .header["__metadata__"];
  EXPECT_EQ(text["vocab"], "4");
  EXPECT_EQ(text["characters"], "\n a\xc3\xa9");
  const Metadata tokens_meta{.model = m.spec(), .vocab = 4};
  const json tokens = parse_safetensors(encode_safetensors(m, {.params = w.data()}, tokens_meta))
                          .header["__metadata__"];
  EXPECT_EQ(tokens["vocab"], "4");
  EXPECT_FALSE(tokens.contains("characters"));
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

}  // namespace safetensors_test
}  // namespace cohort::exporting
