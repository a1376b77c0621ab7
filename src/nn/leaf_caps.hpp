// The model kinds' default leaves (ModelKind::leaf_rule) and the bounds of their leaf plans: a
// function of the model and the precision only, never of the machine, the workers or the ranks,
// so that the same command gives the same weights on any machine whose kernels dispatch alike.
// The reasons for each cap, and the commands that measure them: docs/decisions.md, "Micro-batch
// defaults"; how the leaves serve more cores: docs/scaling.md.
#pragma once

#include <cstddef>

#include "cohort/nn/executor.hpp"

namespace cohort::nn {

// A model with bn layers: the leaf's rows are the normalization's sample, part of the model.
inline constexpr std::size_t kBatchNormMicroBatch = 64;
// A model of linear layers: with batch weight gradients (the default) a leaf computes only its
// activations and the gradients of its layer inputs, so its rows cost little; this many keeps
// a leaf's GEMMs near their full rate while a batch of 256 still has 4 leaves.
inline constexpr std::size_t kLinearMicroBatch = 64;
// A model with convolutions (and no bn): a leaf's activations stay within a core's L2.
inline constexpr std::size_t kConvMicroBatch = 32;
// In bf16, the cap is halved where a leaf of kConvMicroBatch rows would have a layer output larger
// than this: the L2 of the smallest core the default is sized for (a fixed figure, not this
// machine's, so that the leaves never depend on where the run is).
inline constexpr std::size_t kConvLeafBytes = std::size_t{1} << 20;
// A language model's largest leaf in bf16, in activation values: tokens x layers x (embd + heads
// x block), the two terms a layer's kept activations and buffers grow with (its rows, and its
// attention weights); f32 gets half as many (leaf_bytes_per_value).
inline constexpr std::size_t kLeafActivationValues = std::size_t{12} << 20;
// The most tokens in a language model's leaf.
inline constexpr std::size_t kLeafTokens = 512;
// The fewest leaves a language model's batch of at least this many windows is cut into: a batch
// within one leaf's cap (GPT-2's 124M at batch 4 of 64 tokens) would otherwise run its step on one
// core. More leaves cost a whole-model gradient each.
inline constexpr std::size_t kLanguageModelMinLeaves = 2;
// The bytes a language model's leaf plan takes per such value: about 20 in bf16 and 30 in f32.
constexpr double leaf_bytes_per_value(Precision p) { return p == Precision::kBf16 ? 20.0 : 30.0; }
// Where attention is cohort's kernel (bf16 on AMX or AVX512_BF16), which keeps no attention
// weights: a bound on a leaf plan's bytes per token x layer x embd value (its rows' activations,
// the head's chunk and the plan's temporaries; docs/benchmarks.md, "GPT-2's 350M"). Only the
// check that a run fits this machine's memory reads it; the default leaves keep the estimate
// above, which is the same on every machine.
inline constexpr double kKernelLeafBytesPerValue = 64.0;
// A language model's evaluation runs windows of at most this many tokens at a time: its
// attention scores alone take heads x block x 10 bytes a token (nanoGPT's full recipe: 15 KB).
inline constexpr std::size_t kEvalTokens = 2048;

}  // namespace cohort::nn
