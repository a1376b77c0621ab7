// Batch weight gradients of linear layers: dnnl_sgemm (f32) and the matmul primitive (bf16), both
// single-threaded under the caller's omp_set_num_threads(1), and a plain column sum.
#include "cohort/nn/batch_grad.hpp"

#include <oneapi/dnnl/dnnl.h>

#include <oneapi/dnnl/dnnl.hpp>

#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>

#include "cohort/core/error.hpp"
#include "cohort/tensor/buffer.hpp"

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

// dW rows [i0, i1) of a linear layer from bf16 rows: a matmul over (M = i1 - i0, K = rows) views
// of x transposed (strides 1, in) and (K, N = out) of dy, into f32 (M, N). One per shape on each
// thread (the calling thread runs it; nothing is shared), with a user-mode scratchpad.
struct BwdWeightMatmul {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  dnnl::matmul prim;
  dnnl::memory a, b, c, scratch;
  AlignedBuffer<std::uint8_t> scratch_bytes;
};

BwdWeightMatmul& bwd_weight_matmul(std::int64_t m, std::int64_t k, std::int64_t n,
                                   std::int64_t lda) {
  using dnnl::memory;
  thread_local std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t>,
                        std::unique_ptr<BwdWeightMatmul>>
      cache;
  auto& slot = cache[{m, k, n, lda}];
  if (slot) return *slot;
  auto mm = std::make_unique<BwdWeightMatmul>();
  const memory::desc a_md({m, k}, memory::data_type::bf16, memory::dims{1, lda});
  const memory::desc b_md({k, n}, memory::data_type::bf16, memory::dims{n, 1});
  const memory::desc c_md({m, n}, memory::data_type::f32, memory::dims{n, 1});
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  try {
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), attr, mm->engine);
    mm->prim = dnnl::matmul(pd);
    mm->scratch_bytes = AlignedBuffer<std::uint8_t>(pd.scratchpad_desc().get_size());
    mm->scratch = memory(pd.scratchpad_desc(), mm->engine, mm->scratch_bytes.data());
  } catch (const dnnl::error& e) {
    throw InternalError(std::string("oneDNN: creating a bf16 matmul for a weight gradient (") +
                        std::to_string(m) + "x" + std::to_string(n) + ", K " + std::to_string(k) +
                        "): " + e.what());
  }
  mm->a = memory(a_md, mm->engine, nullptr);
  mm->b = memory(b_md, mm->engine, nullptr);
  mm->c = memory(c_md, mm->engine, nullptr);
  slot = std::move(mm);
  return *slot;
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
  // in f32 — on oneDNN's matmul primitive (AMX or AVX512_BF16 kernels), built once per shape
  // and thread and reused: the root asks for the same chunk shapes every step.
  BwdWeightMatmul& mm = bwd_weight_matmul(i1 - i0, rows, out, in);
  mm.a.set_data_handle(const_cast<bf16*>(x + i0));
  mm.b.set_data_handle(const_cast<bf16*>(dy));
  mm.c.set_data_handle(dw);
  try {
    mm.prim.execute(mm.stream, {{DNNL_ARG_SRC, mm.a},
                                {DNNL_ARG_WEIGHTS, mm.b},
                                {DNNL_ARG_DST, mm.c},
                                {DNNL_ARG_SCRATCHPAD, mm.scratch}});
    mm.stream.wait();
  } catch (const dnnl::error& e) {
    throw InternalError(std::string("oneDNN: bf16 matmul for a weight gradient (") +
                        std::to_string(i1 - i0) + "x" + std::to_string(out) + ", K " +
                        std::to_string(rows) + "): " + e.what());
  }
}

void linear_bias_grad(const bf16* dy, std::int64_t rows, std::int64_t out, std::int64_t o0,
                      std::int64_t o1, float* db) {
  bias_grad(dy, rows, out, o0, o1, db);
}

}  // namespace cohort::nn
