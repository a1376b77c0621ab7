// The built-in model kinds' parts that model.cpp joins: the language model's registry entry
// (gpt_kind.cpp) and the layer lists' executor (net.cpp).
#pragma once

#include <memory>

#include "cohort/nn/executor.hpp"
#include "cohort/nn/model.hpp"

namespace cohort::nn {

// The language model's kind: "gpt:" specs (nn/gpt/gpt.hpp).
ModelKindEntry gpt_kind_entry();
// A layer list's executor on oneDNN's primitives.
std::unique_ptr<Executor> layer_executor(const Model& model, bool blocked_layouts,
                                         Precision precision);

}  // namespace cohort::nn
