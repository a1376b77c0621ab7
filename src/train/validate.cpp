// Validation of a TrainConfig against its model and data, and its defaults (the workers from the
// machine; the leaves from the model, batch and precision only). Runs before anything is sized from
// the config (arena, replicas, buffers).
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <thread>

#include "cohort/core/error.hpp"
#include "cohort/data/augment.hpp"
#include "cohort/nn/version.hpp"
#include "cohort/optim/optimizer.hpp"
#include "cohort/reduce/reducer.hpp"
#include "cohort/train/trainer.hpp"
#include "defaults.hpp"

namespace cohort::train {

namespace {
std::size_t cores() { return std::max(1u, std::thread::hardware_concurrency()); }

// Bytes of physical memory, or 0 if unknown.
double physical_memory() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0;
}
}  // namespace

nn::SampleShape input_shape(const data::Dataset& set) {
  return {static_cast<std::int64_t>(set.channels), static_cast<std::int64_t>(set.rows),
          static_cast<std::int64_t>(set.cols)};
}

namespace {

// The refusal of a config value: "<flag>: expected <expected>, found <found>".
[[noreturn]] void bad(const std::string& flag, const std::string& expected,
                      const std::string& found) {
  throw InputError(flag + ": expected " + expected + ", found " + found);
}

}  // namespace

TrainConfig resolve_defaults(TrainConfig c, const nn::Model& model) {
  if (c.workers == 0) c.workers = cores();
  // A kind without the root's batch GEMMs: its leaves compute every weight gradient.
  if (!model.kind().batch_weight_grads()) c.weight_grads = TrainConfig::WeightGrads::kLeaf;
  // Where evaluation's memory grows with its rows (a language model's tokens), at most its cap.
  if (const std::size_t cap = model.kind().max_eval_rows(); c.eval_batch > cap)
    c.eval_batch = std::max<std::size_t>(1, cap);
  // Never from the machine, the workers or the ranks: the leaves decide the weights.
  if (c.micro_batch == 0) c.micro_batch = default_micro_batch(model, c.batch, c.precision);
  return c;
}

bool chains_leaves(const TrainConfig& c, std::size_t parameters, std::size_t ranks) {
  const std::size_t leaves = (c.batch + c.micro_batch - 1) / c.micro_batch;
  const double bytes =
      static_cast<double>(leaves) * static_cast<double>(parameters) * sizeof(float);
  return ranks == 1 && c.reducer == reduce::Strategy::kTree && leaves <= reduce::kMaxArity &&
         leaves > c.workers + 1 && bytes > static_cast<double>(c.leaf_chain_bytes);
}

void validate(const TrainConfig& config, const nn::Model& model, const data::Splits& data,
              std::size_t ranks) {
  const TrainConfig c = resolve_defaults(config, model);
  if (c.workers > kMaxWorkers)
    bad("--workers", "1 .. " + std::to_string(kMaxWorkers) + " (0: one per core)",
        std::to_string(c.workers));
  if (c.batch == 0 || c.batch > data.train.count)
    bad("--batch", "1 .. " + std::to_string(data.train.count) + " (the training set size)",
        std::to_string(c.batch));
  if (c.micro_batch > c.batch)
    bad("--micro-batch",
        "1 .. --batch (" + std::to_string(c.batch) + "), or 0 for the model's default",
        std::to_string(c.micro_batch));
  if (c.epochs == 0 && c.steps == 0) bad("--epochs", "at least 1 (or --steps N)", "0");
  if (c.eval_batch == 0 || c.eval_batch > kMaxEvalBatch)
    bad("eval batch", "1 .. " + std::to_string(kMaxEvalBatch), std::to_string(c.eval_batch));
  const bool windows = model.kind().window() > 0;  // a language model's: its data is text
  if (windows && !data.train.text())
    bad("--model", "a layer list, mlp:, cnn or resnet20 for " + data.train.describe_shape(),
        "'" + model.spec() + "', a language model (its --data is text: input.txt)");
  if (!windows && data.train.text())
    bad("--model", "gpt:LAYERS-HEADS-EMBD-BLOCK for text (" + data.train.describe_shape() + ")",
        "'" + model.spec() + "'");
  if (static_cast<std::size_t>(model.input_features()) != data.train.features())
    bad("--model",
        "an input size of " + std::to_string(data.train.features()) + " (" +
            data.train.describe_shape() + ")",
        std::to_string(model.input_features()) + " in '" + model.spec() + "'");
  if (static_cast<std::size_t>(model.num_classes()) != data.train.num_classes)
    bad("--model", "an output size of " + std::to_string(data.train.num_classes) + " (classes)",
        std::to_string(model.num_classes()) + " in '" + model.spec() + "'");
  // Every leaf of a step has a whole gradient buffer, unless a LeafChain sums them in workers +
  // 1; refuse a split that cannot fit (e.g. --micro-batch 1 at a large batch in several ranks),
  // before anything is allocated.
  const std::size_t leaves = (c.batch + c.micro_batch - 1) / c.micro_batch;
  const std::size_t buffers =
      chains_leaves(c, model.layout().total(), ranks) ? c.workers + 1 : leaves;
  const double leaf_bytes =
      static_cast<double>(buffers) * static_cast<double>(model.layout().total()) * sizeof(float);
  if (const double memory = physical_memory(); memory > 0 && leaf_bytes > memory / 2)
    bad("--micro-batch",
        "a leaf count whose gradient buffers fit in half of this machine's " +
            std::to_string(static_cast<long long>(memory / (1 << 20))) + " MiB",
        std::to_string(c.micro_batch) + ": " + std::to_string(leaves) + " leaves of --batch " +
            std::to_string(c.batch) + " need " +
            std::to_string(static_cast<long long>(leaf_bytes / (1 << 20))) +
            " MiB; raise --micro-batch");
  optim::validate(c.optimizer);
  optim::validate(c.schedule, optim::scaled_base_lr(c.schedule, c.optimizer.lr, c.batch));
  if (!(std::isfinite(c.clip_norm) && c.clip_norm >= 0))
    bad("--clip-norm", "a finite value >= 0 (0: off)", std::to_string(c.clip_norm));
  if (c.max_skips == 0) bad("--max-skips", "at least 1", "0");
  // A bn layer over a flat input normalizes each feature over the leaf's rows: one row has no
  // variance (PyTorch refuses it too: "Expected more than 1 value per channel").
  if (c.micro_batch < 2 && model.has_batchnorm())
    for (const nn::LayerSpec* l : model.batchnorm_layers())
      if (l->in.flat())
        bad("--micro-batch",
            "at least 2 for '" + model.spec() + "' (" + l->name +
                " normalizes each feature over a leaf's rows)",
            std::to_string(c.micro_batch));
  // The spec (InputError naming --augment), and images only: the Augmenter refuses any
  // augmentation of tabular data. Normalize's statistics are checked when the trainer builds it.
  if (const data::AugmentConfig augment = data::parse_augment(c.augment);
      augment.any() && data.train.tabular)
    bad("--augment", "no augmentation on tabular data (" + data.train.describe_shape() + ")",
        "'" + c.augment + "' (crop, flip, erase and normalize need images)");
  if (c.precision == nn::Precision::kBf16) {
    const nn::Bf16Support bf16 = c.bf16_support ? c.bf16_support() : nn::bf16_support();
    if (bf16 == nn::Bf16Support::kNone)
      throw InputError("--precision bf16: oneDNN " + nn::onednn_version() +
                       " has no bf16 kernels on this CPU (it dispatches " + nn::onednn_isa() +
                       "; bf16 needs AVX-512, natively AVX512_BF16), so not even "
                       "--allow-emulated-bf16 can run it. Use --precision f32");
    if (bf16 == nn::Bf16Support::kEmulated && !c.allow_emulated_bf16)
      throw InputError(
          "--precision bf16: this CPU has no AVX512_BF16 (native bf16 dot products); oneDNN would "
          "emulate bf16 at several times the cost of f32. Use --precision f32, or "
          "--allow-emulated-bf16 to run it anyway");
  }
}

void check_training_memory(const TrainConfig& config, const nn::Model& model) {
  const TrainConfig c = resolve_defaults(config, model);
  // A leaf plan can grow past memory (a language model's with block^2, its attention weights):
  // refuse a model or leaf whose plans, one a worker, cannot fit.
  const double plans =
      static_cast<double>(c.workers) * model.kind().leaf_plan_bytes(c.micro_batch, c.precision);
  if (const double memory = physical_memory(); memory > 0 && plans > memory / 2) {
    const std::string need = std::to_string(static_cast<long long>(plans / (1 << 20))) +
                             " MiB for " + std::to_string(c.workers) +
                             (c.workers == 1 ? " worker's leaf of " : " workers' leaves of ") +
                             std::to_string(c.micro_batch) +
                             (c.micro_batch == 1 ? " sample" : " samples");
    const std::string fit = "fit in half of this machine's " +
                            std::to_string(static_cast<long long>(memory / (1 << 20))) + " MiB";
    if (c.micro_batch > 1)
      bad("--micro-batch", "leaf plans that " + fit, std::to_string(c.micro_batch) + ": " + need);
    bad("--model", "a model whose leaf plans " + fit, "'" + model.spec() + "': " + need);
  }
}

void check_resume(const TrainConfig& unresolved, const nn::Model& model, const data::Splits& data,
                  const checkpoint::Checkpoint& c, const std::string& name) {
  const TrainConfig config = resolve_defaults(unresolved, model);
  auto mismatch = [&](const std::string& field, const std::string& ours,
                      const std::string& theirs) {
    throw InputError(name + ": " + field + ": this run has " + ours + ", the checkpoint " + theirs +
                     " (resume with the checkpoint's value, or start a new run)");
  };
  if (c.model != config.model) mismatch("--model", "'" + config.model + "'", "'" + c.model + "'");
  // Before the parameters: a language model's count follows from its vocabulary.
  const std::uint64_t vocab = model.kind().window() > 0 ? data.train.num_classes : 0;
  if (c.vocab != vocab)
    mismatch("vocabulary", std::to_string(vocab) + " tokens", std::to_string(c.vocab));
  if (c.characters != data.characters)
    mismatch("vocabulary's characters", "this text's", "another text's");
  if (c.weights.size() != model.layout().total())
    mismatch("parameters", std::to_string(model.layout().total()) + " floats",
             std::to_string(c.weights.size()));
  if (c.seed != config.seed)
    mismatch("--seed", std::to_string(config.seed), std::to_string(c.seed));
  if (c.batch != config.batch)
    mismatch("--batch", std::to_string(config.batch), std::to_string(c.batch));
  if (c.micro_batch != config.micro_batch)
    mismatch("--micro-batch", std::to_string(config.micro_batch), std::to_string(c.micro_batch));
  if (c.drop_last != config.drop_last)
    mismatch("--keep-last", config.drop_last ? "off" : "on", c.drop_last ? "off" : "on");
  const std::array<std::uint64_t, 3> shape{data.train.channels, data.train.rows, data.train.cols};
  auto text = [](const std::array<std::uint64_t, 3>& s) {
    return "(" + std::to_string(s[0]) + ", " + std::to_string(s[1]) + ", " + std::to_string(s[2]) +
           ")";
  };
  if (c.input != shape) mismatch("input shape (C, H, W)", text(shape), text(c.input));
  if (c.train_count != data.train.count)
    mismatch("training set size", std::to_string(data.train.count), std::to_string(c.train_count));
  if (c.optimizer != optim::to_string(config.optimizer.kind))
    mismatch("--optimizer", optim::to_string(config.optimizer.kind), c.optimizer);
  if (c.running_stats.size() != model.stats_layout().total())
    mismatch("bn running statistics", std::to_string(model.stats_layout().total()) + " floats",
             std::to_string(c.running_stats.size()));
  const std::size_t state = optim::Optimizer(config.optimizer).state_buffers();
  if (c.state.size() != state)
    mismatch("optimizer state", std::to_string(state) + " arrays",
             std::to_string(c.state.size()) + " (SGD keeps one only with --momentum > 0)");
}

}  // namespace cohort::train
