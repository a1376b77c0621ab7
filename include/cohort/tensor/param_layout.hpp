// Shape and ParamLayout: every parameter tensor of a model is a named view (offset + shape)
// into one flat float array, and every gradient buffer uses the same layout. The reducer, the
// optimizer and checkpoints then work on plain [begin, end) ranges.
// Not storage: a layout holds no floats; pair it with an AlignedBuffer<float> of total() floats.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace cohort {

// Dimensions in oneDNN's order: (OC, IC) for a linear weight, (OC) for a bias.
struct Shape {
  std::vector<std::int64_t> dims;
  std::size_t numel() const;
  std::string str() const;  // "(512, 784)"
  bool operator==(const Shape&) const = default;
};

class ParamLayout {
 public:
  struct Entry {
    std::string name;    // "fc1.weight"
    std::size_t offset;  // in floats from the start of the flat buffer; 64-byte aligned
    Shape shape;
  };

  // Appends a tensor; its offset is rounded up to a 64-byte boundary so that every tensor
  // starts on its own cache line (vector loads stay aligned, oneDNN gets aligned pointers).
  std::size_t add(std::string name, Shape shape);

  const std::vector<Entry>& entries() const { return entries_; }
  const Entry& at(const std::string& name) const;  // throws InternalError if absent
  std::size_t total() const { return total_; }     // floats, padding included
  std::size_t numel() const;                       // floats, padding excluded

 private:
  std::vector<Entry> entries_;
  std::size_t total_ = 0;
};

}  // namespace cohort
