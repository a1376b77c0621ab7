// The default leaf size (micro-batch): a function of the model, the batch and the precision only,
// never of the machine, the workers or the ranks, so that the same command gives the same weights
// on any machine whose kernels dispatch alike. Each model kind has a largest leaf (its cap); the
// batch is cut into as few leaves as the cap allows, of equal rows (the last one possibly
// shorter), so that no leaf is a sliver. The reasons for each cap, and the commands that measure
// them: docs/decisions.md, "Micro-batch defaults"; how the leaves serve more cores:
// docs/scaling.md.
#pragma once

#include <cstddef>

#include "cohort/nn/gpt.hpp"
#include "cohort/nn/model.hpp"
#include "cohort/nn/net.hpp"

namespace cohort::train {

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
// attention weights); a replica's leaf plan takes about 20 bytes per such value in bf16 and 30 in
// f32, which gets half as many.
inline constexpr std::size_t kLeafActivationValues = std::size_t{12} << 20;
// The most tokens in a language model's leaf.
inline constexpr std::size_t kLeafTokens = 512;

// Windows in a language model's largest leaf: as many as kLeafActivationValues allow in
// `precision` and kLeafTokens allows, at least 1.
std::size_t gpt_leaf_windows(const nn::GptShape& shape, nn::Precision precision);
// The largest leaf of a model with convolutions in `precision`: kConvMicroBatch, or half of it
// in bf16 where a layer's output at kConvMicroBatch rows exceeds kConvLeafBytes.
std::size_t conv_micro_batch(const nn::Model& model, nn::Precision precision);
// The rows of each of the fewest leaves of at most `cap` rows that cover `batch`, as even as
// whole rows allow: ceil(batch / ceil(batch / cap)).
std::size_t balanced_leaf(std::size_t batch, std::size_t cap);
// The default micro-batch of `model` at `batch` in `precision` (0 for a batch of 0).
std::size_t default_micro_batch(const nn::Model& model, std::size_t batch, nn::Precision precision);

}  // namespace cohort::train
