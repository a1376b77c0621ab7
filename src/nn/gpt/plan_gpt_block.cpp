// The steps of one transformer block (GptPlanBuilder, gpt_plan_builder.hpp): pre-LN causal
// self-attention and the GELU MLP, each a residual branch, forward and backward.
//
// Attention on views of qkv (M, 3C): q, k and v of head h are the (T, hs) blocks at columns
// h*hs, C + h*hs and 2C + h*hs of each window, so the matmuls read them through strides, k
// transposed by swapping two strides, and write the heads' outputs into y (M, C) the same way.
// Where attention is dense (dense_attention(): AMX), the same views of dense (M, C) copies of q,
// k and v, over whole windows.
#include <oneapi/dnnl/dnnl.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "cohort/nn/gpt/gpt_attention.hpp"
#include "cohort/nn/gpt/gpt_kernels.hpp"
#include "gpt_plan_builder.hpp"

namespace cohort::nn::detail {

namespace {

// Which dropout stream a mask draws from (tests/reference/gpt_reference.hpp draws the same).
std::size_t dropout_layer(std::int64_t block, int which) {
  return 1 + 3 * static_cast<std::size_t>(block) + static_cast<std::size_t>(which);
}

}  // namespace

// One block's forward as its list of operations, as llm.c's train_gpt2.c writes it; how each is
// lowered (oneDNN or cohort's loop, the precision, dropout, the attention engine) is the
// operation's own.
GptPlanBuilder::BlockSaved GptPlanBuilder::block_forward(std::int64_t l, const memory& x,
                                                         const memory& next_in) {
  const GptModel::BlockOffsets& o = m_.block(l);
  const std::string h = "h." + std::to_string(l);
  const std::int64_t C = C_;
  BlockSaved b;
  where_ = h + ".ln_1";
  b.h1 = kept("h1", {M_, C}, act_);  // the LayerNorm's output, the next layer's input: kept
  b.ln1 = ln_forward(x, o.ln_1, o.ln_1_bias, b.h1);
  where_ = h + ".attn.c_attn";
  b.qkv = qkv_buffer();
  linear(b.h1, o.c_attn, 3 * C, b.qkv, o.c_attn_bias);
  where_ = h + ".attn";
  attention(b, l);
  where_ = h + ".attn.c_proj";
  const memory a = temp("branch", {M_, C}, Dt::f32);
  linear(b.y, o.attn_proj, C, a, o.attn_proj_bias);
  b.x_mid = training_ ? plain({M_, C}, Dt::f32) : x;  // the stream after this branch (ln_2's input)
  residual(x, a, dropout_layer(l, 1), training_ ? b.x_mid : memory());
  where_ = h + ".ln_2";
  b.h2 = kept("h2", {M_, C}, act_);
  b.ln2 = ln_forward(b.x_mid, o.ln_2, o.ln_2_bias, b.h2);
  where_ = h + ".mlp.c_fc";
  const memory f = temp("f", {M_, 4 * C}, act_);
  linear(b.h2, o.c_fc, 4 * C, f, o.c_fc_bias);
  where_ = h + ".mlp.gelu";
  gelu(f, b);
  where_ = h + ".mlp.c_proj";
  const memory mo = temp("branch", {M_, C}, Dt::f32);
  linear(b.g, o.mlp_proj, C, mo, o.mlp_proj_bias);
  residual(x, mo, dropout_layer(l, 2), next_in);
  return b;
}

// Where the QKV projection writes: kept for backward, except where attention is dense (its q, k
// and v are kept copies).
dnnl::memory GptPlanBuilder::qkv_buffer() {
  const bool dense = !attention_kernel() && dense_attention();
  return dense ? temp("qkv", {M_, 3 * C_}, act_) : kept("qkv", {M_, 3 * C_}, act_);
}

// Causal self-attention of b.qkv into b.y: as cohort's kernel, head by head, where
// attention_kernel() has an engine (each row's softmax statistics kept); else on oneDNN's matmuls
// around cohort's softmax (attention_forward), on dense copies of q, k and v or on views of qkv.
void GptPlanBuilder::attention(BlockSaved& b, std::int64_t l) {
  const std::int64_t T = T_, H = H_, N = N_;
  const std::optional<AttentionEngine> kernel = attention_kernel();
  const bool dense = !kernel && dense_attention();
  const float* pm = drop_ ? causal_mask(p_.forward, dropout_layer(l, 0)) : nullptr;
  b.y = kept("y", {M_, C_}, act_);
  if (kernel) {
    b.stats = kept("stats", {N, H, T, 2}, Dt::f32);
    const auto* qkv = static_cast<const bf16*>(b.qkv.get_data_handle());
    float* stats = static_cast<float*>(b.stats.get_data_handle());
    auto* y = static_cast<bf16*>(b.y.get_data_handle());
    const AttentionShape shape{N, T, H, hs_};
    const float scale = attention_scale();
    const AttentionEngine engine = *kernel;
    custom(
        p_.forward, [=] { attention_kernel_forward(engine, qkv, pm, stats, y, shape, scale); },
        Phase::kAttention);
    return;
  }
  // P (f32) and the weights the values are averaged with, P dropped out and in the activations'
  // type (b.p_used), both written by the softmax; P itself where neither applies.
  b.p = kept("p", {N, H, T, T}, Dt::f32);
  b.p_used = drop_ || half() ? kept("p_used", {N, H, T, T}, act_) : b.p;
  if (dense) {
    for (int i = 0; i < 3; ++i) b.parts[i] = kept("qkv." + std::to_string(i), {M_, C_}, act_);
    split_qkv(p_.forward, b.qkv, b.parts, false);
  }
  attention_forward(b, pm);
}

// A residual branch: x += dropout(branch), in f32; with `copy`, the sum also written there.
void GptPlanBuilder::residual(const memory& x, const memory& branch, std::size_t layer,
                              const memory& copy) {
  float* xs = static_cast<float*>(x.get_data_handle());
  float* to = copy ? static_cast<float*>(copy.get_data_handle()) : nullptr;
  const float* br = static_cast<const float*>(branch.get_data_handle());
  const std::size_t n = static_cast<std::size_t>(M_ * C_);
  const float* mk = drop_ ? mask(p_.forward, n, layer) : nullptr;
  custom(p_.forward, [=] {
    if (mk)
      for (std::size_t i = 0; i < n; ++i) xs[i] += br[i] * mk[i];
    else
      for (std::size_t i = 0; i < n; ++i) xs[i] += br[i];
    if (to) std::memcpy(to, xs, n * sizeof(float));
  });
}

// b.g = GELU(f) (the model's form) by gelu_forward, which keeps its slope for backward (training
// plans: b.slope, in the activations' type); b.g is c_proj's X.
void GptPlanBuilder::gelu(const memory& f, BlockSaved& b) {
  const std::int64_t n = M_ * 4 * C_;
  b.g = kept("g", {M_, 4 * C_}, act_, skew(4 * C_));
  if (training_) b.slope = plain({M_, 4 * C_}, act_);
  void* in = f.get_data_handle();
  void* g = b.g.get_data_handle();
  void* slope = training_ ? b.slope.get_data_handle() : nullptr;
  const bool half = this->half();
  const Gelu form = s_.tanh_gelu ? Gelu::kTanh : Gelu::kErf;
  custom(
      p_.forward,
      [in, g, slope, n, half, form] {
        if (half)
          gelu_forward(static_cast<const bf16*>(in), static_cast<bf16*>(g),
                       static_cast<bf16*>(slope), n, form);
        else
          gelu_forward(static_cast<const float*>(in), static_cast<float*>(g),
                       static_cast<float*>(slope), n, form);
      },
      Phase::kEltwise);
}

// Attention on oneDNN's matmuls around cohort's causal softmax (block_forward's other way).
void GptPlanBuilder::attention_forward(const BlockSaved& b, const float* pm) {
  using namespace dnnl;
  const std::int64_t T = T_, C = C_, H = H_, N = N_;
  auto part = [&](int which, std::int64_t r0, std::int64_t rows, bool transposed = false) {
    return qkv_heads(b.qkv, b.parts, which, r0, rows, transposed);
  };
  const Dims p_strides{H * T * T, T * T, T, 1};
  const auto blocks = row_blocks();
  memory scores = temp("scores", {N, H, T, T}, Dt::f32);
  // S = Q K^T, a row block's queries against the keys before its end.
  for (const auto& [r0, r1] : blocks)
    add_matmul(p_.forward, part(0, r0, r1 - r0), part(1, 0, r1, true),
               view(scores, {N, H, r1 - r0, r1}, p_strides, r0 * T));
  // P = the causal softmax of S / sqrt(hs): a query sees the keys at and before its position (the
  // entries no block wrote are above the diagonal, and causal_softmax_forward does not read
  // them). The scale is the softmax's, not the matmul's (gpt_kernels.hpp).
  {
    const float* sc = static_cast<const float*>(scores.get_data_handle());
    float* pp = static_cast<float*>(b.p.get_data_handle());
    void* used = b.p_used == b.p ? nullptr : b.p_used.get_data_handle();
    const bool half = this->half();
    const float scale = attention_scale();
    custom(
        p_.forward,
        [=] {
          if (!used)
            causal_softmax_forward(sc, pp, N * H, T, scale);
          else if (half)
            causal_softmax_forward(sc, pp, pm, static_cast<bf16*>(used), N * H, T, scale);
          else
            causal_softmax_forward(sc, pp, pm, static_cast<float*>(used), N * H, T, scale);
        },
        Phase::kEltwise);
  }
  // Y = P V by row blocks: P is 0 after a block's last key.
  for (const auto& [r0, r1] : blocks)
    add_matmul(p_.forward, view(b.p_used, {N, H, r1 - r0, r1}, p_strides, r0 * T), part(2, 0, r1),
               heads(b.y, C, 0, r0, r1 - r0));
}

void GptPlanBuilder::block_backward(std::int64_t l, const BlockSaved& b, const memory& dx) {
  using namespace dnnl;
  const GptModel::BlockOffsets& o = m_.block(l);
  const std::int64_t C = C_;
  const std::size_t n = static_cast<std::size_t>(M_ * C);
  float* dxs = static_cast<float*>(dx.get_data_handle());
  // A residual branch's gradient: dx through the branch's dropout, in the activations' type.
  auto branch = [&](std::size_t layer) {
    const float* kept = drop_ ? mask(p_.backward, n, layer) : nullptr;
    memory d = temp("d.branch", {M_, C}, act_);
    void* out = d.get_data_handle();
    const bool half = this->half();
    custom(p_.backward, [=] {
      for (std::size_t i = 0; i < n; ++i) {
        const float g = kept ? dxs[i] * kept[i] : dxs[i];
        if (half)
          static_cast<bf16*>(out)[i] = to_bf16(g);
        else
          static_cast<float*>(out)[i] = g;
      }
    });
    return d;
  };
  // The input gradient of a linear layer in front of a LayerNorm, whose backward adds its own
  // input gradient to dx.
  memory dh = temp("d.h", {M_, C}, act_);

  where_ = "h." + std::to_string(l) + ".mlp.c_proj";
  const memory dmo = branch(dropout_layer(l, 2));
  memory dg = temp("d.g", {M_, 4 * C}, act_);
  linear_backward(b.g, o.mlp_proj, C, dmo, dg, o.mlp_proj_bias);
  where_ = "h." + std::to_string(l) + ".mlp.gelu";
  memory df = temp("d.f", {M_, 4 * C}, act_, skew(4 * C));  // c_fc's dY
  {
    const void* dgs = dg.get_data_handle();
    const void* slope = b.slope.get_data_handle();
    void* dfs = df.get_data_handle();
    const std::int64_t count = M_ * 4 * C;
    const bool half = this->half();
    custom(
        p_.backward,
        [dgs, slope, dfs, count, half] {
          if (half)
            gelu_backward(static_cast<const bf16*>(dgs), static_cast<const bf16*>(slope),
                          static_cast<bf16*>(dfs), count);
          else
            gelu_backward(static_cast<const float*>(dgs), static_cast<const float*>(slope),
                          static_cast<float*>(dfs), count);
        },
        Phase::kEltwise);
  }
  where_ = "h." + std::to_string(l) + ".mlp.c_fc";
  linear_backward(b.h2, o.c_fc, 4 * C, df, dh, o.c_fc_bias);
  where_ = "h." + std::to_string(l) + ".ln_2";
  ln_backward(b.ln2, dh, dx, true);

  where_ = "h." + std::to_string(l) + ".attn.c_proj";
  const memory da = branch(dropout_layer(l, 1));
  memory dy = temp("d.y", {M_, C}, act_);
  linear_backward(b.y, o.attn_proj, C, da, dy, o.attn_proj_bias);

  where_ = "h." + std::to_string(l) + ".attn";
  const memory dqkv = temp("d.qkv", {M_, 3 * C}, act_);
  const float* pm = drop_ ? causal_mask(p_.backward, dropout_layer(l, 0)) : nullptr;
  if (const std::optional<AttentionEngine> kernel = attention_kernel()) {
    const auto* qkv = static_cast<const bf16*>(b.qkv.get_data_handle());
    const auto* stats = static_cast<const float*>(b.stats.get_data_handle());
    const auto* dys = static_cast<const bf16*>(dy.get_data_handle());
    auto* out = static_cast<bf16*>(dqkv.get_data_handle());
    const AttentionShape shape{N_, T_, H_, hs_};
    const float scale = attention_scale();
    const AttentionEngine engine = *kernel;
    custom(
        p_.backward,
        [=] { attention_kernel_backward(engine, qkv, stats, pm, dys, out, shape, scale); },
        Phase::kAttention);
  } else {
    attention_backward(b, dy, dqkv, pm);
  }

  where_ = "h." + std::to_string(l) + ".attn.c_attn";
  linear_backward(b.h1, o.c_attn, 3 * C, dqkv, dh, o.c_attn_bias);
  where_ = "h." + std::to_string(l) + ".ln_1";
  ln_backward(b.ln1, dh, dx, true);
}

// Attention's backward on oneDNN's matmuls around cohort's causal softmax backward
// (block_backward's other way), into dqkv.
void GptPlanBuilder::attention_backward(const BlockSaved& b, const memory& dy, const memory& dqkv,
                                        const float* pm) {
  using namespace dnnl;
  const std::int64_t T = T_, C = C_, H = H_, N = N_;
  const bool dense = dense_attention();
  // q, k or v of every head as block_forward's `part`, and their gradients' parts.
  memory dparts[3];
  if (dense)
    for (int i = 0; i < 3; ++i) dparts[i] = temp("d.qkv." + std::to_string(i), {M_, C}, act_);
  auto part = [&](int which, std::int64_t r0, std::int64_t rows, bool transposed = false) {
    return qkv_heads(b.qkv, b.parts, which, r0, rows, transposed);
  };
  auto dpart = [&](int which, std::int64_t r0, std::int64_t rows) {
    return qkv_heads(dqkv, dparts, which, r0, rows);
  };
  const Dims p_strides{H * T * T, T * T, T, 1};
  const Dims transposed{H * T * T, T * T, 1, T};
  const auto blocks = row_blocks();
  // dP = dY V^T by row blocks (the entries after a block's last key are not read): the gradient
  // of the weights the forward's P V read, before the attention dropout.
  memory dp = temp("d.p", {N, H, T, T}, Dt::f32);
  for (const auto& [r0, r1] : blocks)
    add_matmul(p_.backward, heads(dy, C, 0, r0, r1 - r0), part(2, 0, r1, true),
               view(dp, {N, H, r1 - r0, r1}, p_strides, r0 * T));
  // dV = P^T dY (P as the forward used it) by key blocks: the queries from a block's first key
  // on.
  for (const auto& [c0, c1] : blocks)
    add_matmul(p_.backward, view(b.p_used, {N, H, c1 - c0, T - c0}, transposed, c0 * T + c0),
               heads(dy, C, 0, c0, T - c0), dpart(2, c0, c1 - c0));
  // dS = scale softmax'(P) (dP through the dropout), the gradient of the unscaled scores, in the
  // activations' type (causal_softmax_backward: oneDNN 2.6's is a reference loop on AVX2; it
  // reads the causal part and writes 0 above the diagonal).
  const memory ds_act = temp("d.s", {N, H, T, T}, act_);
  {
    const float* pp = static_cast<const float*>(b.p.get_data_handle());
    const float* dps = static_cast<const float*>(dp.get_data_handle());
    void* out = ds_act.get_data_handle();
    const bool half = this->half();
    const float scale = attention_scale();
    custom(
        p_.backward,
        [=] {
          if (half)
            causal_softmax_backward(pp, dps, pm, static_cast<bf16*>(out), N * H, T, scale);
          else
            causal_softmax_backward(pp, dps, pm, static_cast<float*>(out), N * H, T, scale);
        },
        Phase::kEltwise);
  }
  // dQ = dS K by row blocks, dK = dS^T Q by key blocks.
  for (const auto& [r0, r1] : blocks)
    add_matmul(p_.backward, view(ds_act, {N, H, r1 - r0, r1}, p_strides, r0 * T), part(1, 0, r1),
               dpart(0, r0, r1 - r0));
  for (const auto& [c0, c1] : blocks)
    add_matmul(p_.backward, view(ds_act, {N, H, c1 - c0, T - c0}, transposed, c0 * T + c0),
               part(0, c0, T - c0), dpart(1, c0, c1 - c0));
  if (dense) split_qkv(p_.backward, dqkv, dparts, true);
}

std::optional<AttentionEngine> GptPlanBuilder::attention_kernel() {
  using Attention = GptPaths::Attention;
  if (!attention_kernel_) {
    std::optional<AttentionEngine> engine;
    const Attention a = paths_.attention;
    if (a == Attention::kKernelAvx512Bf16 && half() &&
        attention_kernel_usable(AttentionEngine::kAvx512Bf16, T_, hs_))
      engine = AttentionEngine::kAvx512Bf16;
    else if (a == Attention::kAuto || a == Attention::kKernel || a == Attention::kKernelAvx512Bf16)
      engine = gpt_attention_kernel(m_, half() ? Precision::kBf16 : Precision::kF32);
    attention_kernel_ = engine;
  }
  return *attention_kernel_;
}

bool GptPlanBuilder::dense_attention() {
  using Attention = GptPaths::Attention;
  if (!dense_attention_ && paths_.attention != Attention::kAuto &&
      paths_.attention != Attention::kKernel && paths_.attention != Attention::kKernelAvx512Bf16)
    dense_attention_ = paths_.attention == Attention::kDense;
  if (!dense_attention_) {
    using namespace dnnl;
    const memory::desc q({N_, H_, T_, hs_}, act_, Dims{T_ * C_, hs_, C_, 1});
    const memory::desc kt({N_, H_, hs_, T_}, act_, Dims{T_ * C_, hs_, 1, C_});
    const memory::desc scores({N_, H_, T_, T_}, Dt::f32, Tag::abcd);
    dense_attention_ =
        half() && amx_kernel(matmul::primitive_desc(matmul::desc(q, kt, scores), attr(), eng_));
  }
  return *dense_attention_;
}

}  // namespace cohort::nn::detail
