// The ONNX export parsed back with protobuf: its opset, input and output, node types, node inputs
// and initializers (the bytes among them) for layer lists with max pooling, a nobias conv, bn,
// gap, residual blocks and dropout, for a flat input, and for resnet20 with its running
// statistics, and for a language model. onnx.checker and a NumPy evaluator run the files in
// check_onnx.py and check_gpt.py.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "cohort/export/export.hpp"
#include "cohort/nn/gpt/gpt.hpp"
#include "export_test_util.hpp"

namespace cohort::exporting {
namespace onnx_test {

using testing::canonical_weights;
using testing::Exported;
using testing::kBnList;
using Source = Tensor::Source;

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

// A model whose weights reach protobuf's 2 GiB limit is refused as input, naming the format
// that has no such limit, before any weight is read.
TEST(Onnx, WeightsPastTwoGibibytesAreRefused) {
  const nn::Model m = nn::Model::parse("mlp:784-400000-1000");  // 714,001,000 floats
  EXPECT_GT(m.layout().numel() * sizeof(float), std::size_t{1} << 31);
  try {
    encode_onnx(m, {.params = nullptr}, {.model = m.spec()});
    ADD_FAILURE() << "no InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--format safetensors"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("2856004000"), std::string::npos) << e.what();
  }
  const nn::Model fits = nn::Model::parse("mlp:784-200000-1000");  // 1.43 GB
  const Weights none{.params = nullptr};
  EXPECT_THROW(encode_onnx(fits, none, {.model = fits.spec()}), InternalError);  // past the check
}

// A language model: int64 token ids (N, T) in, logits (N, T, vocab) out, both with symbolic
// dimensions; nanoGPT's tensors as initializers (the head reads the token embedding: no
// lm_head.weight), then the graph's constants; per block two LayerNorms (two ReduceMeans each),
// four Gemms, one Softmax and one Erf; the head a Gemm on the token embedding.
TEST(Onnx, LanguageModelGraph) {
  const Exported e("gpt:2-2-8-6", {1, 1, 7}, 5);
  const onnx::ModelProto proto = e.onnx();
  const onnx::GraphProto& g = proto.graph();
  const auto dims = [](const onnx::ValueInfoProto& v) {
    std::vector<std::string> out;
    for (const auto& d : v.type().tensor_type().shape().dim())
      out.push_back(d.has_dim_param() ? d.dim_param() : std::to_string(d.dim_value()));
    return out;
  };
  ASSERT_EQ(g.input_size(), 1);
  EXPECT_EQ(g.input(0).name(), "input");
  EXPECT_EQ(g.input(0).type().tensor_type().elem_type(), onnx::TensorProto::INT64);
  EXPECT_EQ(dims(g.input(0)), (std::vector<std::string>{"N", "T"}));
  ASSERT_EQ(g.output_size(), 1);
  EXPECT_EQ(g.output(0).name(), "logits");
  EXPECT_EQ(dims(g.output(0)), (std::vector<std::string>{"N", "T", "5"}));

  const nn::GptModel& gpt = nn::gpt_model(e.model);
  const std::vector<std::string> names = initializer_names(g);
  const auto& entries = gpt.layout().entries();
  ASSERT_GT(names.size(), entries.size());
  for (std::size_t i = 0; i < entries.size(); ++i) EXPECT_EQ(names[i], entries[i].name);
  for (std::size_t i = entries.size(); i < names.size(); ++i)
    EXPECT_EQ(names[i].rfind("const.", 0), 0u) << names[i];
  EXPECT_EQ(std::count(names.begin(), names.end(), "lm_head.weight"), 0);
  const auto& wte = g.initializer(0);
  ASSERT_EQ(wte.raw_data().size(), 5u * 8u * sizeof(float));
  EXPECT_EQ(std::memcmp(wte.raw_data().data(), e.params.data() + gpt.wte(), 40 * sizeof(float)), 0);

  const std::vector<std::string> ops = op_types(g);
  const auto count = [&](const char* op) { return std::count(ops.begin(), ops.end(), op); };
  EXPECT_EQ(count("Gemm"), 2 * 4 + 1);
  EXPECT_EQ(count("ReduceMean"), 2 * (2 * 2 + 1));
  EXPECT_EQ(count("Softmax"), 2);
  EXPECT_EQ(count("Erf"), 2);
  const onnx::NodeProto& head = node_named(g, "lm_head");
  EXPECT_EQ(inputs(head), (std::vector<std::string>{"transformer.ln_f", "transformer.wte.weight"}));
  ASSERT_EQ(head.attribute_size(), 1);
  EXPECT_EQ(head.attribute(0).name(), "transB");
  EXPECT_EQ(head.attribute(0).i(), 1);
  EXPECT_EQ(
      inputs(node_named(g, "transformer.h.1.attn.c_attn")),
      (std::vector<std::string>{"transformer.h.1.ln_1", "transformer.h.1.attn.c_attn.weight"}));
  EXPECT_EQ(inputs(node_named(g, "transformer.h.1.attn.masked")),
            (std::vector<std::string>{"transformer.h.1.attn.scaled", "causal_mask"}));

  // The mask for windows of 6: 0 at and below the diagonal, minus infinity above it.
  for (const auto& init : g.initializer())
    if (init.name() == "const.causal_mask") {
      ASSERT_EQ(init.raw_data().size(), 36 * sizeof(float));
      std::vector<float> mask(36);
      std::memcpy(mask.data(), init.raw_data().data(), init.raw_data().size());
      for (int q = 0; q < 6; ++q)
        for (int k = 0; k < 6; ++k)
          EXPECT_EQ(mask[q * 6 + k], k <= q ? 0.0f : -INFINITY) << q << ", " << k;
    }
}

}  // namespace onnx_test
}  // namespace cohort::exporting
