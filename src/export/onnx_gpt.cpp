// The language model's ONNX graph (opset 13): nanoGPT's inference forward pass (no dropout) on
// token ids of any batch N and length T up to the block. Opset 13 has no LayerNormalization
// (opset 17) and no Gelu (opset 20), so a LayerNorm is ReduceMean, Sub, Mul, ReduceMean, Add,
// Sqrt, Div and Mul (and Add of its bias), and the GELU the model's form: 0.5 x (1 + erf(x /
// sqrt 2)), or GPT-2's 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))). The linear layers are
// Gemm with transB = 1 on the (N T, C) rows, PyTorch's (out, in) weights as they are, and C their
// bias where the model has biases; attention reshapes them to (N, heads, T, head size). The
// token embedding is its first `vocab` rows (the padded ones are 0 and not the model's outputs).
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "cohort/core/error.hpp"
#include "cohort/nn/gpt/gpt.hpp"
#include "onnx_graph.hpp"

namespace cohort::exporting::onnx_graph {

namespace {

class GptGraph {
 public:
  GptGraph(onnx::GraphProto& graph, const nn::GptModel& gpt)
      : g_(graph), gpt_(gpt), s_(gpt.shape()) {}

  void build(const float* params) {
    set_type(*g_.add_input(), "input", onnx::TensorProto::INT64, {"N", "T"});
    // The parameters under nanoGPT's names; the head reads transformer.wte.weight (tied), so
    // lm_head.weight, the same tensor, is not an initializer of its own.
    for (const ParamLayout::Entry& e : gpt_.layout().entries())
      add_floats(
          g_, e.name,
          e.offset == gpt_.wte() ? std::vector<std::int64_t>{s_.vocab, s_.embd} : e.shape.dims,
          params + e.offset);
    constants();

    // T from the input's shape, and the shapes that depend on it.
    node("Shape", {"input"}, "input.shape");
    node("Slice", {"input.shape", "const.one", "const.two"}, "T");  // [T]
    add_int(node("Concat", {"const.minus_one", "T", "const.qkv_dims"}, "shape.qkv"), "axis", 0);
    add_int(node("Concat", {"const.minus_one", "T", "const.vocab"}, "shape.logits"), "axis", 0);
    add_int(node("Concat", {"T", "T"}, "shape.scores"), "axis", 0);
    node("Slice", {"const.causal_mask", "const.zeros", "shape.scores", "const.first_axes"},
         "causal_mask");  // (T, T)

    // Token embeddings (N, T, C) plus the position table's first T rows, as (N T, C) rows.
    node("Gather", {"transformer.wte.weight", "input"}, "transformer.wte");
    node("Slice", {"transformer.wpe.weight", "const.zero", "T", "const.zero"}, "transformer.wpe");
    node("Add", {"transformer.wte", "transformer.wpe"}, "transformer.embeddings");
    node("Reshape", {"transformer.embeddings", "const.rows"}, "transformer.rows");
    std::string x = "transformer.rows";
    for (std::int64_t i = 0; i < s_.layers; ++i) x = block("transformer.h." + std::to_string(i), x);
    x = layer_norm("transformer.ln_f", x);
    add_int(node("Gemm", {x, "transformer.wte.weight"}, "lm_head"), "transB", 1);  // (N T, vocab)
    node("Reshape", {"lm_head", "shape.logits"}, "logits");
    set_type(*g_.add_output(), "logits", onnx::TensorProto::FLOAT, {"N", "T", s_.vocab});
  }

 private:
  // Shapes, indices and factors, under names starting "const.".
  void constants() {
    const std::int64_t C = s_.embd, H = s_.heads, D = s_.head_size(), T = s_.block;
    add_int64s(g_, "const.zero", {0});
    add_int64s(g_, "const.one", {1});
    add_int64s(g_, "const.two", {2});
    add_int64s(g_, "const.minus_one", {-1});
    add_int64s(g_, "const.zeros", {0, 0});
    add_int64s(g_, "const.first_axes", {0, 1});
    add_int64s(g_, "const.qkv_dims", {3, H, D});  // c_attn's 3 C outputs: q, k, v, by head
    add_int64s(g_, "const.vocab", {s_.vocab});
    add_int64s(g_, "const.rows", {-1, C});
    for (std::int64_t i = 0; i < 3; ++i)
      add_int64s(g_, "const.index" + std::to_string(i), {i}, true);
    scalar("const.epsilon", nn::GptModel::kLayerNormEpsilon);
    scalar("const.attn_scale", 1.0f / std::sqrt(static_cast<float>(D)));
    scalar("const.half", 0.5f);
    scalar("const.float_one", 1.0f);
    if (s_.tanh_gelu) {
      scalar("const.tanh_scale", static_cast<float>(std::sqrt(2.0 / 3.14159265358979323846)));
      scalar("const.tanh_cube", 0.044715f);
    } else {
      scalar("const.inv_sqrt2", static_cast<float>(1 / std::sqrt(2.0)));
    }
    // The causal mask for the longest window, added to the scores: 0 where a query may see a key
    // (the key at or before it), minus infinity elsewhere.
    std::vector<float> mask(static_cast<std::size_t>(T * T), 0.0f);
    for (std::int64_t q = 0; q < T; ++q)
      for (std::int64_t k = q + 1; k < T; ++k)
        mask[static_cast<std::size_t>(q * T + k)] = -std::numeric_limits<float>::infinity();
    add_floats(g_, "const.causal_mask", {T, T}, mask.data());
  }

  void scalar(const std::string& name, float value) { add_floats(g_, name, {}, &value); }

  onnx::NodeProto& node(const std::string& op, const std::vector<std::string>& inputs,
                        const std::string& out) {
    return add_node(g_, op, inputs, out);
  }

  // x (N T, C) -> x + attn(ln_1(x)) -> that + mlp(ln_2(that)), the block named `p`.
  std::string block(const std::string& p, const std::string& x) {
    const std::string a = p + ".attn";
    linear(a + ".c_attn", layer_norm(p + ".ln_1", x));          // (N T, 3 C)
    node("Reshape", {a + ".c_attn", "shape.qkv"}, a + ".qkv");  // (N, T, 3, H, D)
    add_ints(node("Transpose", {a + ".qkv"}, a + ".heads"), "perm", {2, 0, 3, 1, 4});
    const char* parts[] = {".q", ".k", ".v"};
    for (int i = 0; i < 3; ++i)  // (N, H, T, D) each
      add_int(node("Gather", {a + ".heads", "const.index" + std::to_string(i)}, a + parts[i]),
              "axis", 0);
    add_ints(node("Transpose", {a + ".k"}, a + ".k_t"), "perm", {0, 1, 3, 2});
    node("MatMul", {a + ".q", a + ".k_t"}, a + ".scores");  // (N, H, T, T)
    node("Mul", {a + ".scores", "const.attn_scale"}, a + ".scaled");
    node("Add", {a + ".scaled", "causal_mask"}, a + ".masked");
    add_int(node("Softmax", {a + ".masked"}, a + ".weights"), "axis", -1);
    node("MatMul", {a + ".weights", a + ".v"}, a + ".y");  // (N, H, T, D)
    add_ints(node("Transpose", {a + ".y"}, a + ".y_t"), "perm", {0, 2, 1, 3});
    node("Reshape", {a + ".y_t", "const.rows"}, a + ".y_rows");  // (N T, C)
    node("Add", {x, linear(a + ".c_proj", a + ".y_rows")}, a + ".residual");

    const std::string m = p + ".mlp";
    const std::string h = linear(m + ".c_fc", layer_norm(p + ".ln_2", a + ".residual"));
    if (s_.tanh_gelu) {
      node("Mul", {h, h}, m + ".gelu.square");
      node("Mul", {m + ".gelu.square", h}, m + ".gelu.cube");
      node("Mul", {m + ".gelu.cube", "const.tanh_cube"}, m + ".gelu.cubic");
      node("Add", {h, m + ".gelu.cubic"}, m + ".gelu.inner");
      node("Mul", {m + ".gelu.inner", "const.tanh_scale"}, m + ".gelu.scaled");
      node("Tanh", {m + ".gelu.scaled"}, m + ".gelu.tanh");
      node("Add", {m + ".gelu.tanh", "const.float_one"}, m + ".gelu.sum");
    } else {
      node("Mul", {h, "const.inv_sqrt2"}, m + ".gelu.scaled");
      node("Erf", {m + ".gelu.scaled"}, m + ".gelu.erf");
      node("Add", {m + ".gelu.erf", "const.float_one"}, m + ".gelu.sum");
    }
    node("Mul", {h, m + ".gelu.sum"}, m + ".gelu.product");
    node("Mul", {m + ".gelu.product", "const.half"}, m + ".gelu");
    return node("Add", {a + ".residual", linear(m + ".c_proj", m + ".gelu")}, m + ".residual")
        .output(0);
  }

  // x W^T (+ b) for the module `name` (its weight "<name>.weight", (out, in), and its bias
  // "<name>.bias"), written as `name`.
  std::string linear(const std::string& name, const std::string& x) {
    std::vector<std::string> in{x, name + ".weight"};
    if (s_.bias) in.push_back(name + ".bias");
    add_int(node("Gemm", in, name), "transB", 1);
    return name;
  }

  // PyTorch's LayerNorm over the rows' last axis (biased variance, epsilon inside the root),
  // times its weight "<name>.weight" (plus its bias "<name>.bias"); written as `name`.
  std::string layer_norm(const std::string& name, const std::string& x) {
    add_ints(node("ReduceMean", {x}, name + ".mean"), "axes", {-1});
    node("Sub", {x, name + ".mean"}, name + ".centered");
    node("Mul", {name + ".centered", name + ".centered"}, name + ".squared");
    add_ints(node("ReduceMean", {name + ".squared"}, name + ".var"), "axes", {-1});
    node("Add", {name + ".var", "const.epsilon"}, name + ".var_eps");
    node("Sqrt", {name + ".var_eps"}, name + ".std");
    node("Div", {name + ".centered", name + ".std"}, name + ".normalized");
    if (!s_.bias) {
      node("Mul", {name + ".normalized", name + ".weight"}, name);
      return name;
    }
    node("Mul", {name + ".normalized", name + ".weight"}, name + ".scaled");
    node("Add", {name + ".scaled", name + ".bias"}, name);
    return name;
  }

  onnx::GraphProto& g_;
  const nn::GptModel& gpt_;
  const nn::GptShape& s_;
};

}  // namespace

void add_gpt_graph(onnx::GraphProto& graph, const nn::Model& model, const Weights& w) {
  const nn::GptModel& gpt = nn::gpt_model(model);
  const float* params = w.params;
  COHORT_CHECK(params != nullptr, "the language model's weights");
  GptGraph(graph, gpt).build(params);
}

}  // namespace cohort::exporting::onnx_graph
