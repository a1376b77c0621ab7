// Checkpoints: a versioned binary file of sections, each with a zlib crc32, holding everything a
// run needs to continue bit for bit (weights, optimizer state, step, the sampler's inputs, the
// config).
// Written to a temporary file in the same folder, fsynced, renamed over the old one and the
// folder fsynced, so a crash at any instant leaves the previous checkpoint loadable. Read into
// memory and validated completely before anything is applied: a truncated, bit-flipped, foreign
// or future file is refused whole (InputError naming the file, section and field).
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace cohort::checkpoint {

// Version 2 added the optimizer's name, its update and skip counts and any number of state
// arrays; version 3 the bn layers' running statistics (written only when there are some: other
// files stay version 2). Version 1 files (SGD only) still load.
inline constexpr std::uint32_t kCheckpointVersion = 3;
inline constexpr std::size_t kMaxStateArrays = 4;

struct Checkpoint {
  std::string model;          // the model spec, e.g. "cnn"
  std::uint64_t step = 0;     // training steps done (batches consumed: the sampler's position)
  std::uint64_t updates = 0;  // optimizer updates applied (the schedule's and Adam's clock)
  std::uint64_t skipped = 0;  // steps skipped for a non-finite loss or gradient
  std::uint64_t seed = 0;     // initialisation, shuffling and dropout streams
  std::uint64_t batch = 0, micro_batch = 0, train_count = 0;
  bool drop_last = true;
  std::string optimizer = "sgd";  // optim::to_string(kind)
  // One sample's shape (C, H, W) as the model's input; tabular data (1, 1, features). META field
  // `input` (optional: files written before it hold Fashion-MNIST's (1, 28, 28)).
  std::array<std::uint64_t, 3> input{1, 28, 28};
  // A language model's vocabulary: its size (META field `vocab`; 0: not a language model) and,
  // for text read from input.txt, its characters in token order (META field `characters`,
  // decimal code points, sorted and distinct; empty for token arrays).
  std::uint64_t vocab = 0;
  std::vector<std::uint32_t> characters;
  std::string config_json;     // the effective configuration, for people and `cohort eval`
  std::vector<float> weights;  // the flat parameter array (layout().total() floats)
  // The optimizer's per-parameter arrays, each as large as `weights`: SGD momentum (one, or none
  // without momentum), Adam's first and second moments (two).
  std::vector<std::vector<float>> state;
  // The bn layers' running statistics (nn::Model::stats_layout(), in its order); empty for a
  // model without bn layers.
  std::vector<float> running_stats;
};

// Atomically replaces `path` with `c` (write_file_atomically: a symbolic link is written through,
// its target replaced). With keep > 1 the previous files are kept beside the file written as
// .1 ... .(keep-1), newest first. Throws OutputError naming the file and the system's reason if
// it cannot be written or rotated; the file written is then the previous one.
void save_checkpoint(const std::filesystem::path& path, const Checkpoint& c, std::size_t keep = 1);

// Reads and validates a whole checkpoint. Throws InputError (the file is never partly applied).
Checkpoint load_checkpoint(const std::filesystem::path& path);

// `--resume auto`: the newest checkpoint of `--save path` that loads. The candidates are the
// files save_checkpoint leaves, newest first: the file a write to `path` replaces
// (output_target: a link's target) and its rotated copies target.1, target.2, ... (every one
// present, whatever --keep is now). Each candidate that `load` refuses is passed over with a
// line saying why; so is each temporary file a save left when its process died before the rename
// (`<file>.tmp.<pid>`: never a candidate, and left in place). `load` is load_checkpoint unless a
// test or fuzzer injects another; only its InputError passes a file over, anything else it throws
// is rethrown. No candidate at all, or none that loads, is `checkpoint` empty: a fresh start.
struct Newest {
  std::optional<Checkpoint> checkpoint;
  std::filesystem::path file;        // the file `checkpoint` came from
  std::vector<std::string> skipped;  // "<file>: <why>", newest first
};
Newest newest_checkpoint(
    const std::filesystem::path& path,
    const std::function<Checkpoint(const std::filesystem::path&)>& load = load_checkpoint);

// The encoding alone (for tests and fuzzing): bytes <-> checkpoint, same validation.
std::vector<std::uint8_t> encode_checkpoint(const Checkpoint& c);
Checkpoint decode_checkpoint(const std::vector<std::uint8_t>& bytes, const std::string& name);

}  // namespace cohort::checkpoint
