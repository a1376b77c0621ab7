// The ONNX encoder's building blocks, shared by the layer lists' graph (onnx.cpp) and the
// language model's (onnx_gpt.cpp): nodes named after their output, attributes, typed graph
// inputs and outputs, float and int64 initializers. Private to src/export.
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "cohort/export/export.hpp"

namespace cohort::exporting::onnx_graph {

// A node of `op` reading `inputs` and writing `out`, named after its output (the graphs' values
// have distinct names).
inline onnx::NodeProto& add_node(onnx::GraphProto& graph, const std::string& op,
                                 const std::vector<std::string>& inputs, const std::string& out) {
  onnx::NodeProto* n = graph.add_node();
  n->set_op_type(op);
  n->set_name(out);
  for (const std::string& in : inputs) n->add_input(in);
  n->add_output(out);
  return *n;
}

inline void add_ints(onnx::NodeProto& node, const std::string& name,
                     const std::vector<std::int64_t>& values) {
  onnx::AttributeProto* a = node.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INTS);
  for (auto v : values) a->add_ints(v);
}

inline void add_int(onnx::NodeProto& node, const std::string& name, std::int64_t value) {
  onnx::AttributeProto* a = node.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(value);
}

inline void add_float(onnx::NodeProto& node, const std::string& name, float value) {
  onnx::AttributeProto* a = node.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::FLOAT);
  a->set_f(value);
}

// A graph input's or output's type: a tensor of `elem` (onnx::TensorProto::FLOAT, INT64) whose
// dimensions are sizes or symbolic names ("N").
using Dim = std::variant<std::int64_t, std::string>;
inline void set_type(onnx::ValueInfoProto& v, const std::string& name, int elem,
                     const std::vector<Dim>& dims) {
  v.set_name(name);
  onnx::TypeProto_Tensor* t = v.mutable_type()->mutable_tensor_type();
  t->set_elem_type(elem);
  for (const Dim& d : dims) {
    onnx::TensorShapeProto_Dimension* dim = t->mutable_shape()->add_dim();
    if (const auto* size = std::get_if<std::int64_t>(&d))
      dim->set_dim_value(*size);
    else
      dim->set_dim_param(std::get<std::string>(d));
  }
}

// A float32 initializer of `dims` (none: a scalar) from the values at `values`, little-endian.
inline void add_floats(onnx::GraphProto& graph, const std::string& name,
                       const std::vector<std::int64_t>& dims, const float* values) {
  std::size_t n = 1;
  for (auto d : dims) n *= static_cast<std::size_t>(d);
  onnx::TensorProto* init = graph.add_initializer();
  init->set_name(name);
  init->set_data_type(onnx::TensorProto::FLOAT);
  for (auto d : dims) init->add_dims(d);
  init->set_raw_data(values, n * sizeof(float));
}

// An int64 initializer: a 1-D tensor of `values`, or with `scalar` a 0-D one of values[0].
inline void add_int64s(onnx::GraphProto& graph, const std::string& name,
                       const std::vector<std::int64_t>& values, bool scalar = false) {
  onnx::TensorProto* init = graph.add_initializer();
  init->set_name(name);
  init->set_data_type(onnx::TensorProto::INT64);
  if (!scalar) init->add_dims(static_cast<std::int64_t>(values.size()));
  for (auto v : values) init->add_int64_data(v);
}

// The language model's graph (onnx_gpt.cpp) from its canonical weights (w.params): input "input"
// (N, T) int64 token ids, output "logits" (N, T, vocab); see encode_onnx.
void add_gpt_graph(onnx::GraphProto& graph, const nn::Model& model, const Weights& w);

}  // namespace cohort::exporting::onnx_graph
