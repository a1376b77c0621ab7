// The ONNX encoder: the model's inference graph (opset 13) built with the protobuf classes of
// Debian's libonnx-dev and serialized by protobuf. Not an evaluator: tests/export checks the
// file with onnx.checker and a NumPy evaluator of the operators emitted here.
#include <onnx/onnx_pb.h>

#include "cohort/core/error.hpp"
#include "cohort/export/export.hpp"

namespace cohort::exporting {

namespace {

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

// A float tensor value with a symbolic batch dimension "N" first.
void set_batch_type(onnx::ValueInfoProto& v, const std::string& name,
                    const std::vector<std::int64_t>& per_sample) {
  v.set_name(name);
  onnx::TypeProto_Tensor* t = v.mutable_type()->mutable_tensor_type();
  t->set_elem_type(onnx::TensorProto::FLOAT);
  t->mutable_shape()->add_dim()->set_dim_param("N");
  for (auto d : per_sample) t->mutable_shape()->add_dim()->set_dim_value(d);
}

}  // namespace

std::string encode_onnx(const nn::Model& model, const float* canonical, const Metadata& m) {
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

  // Initializers: every parameter tensor under its PyTorch name, in canonical order.
  const std::vector<Tensor> tensors = torch_tensors(model);
  for (const Tensor& t : tensors) {
    onnx::TensorProto* init = graph->add_initializer();
    init->set_name(t.name);
    init->set_data_type(onnx::TensorProto::FLOAT);
    for (auto d : t.shape) init->add_dims(d);
    init->set_raw_data(canonical + t.offset, t.numel() * sizeof(float));  // little-endian
  }

  std::string current = "input";
  std::size_t next_tensor = 0;  // tensors holds weight, bias per parameter layer, in layer order
  const auto& layers = model.layers();
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const nn::LayerSpec& l = layers[i];
    if (l.kind == nn::LayerSpec::Kind::kDropout) continue;  // the identity at inference
    onnx::NodeProto* node = graph->add_node();
    node->set_name(l.name);
    node->add_input(current);
    const bool last = i + 1 == layers.size();
    current = last ? "logits" : l.name;
    node->add_output(current);
    switch (l.kind) {
      case nn::LayerSpec::Kind::kLinear:
        // y = x W^T + b with W (OC, IC) as PyTorch stores it.
        node->set_op_type("Gemm");
        node->add_input(tensors[next_tensor++].name);
        node->add_input(tensors[next_tensor++].name);
        add_int(*node, "transB", 1);
        break;
      case nn::LayerSpec::Kind::kConv:
        node->set_op_type("Conv");
        node->add_input(tensors[next_tensor++].name);
        node->add_input(tensors[next_tensor++].name);
        add_ints(*node, "kernel_shape", {l.kernel, l.kernel});
        add_ints(*node, "strides", {l.stride, l.stride});
        add_ints(*node, "pads", {l.pad, l.pad, l.pad, l.pad});
        break;
      case nn::LayerSpec::Kind::kMaxPool:
      case nn::LayerSpec::Kind::kAvgPool:
        // No padding, floor of the output size: the shapes Model::parse computes.
        node->set_op_type(l.kind == nn::LayerSpec::Kind::kMaxPool ? "MaxPool" : "AveragePool");
        add_ints(*node, "kernel_shape", {l.kernel, l.kernel});
        add_ints(*node, "strides", {l.stride, l.stride});
        break;
      case nn::LayerSpec::Kind::kReLU:
        node->set_op_type("Relu");
        break;
      case nn::LayerSpec::Kind::kFlatten:
        node->set_op_type("Flatten");
        add_int(*node, "axis", 1);
        break;
      case nn::LayerSpec::Kind::kDropout:
        break;
    }
  }
  COHORT_CHECK(current == "logits", "the last layer is linear (Model::parse)");
  set_batch_type(*graph->add_output(), "logits", {model.num_classes()});

  std::string bytes;
  COHORT_CHECK(proto.SerializeToString(&bytes), "protobuf serialization of the ONNX model");
  return bytes;
}

}  // namespace cohort::exporting
