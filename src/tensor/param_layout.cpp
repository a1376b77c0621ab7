// ParamLayout: offsets of named parameter tensors inside one flat, aligned float array.
#include "cohort/tensor/param_layout.hpp"

#include "cohort/core/error.hpp"
#include "cohort/tensor/buffer.hpp"

namespace cohort {

std::size_t Shape::numel() const {
  std::size_t n = 1;
  for (auto d : dims) n *= static_cast<std::size_t>(d);
  return n;
}

std::string Shape::str() const {
  std::string s = "(";
  for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + ")";
}

std::size_t ParamLayout::add(std::string name, Shape shape) {
  for (auto d : shape.dims) COHORT_CHECK(d > 0, name + " has a non-positive dimension");
  constexpr std::size_t kAlignFloats = kCacheLine / sizeof(float);
  std::size_t offset = (total_ + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
  std::size_t n = shape.numel();
  entries_.push_back({std::move(name), offset, std::move(shape)});
  total_ = offset + n;
  return offset;
}

const ParamLayout::Entry& ParamLayout::at(const std::string& name) const {
  for (const auto& e : entries_)
    if (e.name == name) return e;
  COHORT_CHECK(false, "no parameter named " + name);
  __builtin_unreachable();
}

std::size_t ParamLayout::numel() const {
  std::size_t n = 0;
  for (const auto& e : entries_) n += e.shape.numel();
  return n;
}

}  // namespace cohort
