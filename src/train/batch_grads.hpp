// Batch weight gradients (--weight-grads batch, docs/architecture.md): the batch-wide arrays of
// linear layers' input rows X (B, IC) and output-gradient rows dY (B, OC) that replicas fill at
// their leaves' rows, and the root's gradient of a range of the flat parameter array computed
// from them (one GEMM per overlapped weight, column sums per bias; oneDNN's GEMMs, or for bf16 rows
// cohort's own kernel on row pairs, nn/batch_grad).
// Not the reducer: every other tensor's gradient in the range is still the leaves' sum.
//
// Thread-safety: leaf_rows and the replicas' writes through its pointers touch disjoint rows;
// gradient() runs concurrently on disjoint ranges once every leaf has been contributed (the
// reducer's ordering makes the rows visible).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "cohort/core/function_ref.hpp"
#include "cohort/nn/batch_grad.hpp"
#include "cohort/nn/model.hpp"
#include "cohort/nn/net.hpp"
#include "cohort/tensor/buffer.hpp"

namespace cohort::train {

class BatchGrads {
 public:
  // Room for `batch` rows of every linear layer of `model`, in the replicas' precision (bf16
  // rows: products of bf16 values accumulated in f32, as the bf16 Net's own weight gradients).
  // bf16 with an even micro-batch where nn::root_bf16_gemm() is the row-pair kernel: dY is kept in
  // row pairs and the weight gradients run on cohort's own kernel (nn/batch_grad.hpp); otherwise
  // row-major, on oneDNN's GEMMs.
  BatchGrads(const nn::Model& model, std::size_t batch, nn::Precision precision,
             std::size_t micro_batch);
  bool row_pairs() const { return pairs_; }
  static bool row_pairs_for(nn::Precision precision, std::size_t micro_batch) {
    return precision == nn::Precision::kBf16 && micro_batch % 2 == 0 &&
           nn::root_bf16_gemm() == nn::RootGemm::kRowPairs;
  }

  // Where the leaf starting at batch row `first` keeps its rows: one entry per linear layer, in
  // model order (Net::forward_backward's linear_rows).
  void leaf_rows(std::size_t first, std::vector<nn::LinearRows>& rows);
  // Floats of scratch gradient() needs besides its output for ranges of up to `chunk` floats: the
  // whole weight rows a range cuts, up to a row more at each end.
  // (Or, with a consumer, a tile of the widest weight's rows.)
  std::size_t scratch_floats(std::size_t chunk) const {
    return std::max(chunk + 2 * widest_, static_cast<std::size_t>(nn::kPairTileRows) * widest_);
  }

  // What takes the gradient as gradient() computes it (the root's optimizer): take(g, a, b) gets
  // the gradient of [a, b), piece after piece in order over the range; false stops gradient().
  // With row pairs a weight's rows come a tile at a time straight from the kernel, which
  // prefetches the rows of `arrays` (the flat arrays take updates: base, bytes per element) for
  // the next tile while it computes one.
  struct Consumer {
    FunctionRef<bool(const float* g, std::size_t a, std::size_t b)> take;
    std::array<std::pair<void*, std::size_t>, 4> arrays{};
  };
  // out[0, end - begin) = the batch's summed gradient of [begin, end) of the flat array, over
  // `rows` rows; staged_input (rows, IC of the first layer, in the rows' precision) is the step's
  // assembled batch, which a first linear layer reads instead of a copy. Ranges of no linear layer
  // are the sources' sum, left to right (reduce::sum_sources, as the leaf mode). With a
  // consumer, every piece is handed to it as soon as it is computed (a fused weight's rows are
  // then not in `out`). Returns the seconds in GEMMs and sums, without the consumer's.
  double gradient(const float* const* sources, std::size_t k, std::size_t begin, std::size_t end,
                  std::size_t rows, const void* staged_input, float* out, float* scratch,
                  const Consumer* consumer = nullptr) const;

  // For a rank that computes the gradient of part of the flat array (src/train/sharded.hpp):
  // every row array (B rows of `width` floats), with the ranges of the flat array whose
  // gradient reads it; the first linear layer's input is the staged batch, not listed.
  struct RowArray {
    void* data;
    std::size_t width;                           // values per row
    std::size_t row_multiple;                    // 2 for row pairs: send whole pairs
    std::size_t value_bytes;                     // 4 (f32) or 2 (bf16)
    std::size_t reader_begin[2], reader_end[2];  // the weight's range, and (dY only) the bias's
  };
  std::vector<RowArray> row_arrays();
  // The ranges [begin, end) of the flat array computed from rows (sorted, disjoint).
  std::vector<std::pair<std::size_t, std::size_t>> computed_ranges() const;
  // The weight range of the linear layer that reads the staged batch (the model's first), or an
  // empty range.
  std::pair<std::size_t, std::size_t> input_reader() const;

 private:
  struct Linear {
    std::int64_t in = 0, out = 0;
    bool reads_input = false;       // the model's first layer: its input is the staged batch
    AlignedBuffer<float> x, dy;     // f32 rows
    AlignedBuffer<bf16> x16, dy16;  // bf16 rows
  };
  const nn::Precision precision_;
  const bool pairs_;
  struct Range {  // a linear layer's weight or bias in the flat array, in array order
    std::size_t begin = 0, end = 0, linear = 0;
    bool bias = false;
  };
  std::vector<Linear> linear_;
  std::vector<Range> ranges_;
  std::size_t widest_ = 0;
};

}  // namespace cohort::train
