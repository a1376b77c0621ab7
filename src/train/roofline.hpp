// The step's roofline (Summary::roofline): the time a step would take if its GEMMs ran at
// oneDNN's rate — a leaf's matmul primitives timed alone on one thread (replica 0's Net, the run's
// own primitives; a layer list's inner products at the faster of their plain weights and the
// layout oneDNN chooses, nn/linear_floor.hpp; a language model's attention products at oneDNN's
// rate also where cohort's kernel computes them, nn/gpt/gpt_attention.hpp), times the leaves
// over the replicas with leaves, plus the root's batch weight-gradient GEMMs over every worker —
// and the root moved its bytes at this run's own sweep bandwidth; each part at most the run's own
// time for the same work; and the measured step time against it. Same-run measurements only, so
// the fraction does not depend on which machine or how noisy a day it is.
#pragma once

#include <cstddef>
#include <span>

#include "cohort/nn/model.hpp"
#include "cohort/train/trainer.hpp"
#include "step_graph.hpp"

namespace cohort::train {

// What the floor is made of, from the model and the config alone (no timing): the leaves and the
// replicas the GEMMs spread over, the root's bytes, and the sweep that stands for them (the
// bytes it reads besides the arrays it updates in place, those arrays, and their floats: a
// rank's share of them).
struct FloorPlan {
  std::size_t leaves = 0, replicas = 0;
  std::size_t root_threads = 0;        // the job's workers, over which the root's chunks spread
  std::size_t workers = 0, ranks = 0;  // this process's workers; the job's processes
  double root_bytes = 0;
  double sweep_read_bytes = 0;
  std::size_t sweep_arrays = 0, sweep_floats = 0;
};
// The run's own work a step, in worker-seconds (this process's time table over the steps after
// the first, divided by their number): the leaves' GEMMs (matmul and attention less the root's),
// the root's GEMMs (weight_grad) and its reducer's and optimizer's work (reduce). A floor part is
// a minimum: where the part timed alone took longer than the run's own steps took for the same
// work, the machine was slower while it was timed, and the floor counts the run's own instead
// (Roofline::run_gemm_seconds, run_root_seconds).
struct RunWork {
  double leaf_gemm_seconds = 0, root_gemm_seconds = 0, reduce_seconds = 0;
};
// Arguments as measure_roofline's.
FloorPlan plan_floor(const nn::Model& model, const TrainConfig& config, std::size_t state_arrays,
                     std::size_t job_replicas, std::size_t ranks, std::size_t root_sources);
// The roofline from its plan and its measured parts: one leaf's GEMMs, the root's GEMMs of a
// step, the sweep, the measured step, and the run's own work (arithmetic only). The run's work
// caps the floor's parts only in one process (several ranks: a rank's table holds its share).
Roofline roofline_of(const FloorPlan& plan, double leaf_gemm_seconds, double root_gemm_seconds,
                     double sweep_seconds, double step_seconds, const RunWork& run = {});

// The roofline of a run: plan_floor, its parts timed on this machine, roofline_of.
// `step_seconds`: the measured mean step of full batches; `run`: the same steps' work.
// `state_arrays`: the optimizer's. `job_replicas`: the replicas (workers) of every rank, which
// share the batch's leaves and run the root's chunks; `ranks`: the processes whose roots each
// sweep a share of the root's bytes. Several ranks: the caller runs this on one rank while the
// others wait, so that no rank's work slows another's floor.
// `root_sources`: the gradients the root reads per step (the leaves, or 1 where a LeafChain sums
// them first). `scratch`: arrays of the model's parameter count the sweep may overwrite instead
// of allocating its own (the run's leaf buffers, idle between steps); `readable`: an array it may
// read and never writes (the run's weights).
Roofline measure_roofline(const nn::Model& model, const TrainConfig& config, StepGraph& graph,
                          std::size_t state_arrays, double step_seconds, const RunWork& run,
                          std::size_t job_replicas, std::size_t ranks, std::size_t root_sources,
                          std::span<float* const> scratch, std::span<const float> readable);

}  // namespace cohort::train
