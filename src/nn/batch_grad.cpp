// Batch weight gradients of linear layers: dnnl_sgemm (oneDNN's GEMM, single-threaded under the
// caller's omp_set_num_threads(1)) and a plain column sum.
#include "cohort/nn/batch_grad.hpp"

#include <oneapi/dnnl/dnnl.h>

#include <string>

#include "cohort/core/error.hpp"

namespace cohort::nn {

void linear_weight_grad(const float* x, const float* dy, std::int64_t rows, std::int64_t in,
                        std::int64_t out, std::int64_t i0, std::int64_t i1, float* dw) {
  COHORT_CHECK(0 <= i0 && i0 < i1 && i1 <= in && rows > 0 && out > 0,
               "bad linear_weight_grad range");
  // Row-major C (M = i1 - i0, N = out) = A^T B with A = x[:, i0 .. i1) (K = rows by M, lda = in)
  // and B = dy (K by N, ldb = out).
  const dnnl_status_t s =
      dnnl_sgemm('T', 'N', i1 - i0, out, rows, 1.0f, x + i0, in, dy, out, 0.0f, dw, out);
  if (s != dnnl_success)
    throw InternalError("oneDNN: sgemm for a weight gradient (" + std::to_string(i1 - i0) + "x" +
                        std::to_string(out) + ", K " + std::to_string(rows) + "): status " +
                        std::to_string(static_cast<int>(s)));
}

void linear_bias_grad(const float* dy, std::int64_t rows, std::int64_t out, std::int64_t o0,
                      std::int64_t o1, float* db) {
  const std::int64_t n = o1 - o0;
  for (std::int64_t j = 0; j < n; ++j) db[j] = 0.0f;
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = dy + r * out + o0;
    for (std::int64_t j = 0; j < n; ++j) db[j] += row[j];  // vectorised across j only
  }
}

}  // namespace cohort::nn
