// The ONNX encoder: the model's inference graph (opset 13) built with the protobuf classes of
// Debian's libonnx-dev and serialized by protobuf; the layer lists' graph here, the language
// model's in onnx_gpt.cpp. Not an evaluator: tests/export checks the file with onnx.checker and
// a NumPy evaluator of the operators emitted here.
#include <onnx/onnx_pb.h>

#include <map>
#include <set>

#include "cohort/core/error.hpp"
#include "cohort/export/export.hpp"
#include "onnx_graph.hpp"

namespace cohort::exporting {

namespace {

using Kind = nn::LayerSpec::Kind;
using namespace onnx_graph;

// cohort's bn epsilon (PyTorch's BatchNorm default, src/nn/plan_resnet.cpp).
constexpr float kBnEpsilon = 1e-5f;

// The nodes of the layers, each reading the value its predecessor wrote. A layer's weights are
// the initializers of its PyTorch module ("<module>.weight", ...).
class Nodes {
 public:
  Nodes(onnx::GraphProto& graph, const nn::Model& model) : graph_(graph) {
    for (const Module& m : torch_modules(model)) module_[m.layer] = m.name;
  }

  // Adds the nodes of `l` reading the value `x`, the last one writing `out`; returns the value
  // the layer's output is (x for dropout, which adds no node).
  std::string layer(const nn::LayerSpec& l, const std::string& x, const std::string& out) {
    switch (l.kind) {
      case Kind::kLinear: {
        // y = x W^T + b with W (OC, IC) as PyTorch stores it.
        onnx::NodeProto& n = node("Gemm", x, out, {weight(l, "weight"), weight(l, "bias")});
        add_int(n, "transB", 1);
        break;
      }
      case Kind::kConv: {
        std::vector<std::string> w{weight(l, "weight")};
        if (l.has_bias) w.push_back(weight(l, "bias"));  // B is optional in Conv
        onnx::NodeProto& n = node("Conv", x, out, w);
        add_ints(n, "kernel_shape", {l.kernel, l.kernel});
        add_ints(n, "strides", {l.stride, l.stride});
        add_ints(n, "pads", {l.pad, l.pad, l.pad, l.pad});
        break;
      }
      case Kind::kBatchNorm: {
        // Inference: y = (x - running_mean) / sqrt(running_var + epsilon) * scale + shift per
        // channel, over (N, C, H, W) or (N, C).
        onnx::NodeProto& n = node("BatchNormalization", x, out,
                                  {weight(l, "weight"), weight(l, "bias"),
                                   weight(l, "running_mean"), weight(l, "running_var")});
        add_float(n, "epsilon", kBnEpsilon);
        break;
      }
      case Kind::kMaxPool:
      case Kind::kAvgPool: {
        // No padding, floor of the output size: the shapes Model::parse computes.
        onnx::NodeProto& n = node(l.kind == Kind::kMaxPool ? "MaxPool" : "AveragePool", x, out);
        add_ints(n, "kernel_shape", {l.kernel, l.kernel});
        add_ints(n, "strides", {l.stride, l.stride});
        break;
      }
      case Kind::kGap: {
        // (N, C, H, W) -> (N, C, 1, 1) -> (N, C), the flat output Model::parse gives gap.
        const std::string pooled = l.name + ".pool";
        node("GlobalAveragePool", x, pooled);
        add_int(node("Flatten", pooled, out), "axis", 1);
        break;
      }
      case Kind::kResidual: {
        // relu(body(x) + shortcut(x)), the shortcut the identity or conv1x1-bn.
        const std::string body = chain(l.body, x);
        const std::string shortcut = chain(l.shortcut, x);
        const std::string sum = l.name + ".add";
        node("Add", body, sum, {shortcut});
        node("Relu", sum, out);
        break;
      }
      case Kind::kReLU:
        node("Relu", x, out);
        break;
      case Kind::kFlatten:
        add_int(node("Flatten", x, out), "axis", 1);
        break;
      case Kind::kDropout:  // the identity at inference
        return x;
    }
    return out;
  }

 private:
  // A node reading x and `more` (values and nodes share the layers' names, all distinct).
  onnx::NodeProto& node(const std::string& op, const std::string& x, const std::string& out,
                        std::vector<std::string> more = {}) {
    more.insert(more.begin(), x);
    return add_node(graph_, op, more, out);
  }

  // The initializer "<module of l>.<what>".
  std::string weight(const nn::LayerSpec& l, const std::string& what) {
    const auto it = module_.find(&l);
    COHORT_CHECK(it != module_.end(), l.name + " has a PyTorch module");
    return it->second + "." + what;
  }

  // Layers one after another from x, each writing the value of its name; returns the last
  // value (x for none).
  std::string chain(const std::vector<nn::LayerSpec>& layers, std::string x) {
    for (const nn::LayerSpec& s : layers) x = layer(s, x, s.name);
    return x;
  }

  onnx::GraphProto& graph_;
  std::map<const nn::LayerSpec*, std::string> module_;
};

// The layer lists' graph: input "input" (N, C, H, W) or (N, F), output "logits" (N, classes).
void add_layers_graph(onnx::GraphProto& graph, const nn::Model& model, const Weights& w) {
  using Source = Tensor::Source;
  const nn::SampleShape in = model.input();
  std::vector<Dim> input_dims{"N", in.C};
  if (!in.flat()) input_dims.insert(input_dims.end(), {in.H, in.W});
  set_type(*graph.add_input(), "input", onnx::TensorProto::FLOAT, input_dims);

  // Initializers: the float tensors under their PyTorch names, in state_dict order.
  for (const Tensor& t : torch_tensors(model)) {
    if (t.source == Source::kBatchesTracked) continue;  // no operator's input
    const float* values = t.source == Source::kParams ? w.params : w.stats;
    COHORT_CHECK(values != nullptr, t.name);
    add_floats(graph, t.name, t.shape, values + t.offset);
  }

  Nodes nodes(graph, model);
  std::string current = "input";
  const auto& layers = model.layers();
  for (std::size_t i = 0; i < layers.size(); ++i)
    current = nodes.layer(layers[i], current, i + 1 == layers.size() ? "logits" : layers[i].name);
  COHORT_CHECK(current == "logits", "the last layer is linear (Model::parse)");
  set_type(*graph.add_output(), "logits", onnx::TensorProto::FLOAT, {"N", model.num_classes()});
}

}  // namespace

std::string encode_onnx(const nn::Model& model, const Weights& w, const Metadata& m) {
  // protobuf serializes no message of 2 GiB or more, and ONNX's external-data files are not
  // written: the weights (statistics and constants are small beside them) must leave room.
  constexpr std::size_t kMaxWeightBytes = (std::size_t{1} << 31) - (std::size_t{1} << 24);
  if (const std::size_t bytes = model.layout().numel() * sizeof(float); bytes > kMaxWeightBytes)
    throw InputError("--format onnx: expected at most " + std::to_string(kMaxWeightBytes) +
                     " bytes of weights (one protobuf message is under 2 GiB), found " +
                     std::to_string(bytes) + " for the model '" + m.model +
                     "'; --format safetensors has no such limit");
  onnx::ModelProto proto;
  proto.set_ir_version(7);  // ONNX 1.8+: what opset 13 came with
  proto.set_producer_name("cohort");
  proto.set_producer_version(cohort_version());
  onnx::OperatorSetIdProto* opset = proto.add_opset_import();
  opset->set_domain("");
  opset->set_version(13);
  for (const auto& [key, value] : metadata_strings(m)) {
    onnx::StringStringEntryProto* e = proto.add_metadata_props();
    e->set_key(key);
    e->set_value(value);
  }
  onnx::GraphProto* graph = proto.mutable_graph();
  graph->set_name("cohort");
  // Each model kind's graph, by its name (nn::ModelKind::name).
  static const std::map<std::string_view,
                        void (*)(onnx::GraphProto&, const nn::Model&, const Weights&)>
      kGraphs{{"layers", add_layers_graph}, {"gpt", add_gpt_graph}};
  const auto builder = kGraphs.find(model.kind().name());
  if (builder == kGraphs.end())
    throw InputError(
        "--format onnx: expected a model kind with an ONNX graph (layer lists, gpt:), "
        "found '" +
        m.model + "', of the kind " + std::string(model.kind().name()) +
        "; --format safetensors writes its weights");
  builder->second(*graph, model, w);
  std::set<std::string> read;
  for (const onnx::NodeProto& n : graph->node()) read.insert(n.input().begin(), n.input().end());
  for (const onnx::TensorProto& init : graph->initializer())
    COHORT_CHECK(read.count(init.name()) == 1, "the initializer " + init.name() + " is read");

  std::string bytes;
  COHORT_CHECK(proto.SerializeToString(&bytes), "protobuf serialization of the ONNX model");
  return bytes;
}

}  // namespace cohort::exporting
