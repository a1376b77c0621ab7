// Batch weight gradients of linear layers: dnnl_sgemm / dnnl_gemm_bf16bf16f32 (oneDNN's GEMMs,
// single-threaded under the caller's omp_set_num_threads(1)) and a plain column sum.
#include "cohort/nn/batch_grad.hpp"

#include <oneapi/dnnl/dnnl.h>

#include <string>
#include <type_traits>

#include "cohort/core/error.hpp"

// oneDNN 2.6 exports the bf16 GEMM (row-major, like dnnl_sgemm) but declares it only in an
// internal header; 3.x declares the same signature in dnnl.h. bfloat16_t there is a 16-bit
// struct like ours, passed by pointer.
extern "C" dnnl_status_t DNNL_API dnnl_gemm_bf16bf16f32(char transa, char transb, dnnl_dim_t M,
                                                        dnnl_dim_t N, dnnl_dim_t K, float alpha,
                                                        const cohort::bf16* A, dnnl_dim_t lda,
                                                        const cohort::bf16* B, dnnl_dim_t ldb,
                                                        float beta, float* C, dnnl_dim_t ldc);

namespace cohort::nn {

namespace {

void check(dnnl_status_t s, const char* what, std::int64_t m, std::int64_t n, std::int64_t k) {
  if (s != dnnl_success)
    throw InternalError(std::string("oneDNN: ") + what + " for a weight gradient (" +
                        std::to_string(m) + "x" + std::to_string(n) + ", K " + std::to_string(k) +
                        "): status " + std::to_string(static_cast<int>(s)));
}

template <typename T>
void bias_grad(const T* dy, std::int64_t rows, std::int64_t out, std::int64_t o0, std::int64_t o1,
               float* db) {
  const std::int64_t n = o1 - o0;
  for (std::int64_t j = 0; j < n; ++j) db[j] = 0.0f;
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* row = dy + r * out + o0;
    for (std::int64_t j = 0; j < n; ++j) {  // vectorised across j only: row order is kept
      if constexpr (std::is_same_v<T, bf16>)
        db[j] += to_float(row[j]);
      else
        db[j] += row[j];
    }
  }
}

}  // namespace

void linear_weight_grad(const float* x, const float* dy, std::int64_t rows, std::int64_t in,
                        std::int64_t out, std::int64_t i0, std::int64_t i1, float* dw) {
  COHORT_CHECK(0 <= i0 && i0 < i1 && i1 <= in && rows > 0 && out > 0,
               "bad linear_weight_grad range");
  // Row-major C (M = i1 - i0, N = out) = A^T B with A = x[:, i0 .. i1) (K = rows by M, lda = in)
  // and B = dy (K by N, ldb = out).
  check(dnnl_sgemm('T', 'N', i1 - i0, out, rows, 1.0f, x + i0, in, dy, out, 0.0f, dw, out), "sgemm",
        i1 - i0, out, rows);
}

void linear_bias_grad(const float* dy, std::int64_t rows, std::int64_t out, std::int64_t o0,
                      std::int64_t o1, float* db) {
  bias_grad(dy, rows, out, o0, o1, db);
}

void linear_weight_grad(const bf16* x, const bf16* dy, std::int64_t rows, std::int64_t in,
                        std::int64_t out, std::int64_t i0, std::int64_t i1, float* dw) {
  COHORT_CHECK(0 <= i0 && i0 < i1 && i1 <= in && rows > 0 && out > 0,
               "bad linear_weight_grad range");
  // As the f32 version: C (i1 - i0, out) = x[:, i0 .. i1)^T dy, products of bf16 accumulated
  // in f32.
  check(
      dnnl_gemm_bf16bf16f32('T', 'N', i1 - i0, out, rows, 1.0f, x + i0, in, dy, out, 0.0f, dw, out),
      "gemm_bf16bf16f32", i1 - i0, out, rows);
}

void linear_bias_grad(const bf16* dy, std::int64_t rows, std::int64_t out, std::int64_t o0,
                      std::int64_t o1, float* db) {
  bias_grad(dy, rows, out, o0, o1, db);
}

}  // namespace cohort::nn
