// The layer lists' PyTorch names (state_dict.cpp), for their kind (model.cpp).
#pragma once

#include <string>
#include <vector>

#include "cohort/nn/model.hpp"

namespace cohort::nn {

// torch_modules of a layer list.
std::vector<Module> layer_modules(const std::string& spec, const std::vector<LayerSpec>& layers);
// ModelKind::state_dict of a layer list.
std::vector<StateTensor> layer_state_dict(const std::string& spec,
                                          const std::vector<LayerSpec>& layers);

}  // namespace cohort::nn
