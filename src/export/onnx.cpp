// The ONNX encoder: the model's inference graph (opset 13) built with the protobuf classes of
// Debian's libonnx-dev and serialized by protobuf. Not an evaluator: tests/export checks the
// file with onnx.checker and a NumPy evaluator of the operators emitted here.
#include <onnx/onnx_pb.h>

#include <map>
#include <set>

#include "cohort/core/error.hpp"
#include "cohort/export/export.hpp"

namespace cohort::exporting {

namespace {

using Kind = nn::LayerSpec::Kind;

// cohort's bn epsilon (PyTorch's BatchNorm default, src/nn/plan_resnet.cpp).
constexpr float kBnEpsilon = 1e-5f;

void add_ints(onnx::NodeProto& node, const std::string& name, std::vector<std::int64_t> values) {
  onnx::AttributeProto* a = node.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INTS);
  for (auto v : values) a->add_ints(v);
}

void add_int(onnx::NodeProto& node, const std::string& name, std::int64_t value) {
  onnx::AttributeProto* a = node.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(value);
}

void add_float(onnx::NodeProto& node, const std::string& name, float value) {
  onnx::AttributeProto* a = node.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::FLOAT);
  a->set_f(value);
}

// A float tensor value with a symbolic batch dimension "N" first.
void set_batch_type(onnx::ValueInfoProto& v, const std::string& name,
                    const std::vector<std::int64_t>& per_sample) {
  v.set_name(name);
  onnx::TypeProto_Tensor* t = v.mutable_type()->mutable_tensor_type();
  t->set_elem_type(onnx::TensorProto::FLOAT);
  t->mutable_shape()->add_dim()->set_dim_param("N");
  for (auto d : per_sample) t->mutable_shape()->add_dim()->set_dim_value(d);
}

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

  // How many distinct initializers the nodes read.
  std::size_t initializers_read() const { return read_.size(); }

 private:
  // A node named after its output (values and nodes share the layers' names, all distinct).
  onnx::NodeProto& node(const std::string& op, const std::string& x, const std::string& out,
                        const std::vector<std::string>& more = {}) {
    onnx::NodeProto* n = graph_.add_node();
    n->set_op_type(op);
    n->set_name(out);
    n->add_input(x);
    for (const std::string& in : more) n->add_input(in);
    n->add_output(out);
    return *n;
  }

  // The initializer "<module of l>.<what>".
  std::string weight(const nn::LayerSpec& l, const std::string& what) {
    const auto it = module_.find(&l);
    COHORT_CHECK(it != module_.end(), l.name + " has a PyTorch module");
    std::string name = it->second + "." + what;
    read_.insert(name);
    return name;
  }

  // Layers one after another from x, each writing the value of its name; returns the last
  // value (x for none).
  std::string chain(const std::vector<nn::LayerSpec>& layers, std::string x) {
    for (const nn::LayerSpec& s : layers) x = layer(s, x, s.name);
    return x;
  }

  onnx::GraphProto& graph_;
  std::map<const nn::LayerSpec*, std::string> module_;
  std::set<std::string> read_;
};

}  // namespace

std::string encode_onnx(const nn::Model& model, const Weights& w, const Metadata& m) {
  using Source = Tensor::Source;
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
  const nn::SampleShape in = model.input();
  set_batch_type(*graph->add_input(), "input",
                 in.flat()
                     ? std::vector<std::int64_t>{in.C}
                     : std::vector<std::int64_t>{in.C, in.H, in.W});  // (N, C, H, W) or (N, F)

  // Initializers: the float tensors under their PyTorch names, in state_dict order.
  std::size_t initializers = 0;
  for (const Tensor& t : torch_tensors(model)) {
    if (t.source == Source::kBatchesTracked) continue;  // no operator's input
    const float* values = t.source == Source::kParams ? w.params : w.stats;
    COHORT_CHECK(values != nullptr, t.name);
    onnx::TensorProto* init = graph->add_initializer();
    init->set_name(t.name);
    init->set_data_type(onnx::TensorProto::FLOAT);
    for (auto d : t.shape) init->add_dims(d);
    init->set_raw_data(values + t.offset, t.bytes());  // little-endian
    ++initializers;
  }

  Nodes nodes(*graph, model);
  std::string current = "input";
  const auto& layers = model.layers();
  for (std::size_t i = 0; i < layers.size(); ++i)
    current = nodes.layer(layers[i], current, i + 1 == layers.size() ? "logits" : layers[i].name);
  COHORT_CHECK(current == "logits", "the last layer is linear (Model::parse)");
  COHORT_CHECK(nodes.initializers_read() == initializers, "every initializer is some node's input");
  set_batch_type(*graph->add_output(), "logits", {model.num_classes()});

  std::string bytes;
  COHORT_CHECK(proto.SerializeToString(&bytes), "protobuf serialization of the ONNX model");
  return bytes;
}

}  // namespace cohort::exporting
