// The step's roofline (Summary::roofline): the time a step would take if its GEMMs ran at this
// run's own oneDNN rate — a leaf's matmul primitives timed alone on one thread (a fresh Net of
// the run's model, precision and layouts), times the leaves, plus the root's batch weight-gradient
// GEMMs, spread evenly over the replicas (a language model's attention products at oneDNN's rate
// also where cohort's kernel computes them, nn/gpt/gpt_attention.hpp) — and the root moved its
// bytes at this run's own sweep bandwidth; and the measured step time against it. Same-run
// measurements only, so the fraction does not depend on which machine or how noisy a day it is.
#pragma once

#include <cstddef>
#include <span>

#include "cohort/nn/model.hpp"
#include "cohort/train/trainer.hpp"
#include "step_graph.hpp"

namespace cohort::train {

// `step_seconds`: the measured mean step of full batches. `state_arrays`: the optimizer's.
// `job_replicas`: the replicas of every rank, which share the batch's leaves; `ranks`: the
// processes whose roots each sweep a share of the root's bytes. Several ranks: the caller runs
// this on one rank while the others wait, so that no rank's work slows another's floor.
// `root_sources`: the gradients the root reads per step (the leaves, or 1 where a LeafChain sums
// them first). `scratch`: arrays of the model's parameter count the sweep may overwrite instead
// of allocating its own (the run's leaf buffers, idle between steps).
Roofline measure_roofline(const nn::Model& model, const TrainConfig& config, StepGraph& graph,
                          std::size_t state_arrays, double step_seconds, std::size_t job_replicas,
                          std::size_t ranks, std::size_t root_sources,
                          std::span<float* const> scratch);

}  // namespace cohort::train
