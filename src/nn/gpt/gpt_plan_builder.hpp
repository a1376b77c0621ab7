// Private to src/nn: GptPlanBuilder, the object that builds one GptNet plan (gpt_plan.hpp), shared
// by the files that build its steps: plan_gpt.cpp (the plan itself: the embeddings, the final
// LayerNorm and the tied head, and the LayerNorm and linear layers' steps) and
// plan_gpt_block.cpp (a transformer block: causal self-attention and the GELU MLP, forward and
// backward). Not an interface: one builder lives for one build_gpt_plan call.
//
// The steps are oneDNN 2.6 primitives (inner products for the linear layers and the tied head,
// batched matmuls over strided views for attention, reorders between f32 and bf16) and cohort's
// loops (the embedding gather and its scatter-add, dropout, residual adds; nn/gpt/gpt_kernels.hpp:
// LayerNorm, the causal softmax forward and backward, which read only the causal part and apply
// attention's scale, and the GELU with its slope), as the two step lists of a detail::Plan. Some
// weight gradients run on dnnl_sgemm or OpenBLAS's sgemm in f32, and on oneDNN's matmul in bf16
// where its kernel is AMX's (plan_gpt.cpp).
//
// Rows: the M = N x block positions, (N, T, C) row-major. The residual stream x is f32 in both
// precisions (as PyTorch's autocast keeps it); LayerNorm reads it in f32 and writes its output in
// the activations' type for the next inner product (backward: the reverse).
// In bf16 the inner products' and matmuls' operands are bf16, their outputs bf16 where a bf16
// consumer follows (q, k, v; the GELU's input and output; attention's output) and f32 where an
// f32 one does (the residual branches, the logits, the attention scores); weight gradients are f32.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../plan_builder_base.hpp"
#include "cohort/nn/dropout.hpp"
#include "cohort/nn/gpt/gpt.hpp"
#include "cohort/nn/gpt/gpt_attention.hpp"
#include "gpt_plan.hpp"

namespace cohort::nn::detail {

class GptPlanBuilder : public PlanBuilderBase {
 public:
  using Dims = memory::dims;

  GptPlanBuilder(const GptPlanRequest& r, Plan& p)
      : PlanBuilderBase(p, *r.engine, r.precision, *r.weight_copies, r.stream),
        m_(*r.model),
        s_(m_.shape()),
        key_(r.key),
        windows_(r.windows),
        N_(r.N),
        T_(s_.block),
        C_(s_.embd),
        H_(s_.heads),
        hs_(s_.head_size()),
        V_(s_.padded_vocab()),
        M_(r.N * s_.block),
        training_(r.training),
        drop_(r.training && s_.dropout > 0),
        paths_(r.paths) {}

  // The steps, then one scratchpad for the plan, as large as the largest primitive's need.
  void build() {
    build_steps();
    bind_scratchpad();
  }

 private:
  void build_steps();
  struct LnSaved {
    // scale: the weight as f32; shift: the bias as f32, or none; stat: the variance (oneDNN's,
    // f32) or 1 / std (cohort's, bf16)
    memory src, mean, stat, scale, shift;
    std::size_t weight = 0, bias = GptModel::kNoBias;
  };
  struct BlockSaved {
    LnSaved ln1, ln2;
    memory h1, qkv, p, p_used, y, x_mid, h2, g;
    memory parts[3];  // dense attention (dense_attention()): q, k and v split from qkv
    memory stats;     // attention as cohort's kernel: each row's softmax top and 1 / sum
    memory slope;     // training plans: GELU's slope at f (gelu_forward), in place of f
  };

  bool half() const { return act_ == Dt::bf16; }
  memory plain(Dims dims, Dt dt) {
    memory::desc md(dims, dt, dims.size() == 1 ? Tag::a : dims.size() == 2 ? Tag::ab : Tag::abcd);
    return memory(md, eng_, buffer(md.get_size()));
  }
  // f32 rows of a multiple of 4 KB (1,024 floats), as the MLP's 4 C columns are for C = 256,
  // 512, ... oneDNN 2.6's AVX2 sgemm (gemm:jit) runs a weight gradient that reads rows of 4 KB
  // fastest when they are the non-transposed operand 16 bytes off 32-byte alignment, slower as
  // the transposed operand or aligned (docs/decisions.md, "Weight gradients of 4 KB rows", and
  // its command). Such buffers start 16 bytes off (skewed()) and linear_backward orients their
  // weight gradients to suit.
  static bool wide_rows(std::int64_t cols) { return cols % 1024 == 0; }
  bool skew(std::int64_t cols) const { return !half() && training_ && wide_rows(cols); }
  // An f32 weight gradient of at most kSmallWeightGradMacs multiply-adds (the leaf's rows x in x
  // out): where oneDNN's inner product is its gemm-based kernel, OpenBLAS's sgemm (its OpenMP
  // build) runs it, as W = dY^T X. It is the faster of the two for nanoGPT's CPU recipe's layers
  // and not for the larger ones (docs/decisions.md, "Small weight gradients on OpenBLAS").
  static constexpr std::int64_t kSmallWeightGradMacs = std::int64_t{1} << 25;
  bool small_weight_grad(std::int64_t in, std::int64_t out) const {
    return !half() && M_ * in * out <= kSmallWeightGradMacs;
  }
  memory skewed(Dims dims) {
    memory::desc md(dims, Dt::f32, Tag::ab);
    return memory(md, eng_, buffer(md.get_size() + 4 * sizeof(float)) + 4);
  }
  // temp() for a buffer of a layout oneDNN chose.
  memory temp(const std::string& role, const Dims& dims, Dt dt, const memory::desc& md) {
    std::string key = role + ":layout:" + std::to_string(static_cast<int>(dt));
    for (const auto d : dims) key += "," + std::to_string(d);
    auto [it, fresh] = temps_.try_emplace(key + ":" + std::to_string(md.get_size()));
    if (fresh) it->second = new_memory(md);
    return it->second;
  }
  // A buffer that steps of different layers reuse: what one layer's steps write and read before
  // the next layer's steps run (backward's gradients, forward's intermediate results that
  // backward does not read, and everything in an inference plan). One per role, dims and type.
  // With `skew`, a skewed() f32 buffer.
  memory temp(const std::string& role, const Dims& dims, Dt dt, bool skew = false) {
    std::string key = role + ":" + std::to_string(static_cast<int>(dt)) + (skew ? ":skewed" : "");
    for (const auto d : dims) key += "," + std::to_string(d);
    auto [it, fresh] = temps_.try_emplace(key);
    if (fresh) it->second = skew ? skewed(dims) : plain(dims, dt);
    return it->second;
  }
  // A buffer backward reads (its own per layer; with `skew`, a skewed() one), or in an
  // inference plan a reused one.
  memory kept(const std::string& role, const Dims& dims, Dt dt, bool skew = false) {
    if (!training_) return temp(role, dims, dt);
    return skew ? skewed(dims) : plain(dims, dt);
  }
  // A strided view of `base`'s buffer, `offset` elements in.
  memory view(const memory& base, Dims dims, Dims strides, std::int64_t offset) {
    const Dt dt = base.get_desc().data_type();
    memory::desc md(dims, dt, strides);
    return memory(md, eng_,
                  static_cast<char*>(base.get_data_handle()) +
                      offset * static_cast<std::int64_t>(memory::data_type_size(dt)));
  }
  // Attention's row blocks [first, last) of a window: a block's queries see the keys before
  // `last` only, so each attention matmul runs block by block on the part of the (T, T) scores
  // the causal mask keeps (plus the part of each diagonal block above its diagonal): 2 blocks
  // skip a quarter of the products, 4 three eighths. Blocks have 64 rows or more: on AVX2 in f32
  // (oneDNN's gemm:jit) blocks of 32 ran slower per product and saved nothing (docs/decisions.md,
  // "Attention by row blocks"). Dense attention (dense_attention()) takes whole windows: one block.
  std::vector<std::pair<std::int64_t, std::int64_t>> row_blocks() {
    if (dense_attention()) return {{0, T_}};
    const std::int64_t count = std::clamp<std::int64_t>(T_ / kMinBlockRows, 1, kMaxRowBlocks);
    const std::int64_t rows = (T_ + count - 1) / count;
    std::vector<std::pair<std::int64_t, std::int64_t>> blocks;
    for (std::int64_t first = 0; first < T_; first += rows)
      blocks.emplace_back(first, std::min(T_, first + rows));
    return blocks;
  }
  static constexpr std::int64_t kMinBlockRows = 64, kMaxRowBlocks = 4;
  // Attention's scale, 1 / sqrt(hs): the causal softmax's, forward and backward.
  float attention_scale() const { return 1.0f / std::sqrt(static_cast<float>(hs_)); }
  // Whether attention runs on dense q, k and v ((M, C) each, split from qkv after c_attn and
  // merged into its gradient before c_attn's backward) over whole windows: where oneDNN runs
  // that matmul on AMX (bf16 on AMX CPUs), whose kernel takes such operands and not the strided
  // views of qkv or the row blocks' (docs/decisions.md, "Attention on AMX"), or where
  // GptPaths::attention says so. Decided once a plan.
  bool dense_attention();
  // The engine with which attention runs as cohort's kernel (nn/gpt/gpt_attention.hpp) on qkv
  // itself, or none: bf16 plans where the kernel can run and GptPaths::attention is kAuto, kKernel
  // or kKernelAvx512Bf16. Decided once a plan.
  std::optional<AttentionEngine> attention_kernel();
  // block_forward's operations (plan_gpt_block.cpp).
  memory qkv_buffer();
  void attention(BlockSaved& b, std::int64_t l);
  void attention_forward(const BlockSaved& b, const float* pm);
  void residual(const memory& x, const memory& branch, std::size_t layer, const memory& copy);
  void gelu(const memory& f, BlockSaved& b);
  void attention_backward(const BlockSaved& b, const memory& dy, const memory& dqkv,
                          const float* pm);
  // The heads of a (M, ...) buffer whose rows are `row_stride` apart, from `column` on: rows
  // [r0, r0 + rows) of each window as (N, H, rows, hs), or with `transposed` (N, H, hs, rows).
  memory heads(const memory& base, std::int64_t row_stride, std::int64_t column, std::int64_t r0,
               std::int64_t rows, bool transposed = false) {
    const Dims dims = transposed ? Dims{N_, H_, hs_, rows} : Dims{N_, H_, rows, hs_};
    const Dims strides = transposed ? Dims{T_ * row_stride, hs_, 1, row_stride}
                                    : Dims{T_ * row_stride, hs_, row_stride, 1};
    return view(base, dims, strides, r0 * row_stride + column);
  }
  // q, k or v (which: 0, 1, 2) of every head, rows [r0, r0 + rows) of each window, as heads():
  // in `parts[which]` (M, C) where attention is dense, else in `qkv` (M, 3C).
  memory qkv_heads(const memory& qkv, const memory (&parts)[3], int which, std::int64_t r0,
                   std::int64_t rows, bool transposed = false) {
    return dense_attention() ? heads(parts[which], C_, 0, r0, rows, transposed)
                             : heads(qkv, 3 * C_, which * C_, r0, rows, transposed);
  }
  // `parts` (M, C) each = the three C-column parts of `whole` (M, 3C), or back (`merge`).
  void split_qkv(std::vector<Exec>& list, const memory& whole, const memory (&parts)[3],
                 bool merge) {
    const std::size_t row = static_cast<std::size_t>(C_) * memory::data_type_size(act_);
    auto* w = static_cast<char*>(whole.get_data_handle());
    char* pt[3];
    for (int i = 0; i < 3; ++i) pt[i] = static_cast<char*>(parts[i].get_data_handle());
    custom(list, [=, M = M_] {
      for (std::int64_t m = 0; m < M; ++m)
        for (int i = 0; i < 3; ++i) {
          char* a = w + (3 * m + i) * static_cast<std::int64_t>(row);
          char* b = pt[i] + m * static_cast<std::int64_t>(row);
          if (merge)
            std::memcpy(a, b, row);
          else
            std::memcpy(b, a, row);
        }
    });
  }
  memory param(Dims dims, std::size_t offset) {
    memory m(memory::desc(dims, act_, dims.size() == 1 ? Tag::a : Tag::ab), eng_, DNNL_MEMORY_NONE);
    p_.params.push_back({m, offset});
    return m;
  }
  memory grad(Dims dims, std::size_t offset) {
    memory m(memory::desc(dims, Dt::f32, dims.size() == 1 ? Tag::a : Tag::ab), eng_,
             DNNL_MEMORY_NONE);
    p_.grads.push_back({m, offset});
    return m;
  }
  // The plain f32 (M, C) memory `x` in the activations' type: itself in f32.
  memory as_act(std::vector<Exec>& list, const memory& x, Dims dims, const std::string& role) {
    if (!half()) return x;
    memory out = kept(role, dims, act_);
    reorder(list, x, out);
    return out;
  }
  // The dropout mask of `layer` (count values), drawn by a step appended to `list` into a buffer
  // that the next mask of that size reuses: forward draws it where it applies it, backward draws
  // it again where it needs it (the keyed stream gives the same values), so no mask is kept.
  float* mask(std::vector<Exec>& list, std::size_t count, std::size_t layer) {
    float* m = static_cast<float*>(
        temp("mask", {static_cast<std::int64_t>(count)}, Dt::f32).get_data_handle());
    const StreamKey* key = key_;
    const float p = s_.dropout;
    custom(list, [=] { dropout_mask(*key, layer, p, count, m); });
    return m;
  }
  // The same for attention's (N, H, T, T) weights, drawn where the causal softmax reads it only
  // (causal_dropout_mask): each row's entries up to its diagonal.
  float* causal_mask(std::vector<Exec>& list, std::size_t layer) {
    float* m = static_cast<float*>(temp("mask", {N_ * H_ * T_ * T_}, Dt::f32).get_data_handle());
    const StreamKey* key = key_;
    const float p = s_.dropout;
    const auto mats = static_cast<std::size_t>(N_ * H_), T = static_cast<std::size_t>(T_);
    custom(list, [=] { causal_dropout_mask(*key, layer, p, mats, T, m); });
    return m;
  }

  // LayerNorm, x f32 to dst in the activations' type, with the bias at `bias` unless it is
  // kNoBias: oneDNN's in f32; in bf16 cohort's loops (nn/gpt/gpt_kernels.hpp), which write and
  // read bf16 where oneDNN's needs a reorder each way. Backward: diff_src (f32) written or added
  // to (`accumulate`), the weight's and the bias's gradients overwritten.
  LnSaved ln_forward(const memory& x, std::size_t weight, std::size_t bias, const memory& dst);
  void ln_backward(const LnSaved& s, const memory& diff_dst, const memory& diff_src,
                   bool accumulate);
  // With `bias`, the inner product adds a bias of O values in the activations' type.
  dnnl::inner_product_forward::primitive_desc linear_pd(const memory::desc& src, std::int64_t O,
                                                        const memory::desc& dst, bool bias = false);
  // dst = src weights, a batched matmul on (strided) views, appended to `list`. No output scale:
  // oneDNN 2.6.3's bf16 gemm-based matmul runs several times slower with one (gpt_kernels.hpp).
  void add_matmul(std::vector<Exec>& list, const memory& src, const memory& weights,
                  const memory& dst) {
    const dnnl::matmul::primitive_desc pd(
        dnnl::matmul::desc(src.get_desc(), weights.get_desc(), dst.get_desc()), attr(), eng_);
    add(list, dnnl::matmul(pd), pd.scratchpad_desc(),
        {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, weights}, {DNNL_ARG_DST, dst}}, Phase::kMatmul);
  }
  // dst (M, O) = src (M, I) W^T (+ b) with W at `weight` in the parameters and b at `bias`
  // (none where it is kNoBias), appended to `list` (null: forward's).
  void linear(const memory& src, std::size_t weight, std::int64_t O, const memory& dst,
              std::size_t bias = GptModel::kNoBias, std::vector<Exec>* list = nullptr);
  // The head's rows a chunk: as many as keep a chunk's f32 logits within kHeadChunkBytes (at
  // least 16), or GptPaths::head_rows. The logits of a large vocabulary are the largest
  // activation (GPT-2's 50,304 columns: 201 KB a position), and nothing needs them whole.
  static constexpr std::int64_t kHeadChunkBytes = std::int64_t{16} << 20;
  std::int64_t head_rows() const {
    if (paths_.head_rows > 0) return paths_.head_rows;
    return std::max<std::int64_t>(
        16, kHeadChunkBytes / (V_ * static_cast<std::int64_t>(sizeof(float))));
  }
  // The tied head on xf (M, C): the logits (Plan::logits) and, in training, dxf from their
  // gradient and the token embedding's gradient from the head; in one chunk in the plan's own
  // forward and backward steps, else in Plan::head_chunks.
  void head(const memory& xf, const memory& dxf);
  // diff_src from diff_dst; the weight's gradient (overwritten) from src and diff_dst, and the
  // bias's (unless kNoBias: diff_dst's column sums).
  void linear_backward(const memory& src, std::size_t weight, std::int64_t O,
                       const memory& diff_dst, const memory& diff_src,
                       std::size_t bias = GptModel::kNoBias);
  // Appended to `list` (null: backward's).
  void linear_backward_data(const memory& src, std::size_t weight, std::int64_t O,
                            const memory& diff_dst, const memory& diff_src,
                            std::vector<Exec>* list = nullptr);
  void linear_backward_weights(const memory& src, std::size_t weight, std::int64_t O,
                               const memory& diff_dst);
  // `next_in`: where the block's last residual add also writes the stream (the next block's
  // input, which backward reads), or none.
  BlockSaved block_forward(std::int64_t l, const memory& x, const memory& next_in);
  void block_backward(std::int64_t l, const BlockSaved& b, const memory& dx);

  const GptModel& m_;
  const GptShape& s_;
  const StreamKey* key_;
  const std::int32_t* const* windows_;
  const std::int64_t N_, T_, C_, H_, hs_, V_, M_;
  const bool training_, drop_;
  const GptPaths paths_;
  std::optional<dnnl::layer_normalization_forward::primitive_desc> ln_fwd_;
  std::optional<dnnl::layer_normalization_backward::primitive_desc> ln_bwd_;
  std::map<std::string, memory> temps_;
  std::map<std::size_t, memory> blocked_weights_;  // by offset: forward's copy in its layout
  std::optional<bool> dense_attention_;
  std::optional<std::optional<AttentionEngine>> attention_kernel_;
};

// Whether oneDNN runs `pd` on AMX (its implementation's name says so: "brg:avx512_core_amx").
inline bool amx_kernel(const dnnl::primitive_desc_base& pd) {
  return std::string(pd.impl_info_str()).find("amx") != std::string::npos;
}
// Whether oneDNN runs `pd` on a brgemm kernel, AMX's or AVX-512's ("brg:avx512_core_bf16"), not
// its gemm-based one ("gemm:jit").
inline bool brgemm_kernel(const dnnl::primitive_desc_base& pd) {
  return std::string(pd.impl_info_str()).starts_with("brg");
}

}  // namespace cohort::nn::detail
