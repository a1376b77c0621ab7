// The roofline's floor for attention where cohort's kernel runs it: oneDNN's matmuls on the
// same products; see cohort/nn/gpt/gpt_attention.hpp.
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <unordered_map>
#include <vector>

#include "cohort/nn/gpt/gpt.hpp"
#include "cohort/nn/gpt/gpt_attention.hpp"
#include "cohort/tensor/buffer.hpp"

namespace cohort::nn {

std::optional<AttentionEngine> gpt_attention_kernel(const GptModel& model, Precision precision) {
  const GptShape& s = model.shape();
  if (precision != Precision::kBf16) return std::nullopt;
  return attention_kernel_engine(s.block, s.head_size());
}

double gpt_attention_onednn_seconds(const GptModel& model, std::int64_t N) {
  using namespace dnnl;
  using Dt = memory::data_type;
  using Dims = memory::dims;
  const GptShape& s = model.shape();
  const std::int64_t T = s.block, H = s.heads, hs = s.head_size(), C = s.embd;
  const engine eng(engine::kind::cpu, 0);
  stream strm(eng);
  // The dense path's operands (GptPlanBuilder, dense_attention): q, k, v, dy and their gradients
  // as (N, H, T, hs) views of (N T, C) buffers; the scores and weights (N, H, T, T).
  const Dims heads{N, H, T, hs}, heads_t{N, H, hs, T}, square{N, H, T, T};
  const Dims rows{T * C, hs, C, 1}, rows_t{T * C, hs, 1, C};
  const Dims plain{H * T * T, T * T, T, 1}, plain_t{H * T * T, T * T, 1, T};
  auto md = [](const Dims& d, Dt t, const Dims& strides) { return memory::desc(d, t, strides); };
  struct Product {
    memory::desc src, wei, dst;
  };
  const Product products[] = {
      {md(heads, Dt::bf16, rows), md(heads_t, Dt::bf16, rows_t), md(square, Dt::f32, plain)},
      {md(square, Dt::bf16, plain), md(heads, Dt::bf16, rows), md(heads, Dt::bf16, rows)},
      {md(heads, Dt::bf16, rows), md(heads_t, Dt::bf16, rows_t), md(square, Dt::f32, plain)},
      {md(square, Dt::bf16, plain_t), md(heads, Dt::bf16, rows), md(heads, Dt::bf16, rows)},
      {md(square, Dt::bf16, plain), md(heads, Dt::bf16, rows), md(heads, Dt::bf16, rows)},
      {md(square, Dt::bf16, plain_t), md(heads, Dt::bf16, rows), md(heads, Dt::bf16, rows)}};
  double total = 0;
  for (const Product& p : products) {
    primitive_attr attr;
    attr.set_scratchpad_mode(scratchpad_mode::user);
    const matmul::primitive_desc pd(matmul::desc(p.src, p.wei, p.dst), attr, eng);
    std::vector<AlignedBuffer<std::uint8_t>> buffers;
    auto bound = [&](const memory::desc& d) {
      buffers.emplace_back(std::max<std::size_t>(64, d.get_size()));
      std::memset(buffers.back().data(), 0, buffers.back().size());
      return memory(d, eng, buffers.back().data());
    };
    const matmul prim(pd);
    const std::unordered_map<int, memory> args{{DNNL_ARG_SRC, bound(p.src)},
                                               {DNNL_ARG_WEIGHTS, bound(p.wei)},
                                               {DNNL_ARG_DST, bound(p.dst)},
                                               {DNNL_ARG_SCRATCHPAD, bound(pd.scratchpad_desc())}};
    double best = 1e30;
    for (int rep = 0; rep < 6; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      prim.execute(strm, args);
      strm.wait();
      const std::chrono::duration<double> d = std::chrono::steady_clock::now() - t0;
      if (rep > 0) best = std::min(best, d.count());  // the first warms the caches and pages
    }
    total += best;
  }
  return total * static_cast<double>(s.layers);
}

}  // namespace cohort::nn
