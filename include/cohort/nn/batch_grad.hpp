// Weight gradients of a linear layer over a whole batch, for a range of the flat parameter array.
//
// The default step computes each leaf's weight gradient inside the leaf's backward pass, writes
// it to the leaf's gradient array, and the reducer's root reads every leaf back. With batch
// weight gradients (train::WeightGrads::kBatch) the replicas instead keep each linear layer's
// input rows X (B, IC) and output-gradient rows dY (B, OC) for the whole batch, and the root
// computes dW = X^T dY per chunk of the weights, one GEMM with K = B, right before the optimizer
// reads it: no leaf gradient is written or read for linear layers.
//
// Linear weights are stored (IC, OC) (see Model), so a contiguous range of the flat array is a
// range of rows i of dW. Both functions are single-threaded and deterministic: for a given
// shape the result does not depend on the thread, the buffers' addresses or anything else.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "cohort/core/function_ref.hpp"
#include "cohort/core/names.hpp"
#include "cohort/tensor/bf16.hpp"

namespace cohort::nn {

// dw (i1 - i0, OC), row-major, = sum over rows r of x[r, i0 .. i1)^T dy[r, :], where x is
// (rows, IC) and dy (rows, OC), both row-major. Runs a single-threaded GEMM; the calling thread
// must run OpenMP with one thread (as for Net).
void linear_weight_grad(const float* x, const float* dy, std::int64_t rows, std::int64_t in,
                        std::int64_t out, std::int64_t i0, std::int64_t i1, float* dw);

// db[o - o0] = sum over rows r, in row order, of dy[r, o], for o in [o0, o1).
void linear_bias_grad(const float* dy, std::int64_t rows, std::int64_t out, std::int64_t o0,
                      std::int64_t o1, float* db);

// The same with bf16 rows (a bf16 Net's): products of bf16 values accumulated in f32, dw and db
// in f32 (oneDNN's gemm_bf16bf16f32; the bias sums in f32, in row order).
void linear_weight_grad(const bf16* x, const bf16* dy, std::int64_t rows, std::int64_t in,
                        std::int64_t out, std::int64_t i0, std::int64_t i1, float* dw);
void linear_bias_grad(const bf16* dy, std::int64_t rows, std::int64_t out, std::int64_t o0,
                      std::int64_t o1, float* db);

// Row pairs (src/nn/row_pairs.cpp): bf16 dY kept as pairs of rows, element (r, o) at
// (r / 2) * 2 * OC + 2 * o + r % 2 (an odd last row's partner is 0), which cohort's own
// AVX512_BF16 kernel reads directly: faster than oneDNN 2.6's gemm_bf16bf16f32 on the root's
// chunks where oneDNN has no AMX (docs/decisions.md, "The root's bf16 GEMMs on cohort's own
// row-pair kernel"). A
// range of even rows [a, b) occupies the same elements as in row-major order.
//
// Whether this CPU runs the kernel (AVX-512 with AVX512_BF16: cpu_features(); the kernel is
// compiled in every x86-64 build and chosen at run time).
bool row_pair_kernel();

// The kernel of the root's bf16 batch weight gradients, chosen by what the CPU runs alone (never by
// timing: the weights' bits depend on it): where oneDNN dispatches AMX, its gemm_bf16bf16f32 on the
// tiles; elsewhere cohort's row-pair kernel where the CPU runs it (AVX512_BF16 dot products), else
// oneDNN's (docs/decisions.md, "The root's bf16 GEMMs on cohort's own row-pair kernel").
// ONEDNN_MAX_CPU_ISA below AMX on an AMX CPU takes the row-pair kernel, as a CPU without AMX does.
enum class RootGemm { kOneDnn, kRowPairs };
inline constexpr Named<RootGemm> kRootGemmNames[] = {{RootGemm::kOneDnn, "onednn"},
                                                     {RootGemm::kRowPairs, "row_pairs"}};
// The rule: `onednn_amx`, oneDNN dispatches AMX; `row_pairs`, row_pair_kernel().
constexpr RootGemm choose_root_gemm(bool onednn_amx, bool row_pairs) {
  return !onednn_amx && row_pairs ? RootGemm::kRowPairs : RootGemm::kOneDnn;
}
// This process's choice (onednn_isa(), row_pair_kernel()).
RootGemm root_bf16_gemm();
// pairs = dy (rows, OC) in row pairs; rows odd: the last pair's partner is written 0.
void to_row_pairs(const bf16* dy, std::int64_t rows, std::int64_t out, bf16* pairs);
// As linear_weight_grad (bf16), with dy in row pairs: each element a sum over the rows in order,
// products of bf16 accumulated in f32 two at a time (vdpbf16ps). Requires row_pair_kernel().
void linear_weight_grad_pairs(const bf16* x, const bf16* dy_pairs, std::int64_t rows,
                              std::int64_t in, std::int64_t out, std::int64_t i0, std::int64_t i1,
                              float* dw);
// ReLU's backward fused with to_row_pairs, for a linear layer followed by a ReLU: with y the
// ReLU's output (rows, OC) and dy the gradient of it, the layer's output gradient is
// dz = y > 0 ? dy : dy * 0 (oneDNN's eltwise_relu backward, bit for bit: -0 where dy is negative,
// NaN where it is infinite or NaN). Writes dz in row pairs to `pairs`, and row-major over dy
// itself when `in_place` (a layer whose backward-data still reads it). One pass instead of two.
void relu_backward_to_row_pairs(const bf16* y, bf16* dy, std::int64_t rows, std::int64_t out,
                                bf16* pairs, bool in_place);
// The same ReLU backward in place on n values (dy = y > 0 ? dy : dy * 0).
void relu_backward(const bf16* y, bf16* dy, std::size_t n);

// dW handed on a tile of rows at a time, as the kernel finishes each, to a caller that consumes
// the rows at once (the root's optimizer): the rows then go from registers through L1 to the
// optimizer instead of through a chunk-sized buffer in L2, and the rows of the arrays the
// consumer updates are prefetched while the tile before them computes, so they come from memory
// while the core does arithmetic, not while the optimizer waits for them.
inline constexpr std::int64_t kPairTileRows = 12;
struct RowConsumer {
  // Rows [i, j) of dW ((j - i) x OC floats at `rows`, which is `buffer`); false stops the kernel.
  FunctionRef<bool(std::int64_t i, std::int64_t j, const float* rows)> take;
  // kPairTileRows * OC floats, where the kernel writes each tile's rows.
  float* buffer = nullptr;
  // Arrays whose row i the consumer touches for dW row i: row_bytes bytes at base + i * row_bytes.
  // The kernel prefetches, for writing, the next tile's rows of each while it computes a tile.
  struct Touched {
    void* base = nullptr;
    std::size_t row_bytes = 0;
  };
  std::array<Touched, 4> touched{};
};
// As linear_weight_grad_pairs, rows [i0, i1) of dW handed to `consumer` kPairTileRows at a time,
// in row order (the same bits as the whole-range call). Returns false if the consumer stopped it.
bool linear_weight_grad_pairs(const bf16* x, const bf16* dy_pairs, std::int64_t rows,
                              std::int64_t in, std::int64_t out, std::int64_t i0, std::int64_t i1,
                              const RowConsumer& consumer);
// As linear_bias_grad (bf16), with dy in row pairs: the same sums, in row order (the same bits).
void linear_bias_grad_pairs(const bf16* dy_pairs, std::int64_t rows, std::int64_t out,
                            std::int64_t o0, std::int64_t o1, float* db);

}  // namespace cohort::nn
