// Trainer: synchronous data-parallel training of one Model on one machine. Each step's global
// batch is cut into micro-shards (leaves) of a fixed size; W replicas claim leaves one at a time
// (a leaf's gradient does not depend on who computes it) and compute each with their own Net; the
// reducer sums the leaves in a fixed tree order and, at its root (train/root.hpp), scales by
// 1/batch and applies the optimizer to the one shared copy of the master weights, chunk by chunk.
// The result depends on the seed and the micro-batch, never on W (for the deterministic reducer
// strategies). Not a CLI: no printing, no files (see cli/); observers get events.
//
// Thread-safety: one thread drives a Trainer (run()); it uses a TBB arena of W threads inside.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cohort/checkpoint/checkpoint.hpp"
#include "cohort/data/dataset.hpp"
#include "cohort/dist/comm.hpp"
#include "cohort/nn/model.hpp"
#include "cohort/nn/net.hpp"
#include "cohort/nn/version.hpp"
#include "cohort/optim/optimizer.hpp"
#include "cohort/optim/schedule.hpp"
#include "cohort/reduce/reducer.hpp"

namespace cohort::train {

struct TrainConfig {
  std::string model = "mlp:784-512-256-10";
  std::size_t workers = 0;  // 0: one per core; at most kMaxWorkers
  std::size_t batch = 256;  // global batch B
  // Leaf size M; 0: a function of the model, the batch and the precision only, never of the
  // machine, the workers or the ranks (default_micro_batch, src/train/defaults.hpp), so that a
  // command gives the same weights wherever it runs.
  std::size_t micro_batch = 0;
  std::size_t epochs = 5;
  std::size_t steps = 0;  // stop after this many optimizer steps; 0: run all epochs
  optim::OptimizerConfig optimizer{};
  optim::ScheduleConfig schedule{};
  // Clip the mean gradient to this global L2 norm (torch.nn.utils.clip_grad_norm_); 0: off.
  float clip_norm = 0;
  // Exempt bn scales and shifts and every bias from weight decay (--no-decay-norm-bias), as many
  // recipes do; default: decay every tensor, as torch.optim does.
  bool no_decay_norm_bias = false;
  // A non-finite loss or gradient: stop the run (naming step and tensor), or skip the step
  // (nothing applied, the schedule does not advance) and count it; max_skips skipped steps in a
  // row stop the run.
  enum class OnNonFinite { kStop, kSkip };
  static constexpr Named<OnNonFinite> kOnNonFiniteNames[] = {{OnNonFinite::kStop, "stop"},
                                                             {OnNonFinite::kSkip, "skip"}};
  OnNonFinite on_nonfinite = OnNonFinite::kStop;
  std::size_t max_skips = 10;
  std::uint64_t seed = 1;
  // How the leaves' gradients are summed. tree, chunk_owner, parameter_server and serial evaluate
  // the same tree order (the same weights for every W); atomic and mutex add in arrival order.
  reduce::Strategy reducer = reduce::Strategy::kTree;
  // Where linear layers' weight gradients are computed (docs/architecture.md, "Batch weight
  // gradients"): per leaf, in the replica's backward pass, summed by the reducer's root (kLeaf);
  // or over the whole batch at the root, one GEMM per chunk of the weights right before the
  // optimizer reads it, from the batch's kept layer inputs and output gradients (kBatch).
  // Either is bitwise reproducible for every worker count; they differ from each other in the
  // order of the batch sum. Convolution gradients are per leaf in both. kBatch is the default:
  // writing and re-reading a whole gradient per leaf costs the same bytes whatever the leaf's
  // rows, so per-leaf gradients lose at small leaves and tie at large ones (measured:
  // docs/decisions.md, "Batch weight gradients by default"); and a model of linear layers then
  // gets the same weights for every micro-batch of whole 16-row blocks where oneDNN dispatches
  // AVX-512 (tested).
  enum class WeightGrads { kLeaf, kBatch };
  static constexpr Named<WeightGrads> kWeightGradsNames[] = {{WeightGrads::kBatch, "batch"},
                                                             {WeightGrads::kLeaf, "leaf"}};
  WeightGrads weight_grads = WeightGrads::kBatch;
  // A step whose leaf gradients take more than this many bytes in all (leaves x parameters x 4)
  // sums them in leaf order as they are computed, in workers + 1 buffers, instead of keeping one
  // per leaf until the tree's root reads them all (src/train/leaf_chain.hpp): the same weights,
  // bit for bit, in bounded memory. Only in one process, with the tree reducer and at most
  // reduce::kMaxArity leaves (one flat root, whose order the chain's is); otherwise every leaf
  // keeps its buffer.
  std::size_t leaf_chain_bytes = std::size_t{256} << 20;
  // The replicas' arithmetic (nn::Precision). bf16: forward and backward-data in bf16 on a bf16
  // copy of the weights that the root writes as it updates the f32 master weights; weight
  // gradients, loss, reduction, checks and the optimizer stay f32 (docs/architecture.md).
  nn::Precision precision = nn::Precision::kF32;
  // bf16 on a CPU without AVX512_BF16 is refused (oneDNN would emulate it at several times the
  // cost of f32) unless this is set; where oneDNN has no bf16 at all (no AVX-512) it is refused
  // whatever this says.
  bool allow_emulated_bf16 = false;
  // Test hook: what oneDNN does with bf16 here (null: nn::bf16_support()).
  std::function<nn::Bf16Support()> bf16_support;
  std::size_t eval_batch = 500;  // rows per forward pass in evaluation
  // Also evaluate the test (validation) split every N steps, besides each epoch's end (0: only
  // there); Observer::on_eval gets each result.
  std::size_t eval_every = 0;
  std::string augment;  // --augment: crop:P,flip,erase:P,normalize (data/augment.hpp); "" none
  // --init-from: a safetensors file whose weights the run starts from (the CLI reads it,
  // exporting::read_weights, and calls Trainer::start_from); "" the seed's initialisation.
  std::string init_from;
  // Skip each epoch's last, partial batch, as torch_peer.py does: every step then has the same
  // shape (one set of primitives, one leaf decomposition) and throughput and accuracy compare
  // with the peer under one protocol. The skipped samples differ per epoch (reshuffled).
  bool drop_last = true;
  // Let oneDNN choose blocked layouts for convolution and pooling (false: plain nchw, to measure).
  bool blocked_layouts = true;
  // Record a span per leaf phase and root chunk for Trainer::trace() (--trace).
  bool trace = false;
  // After run(): measure the step's roofline (Summary::roofline; ~0.1 s of GEMM and sweep
  // timing on the replicas' threads).
  bool roofline = false;
  // Test hook, called on the replica's thread before each leaf's forward/backward; may throw to
  // simulate a failing worker. Not for production use.
  std::function<void(std::uint64_t step, std::size_t leaf)> leaf_hook;
  // Test hook, called on the replica's thread with each leaf's gradient (n floats) after
  // backward, before it is contributed; may change it (to inject a non-finite value). With batch
  // weight gradients the linear layers' ranges of that array are not used (the root computes
  // them from the batch's rows), so only other tensors' elements reach the weights.
  std::function<void(std::uint64_t step, std::size_t leaf, float* grad, std::size_t n)>
      gradient_hook;
};

inline constexpr std::size_t kMaxWorkers = 1024;
// PyTorch's BatchNorm defaults: the running statistics' momentum and the normalization's eps.
inline constexpr float kBatchNormMomentum = 0.1f;
inline constexpr std::size_t kMaxEvalBatch = std::size_t{1} << 16;

// Throws InputError (naming the flag, expected and found value) for a config that cannot run on
// `data` in `ranks` processes, before any work starts: nothing is sized from a config this has
// not accepted.
void validate(const TrainConfig& config, const nn::Model& model, const data::Splits& data,
              std::size_t ranks = 1);
// Whether a step of `config` (defaults resolved) sums its leaves' gradients in a LeafChain, in
// workers + 1 buffers, rather than keeping one per leaf: one process, the tree reducer, more
// leaves than workers + 1 and at most reduce::kMaxArity, more than leaf_chain_bytes in all.
bool chains_leaves(const TrainConfig& config, std::size_t parameters, std::size_t ranks);
// Throws InputError naming --model or --micro-batch when the model's leaf plans, one a worker
// (nn::ModelKind::leaf_plan_bytes: a language model's), would take more than half this machine's
// memory.
// Training only: Trainer::run checks it before its first step, the command line before any work;
// evaluation builds no leaf plan.
void check_training_memory(const TrainConfig& config, const nn::Model& model);
// The shape of one sample of `set` as a model's input: (C, H, W) for images, (1, 1, features)
// for tabular data.
nn::SampleShape input_shape(const data::Dataset& set);
// The config with its defaults filled in: workers 0 -> one per core of this machine (which never
// changes the weights), micro_batch 0 -> default_micro_batch (src/train/defaults.hpp: from the
// model, the batch and the precision only).
TrainConfig resolve_defaults(TrainConfig config, const nn::Model& model);
// Throws InputError naming `name` and the field if checkpoint `c` is not one a run of `config`
// (defaults resolved here) on `model` and `data` may continue: another model, seed, batch,
// micro-batch, partial-batch rule, training set or optimizer (the run would not be the one the
// checkpoint started). Trainer::restore checks this; a dry run can too, without a Trainer.
void check_resume(const TrainConfig& config, const nn::Model& model, const data::Splits& data,
                  const checkpoint::Checkpoint& c, const std::string& name);

// Seconds, summed over training steps. Per-replica phases are summed over replicas, so they
// compare with workers x step; `reduce_critical` and `step` are wall time.
struct TimeBreakdown {
  double step = 0;             // wall time of the training steps: the samples/s denominator
  double compute = 0;          // forward + loss + backward (the five below), over replicas
  double matmul = 0;           // oneDNN inner products and convolutions
  double attention = 0;        // attention as cohort's kernel, products and softmax
                               // (nn::PhaseTimes::attention)
  double eltwise = 0;          // ReLU, GELU, the causal softmax (nn::PhaseTimes::eltwise)
  double loss = 0;             // softmax cross-entropy
  double other = 0;            // pooling, dropout, layout reorders
  double data = 0;             // batch assembly (in the replicas)
  double reduce = 0;           // reducer work: contribute/finish calls (combines, the fused
                               // root) and root chunks run outside them (stolen, or on the
                               // parameter server's thread); the two-phase root's second phase
  double reduce_critical = 0;  // wall time from the root's first chunk's start to its last's
                               // end, plus the two-phase root's second phase
  double optimizer = 0;        // the optimizer sweep alone, summed over chunks (fused with the
                               // sum, or the two-phase root's second phase: its sum is not)
  double weight_grad = 0;      // batch weight gradients: the root's GEMMs, summed over chunks
                               // (also counted in matmul and compute, not in reduce)
  double idle = 0;             // workers x step - (compute + data + reduce): waiting, scheduling
  double exchange = 0;         // several ranks: wall time the controller spent posting, waiting
                               // for and gathering messages between ranks (within `idle`)
};

struct StepEvent {
  std::uint64_t step;  // 1-based training step count (batches consumed)
  std::size_t epoch;   // 0-based
  std::size_t step_in_epoch, steps_per_epoch;
  double loss;              // mean over the batch (non-finite when skipped)
  std::size_t samples;      // rows in this step
  double elapsed;           // training seconds so far (steps only)
  double lr;                // the learning rate this step used (or would have used, when skipped)
  double grad_norm;         // L2 norm of the mean gradient before clipping; NaN when not computed
                            // (it is with --clip-norm or --on-nonfinite skip)
  bool skipped;             // --on-nonfinite skip: nothing was applied
  std::string skip_reason;  // why, naming the leaf or tensor
  std::uint64_t skipped_total;
  std::uint64_t total_steps;  // the run's planned steps
};

struct EpochResult {
  std::size_t epoch;    // 0-based
  std::uint64_t steps;  // optimizer steps so far
  double train_loss;    // mean over the epoch's samples
  double test_loss;
  double test_accuracy;
  double samples_per_second;  // this epoch's training steps only
  double elapsed;             // training seconds so far
};

// An evaluation between steps (TrainConfig::eval_every).
struct EvalResult {
  std::uint64_t step;  // after this many steps
  double test_loss, test_accuracy;
  double elapsed;  // training seconds so far
};

// The step against its physical floor (src/train/roofline.hpp), per full-batch step.
struct Roofline {
  double leaf_gemm_seconds = 0;      // one leaf's GEMMs at oneDNN's rate, alone: its inner
                                     // products at their faster layout, its other GEMMs on the
                                     // run's own primitives (never below 0)
  double linear_layout_seconds = 0;  // what a leaf's inner products would save at their faster
                                     // weight layouts against the plans' (nn/linear_floor.hpp)
  double root_gemm_seconds = 0;      // the root's batch weight-gradient GEMMs of a step, alone
  std::size_t leaves = 0;            // a full batch's
  std::size_t replicas = 0;          // the job's replicas with leaves (at most the leaves)
  std::size_t root_threads = 0;      // the job's workers: each runs the root's chunks, also a
                                     // worker without a leaf
  // leaves x leaf_gemm_seconds / replicas + root_gemm_seconds / root_threads: the step's GEMMs at
  // oneDNN's rate, timed alone, the leaves' spread evenly over the replicas, the root's over
  // every worker
  double gemm_alone_seconds = 0;
  // The run's own time a step for the same work, spread the same way: oneDNN's matmuls and
  // cohort's attention kernel (the time table's matmul and attention over the steps after the
  // first, its weight_grad the root's); 0 where not known (several ranks: a rank's table holds
  // its own share)
  double run_gemm_seconds = 0;
  // The floor's GEMMs: gemm_alone_seconds, or the run's own where that is less (the parts were
  // timed alone in a slower stretch of the machine than the run's steps: no floor)
  double gemm_seconds = 0;
  double root_bytes = 0;     // what the root reads and writes
  double sweep_seconds = 0;  // a sweep of those bytes on the root's threads (a rank's share of
                             // them), this run
  // The run's own reducer and optimizer time a step (the time table's reduce over the steps
  // after the first, per worker); 0 where not known, as run_gemm_seconds
  double run_root_seconds = 0;
  double root_seconds = 0;        // the floor's root: sweep_seconds, or the run's own if less
  double floor_seconds = 0;       // gemm_seconds + root_seconds
  double step_seconds = 0;        // measured: the mean over the run's steps after its first
  double first_step_seconds = 0;  // the run's first step (it creates the primitives); 0 when
                                  // it was the only one (then step_seconds is that step)
  double fraction = 0;            // floor_seconds / step_seconds: 1 is the floor
};

// What holds this process's memory at the end of a run, in bytes: the f32 master weights and
// their bf16 copy (bf16 runs); the optimizer's per-parameter state; the leaves' gradient
// buffers (one per leaf of a step, or a LeafChain's workers + 1); the replicas' plans (nn::
// PlanMemory: activations and buffers, of which the logits and their gradients and the
// weights' copies in the primitives' layouts); and the process's peak resident set so far
// (getrusage), which also holds the data, the libraries and what was freed before.
struct MemoryBreakdown {
  std::size_t weights = 0, optimizer_state = 0, gradients = 0;
  std::size_t plans = 0, logits = 0, weight_copies = 0;
  std::size_t peak_rss = 0;
};

struct Summary {
  std::uint64_t steps = 0;    // training steps (batches)
  std::uint64_t updates = 0;  // optimizer updates applied (steps minus skipped)
  std::uint64_t skipped = 0;
  double epochs = 0;  // fractional when --steps stops mid-epoch
  std::size_t workers = 0, batch = 0, micro_batch = 0, parameters = 0;
  std::size_t ranks = 1;  // processes of the run (MPI ranks); `workers` is per rank
  // A language model: the positions of a sample (a window's block); its test figures are the
  // validation split's mean cross-entropy per token and next-token accuracy. 0 otherwise.
  std::size_t tokens_per_sample = 0;
  nn::Precision precision = nn::Precision::kF32;
  double bytes_sent_per_step = 0;  // by a rank to the others, mean over ranks and the run's steps
  // Training rows a replica assembled in the step before theirs, while it waited for the last
  // leaf (the rest are assembled by the replica that computes them).
  std::uint64_t rows_staged_ahead = 0;
  double samples_per_second = 0;
  double train_loss = 0;  // mean over the last epoch's samples (or the partial epoch's)
  double test_loss = 0, test_accuracy = 0;
  std::string weights_digest;
  bool stopped = false;  // an observer asked to stop (e.g. Ctrl-C)
  TimeBreakdown time;
  Roofline roofline;  // measured only with TrainConfig::roofline
  MemoryBreakdown memory;
};

// One timed span of a trace: what ran (data, stage ahead, forward, backward, combine,
// sum+optimizer, sum, optimizer, wait, step, evaluate), on which track (Trainer::trace_tracks), for
// which step and which leaf or root chunk (index_name "leaf" or "chunk", or null), in microseconds
// since the trainer was built.
struct TraceSpan {
  const char* name;
  std::uint32_t track;
  std::uint64_t step;
  const char* index_name;
  std::size_t index;
  double begin_us, end_us;
};

// Called on the thread that runs Trainer::run, between steps (the weights are then those after
// a whole step, so an observer may take a checkpoint).
class Observer {
 public:
  virtual ~Observer() = default;
  virtual void on_step(const StepEvent&) {}
  virtual void on_epoch(const EpochResult&) {}
  virtual void on_eval(const EvalResult&) {}
  // Checked after every step: true ends the run there (Summary::stopped), without evaluation.
  virtual bool stop_requested() { return false; }
};

class Trainer {
 public:
  // `data` must outlive the trainer. Validates (InputError) and builds replicas. `comm`: the
  // process group (must outlive the trainer); null: this process alone. With several ranks every
  // rank constructs a trainer from the same config and data and calls run, checkpoint, restore
  // and evaluate_test together (they exchange data); the weights are then the same on every rank,
  // and the same as one process's, bit for bit.
  Trainer(TrainConfig config, const data::Splits& data, dist::Comm* comm = nullptr);
  ~Trainer();

  // Trains from the current step (0, or the restored checkpoint's) to --steps or --epochs.
  Summary run(Observer& observer);
  // A snapshot to save; call between steps (before or after run, or from an Observer).
  checkpoint::Checkpoint checkpoint(std::string config_json) const;
  // Continues from `c`, after check_resume (InputError naming `name` and the field).
  void restore(const checkpoint::Checkpoint& c, const std::string& name);
  std::uint64_t steps_done() const;
  // Mean loss and accuracy of the current weights on the test set.
  std::pair<double, double> evaluate_test();
  const TrainConfig& config() const;  // with workers and micro_batch resolved
  // Starts from these weights instead of the seed's initialisation (--init-from): `params` in
  // the model's canonical order (model().layout().total() floats), `stats` its bn layers'
  // running statistics (stats_layout().total() floats; null without bn). Before run, at step 0;
  // the run's recipe (optimizer, schedule, the seed's data order and dropout) applies from step 1.
  void start_from(const float* params, const float* stats);
  const nn::Model& model() const;
  const float* weights() const;  // the master weights, model().layout().total() floats
  // The bn layers' running statistics, model().stats_layout().total() floats (none without bn).
  const float* running_stats() const;
  // With TrainConfig::trace: every span so far, by track then start (spans on one track nest or
  // are disjoint); the tracks' names (replica 0 .. W-1, then the root's helpers, then the
  // controller); and whether recording stopped at its cap (2^21 spans).
  std::vector<TraceSpan> trace() const;
  std::vector<std::string> trace_tracks() const;
  bool trace_truncated() const;

 private:
  struct Impl;
  std::unique_ptr<dist::Comm> local_;  // when no process group is given
  std::unique_ptr<Impl> impl_;
};

// Hex XXH3-128 of the bytes of `n` floats, then of `stats_n` running statistics (none: the digest
// of the weights alone): two runs with equal digests have equal weights and statistics.
std::string weights_digest(const float* weights, std::size_t n, const float* stats = nullptr,
                           std::size_t stats_n = 0);

}  // namespace cohort::train
