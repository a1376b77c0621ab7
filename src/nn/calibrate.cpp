// GEMM timings for the roofline; see include/cohort/nn/calibrate.hpp. oneDNN's matmul primitive
// (its public C GEMMs are f32 and integer only), plain row-major operands.
#include "cohort/nn/calibrate.hpp"

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <chrono>
#include <limits>

#include "cohort/core/error.hpp"
#include "cohort/tensor/buffer.hpp"

namespace cohort::nn {

double gemm_seconds(std::int64_t m, std::int64_t k, std::int64_t n, Precision precision,
                    int reps) {
  using Clock = std::chrono::steady_clock;
  using dnnl::memory;
  const auto in_type = precision == Precision::kBf16 ? memory::data_type::bf16
                                                     : memory::data_type::f32;
  const std::size_t in_bytes = precision == Precision::kBf16 ? 2 : 4;
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  const memory::desc a_md({m, k}, in_type, memory::format_tag::ab);
  const memory::desc b_md({k, n}, in_type, memory::format_tag::ab);
  const memory::desc c_md({m, n}, memory::data_type::f32, memory::format_tag::ab);
  AlignedBuffer<std::uint8_t> a(static_cast<std::size_t>(m * k) * in_bytes),
      b(static_cast<std::size_t>(k * n) * in_bytes), c(static_cast<std::size_t>(m * n) * 4);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<std::uint8_t>(0x3c + i % 3);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::uint8_t>(0x3c + i % 5);
  try {
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), engine);
    const dnnl::matmul prim(pd);
    memory am(a_md, engine, a.data()), bm(b_md, engine, b.data()), cm(c_md, engine, c.data());
    auto once = [&] {
      prim.execute(stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
      stream.wait();
    };
    once();
    double best = std::numeric_limits<double>::infinity();
    for (int r = 0; r < reps; ++r) {
      const auto t0 = Clock::now();
      once();
      best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
    }
    return best;
  } catch (const dnnl::error& e) {
    throw InternalError("oneDNN: a calibration matmul " + std::to_string(m) + "x" +
                        std::to_string(k) + "x" + std::to_string(n) + ": " + e.what());
  }
}

}  // namespace cohort::nn
