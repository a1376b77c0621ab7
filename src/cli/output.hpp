// What the commands write: the effective config and the summary as JSON, the Chrome trace, and
// the helpers that make every output file safe (checked before any work, written atomically).
// Not the terminal output (progress.hpp) and not the metrics stream (Progress writes it).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "cohort/train/trainer.hpp"

namespace cohort::cli {

using json = nlohmann::ordered_json;

// An output file must be creatable before any work starts, so a typo costs nothing. Throws
// InputError "<flag>: expected ..., found ..." ("" is no file: nothing to check).
void check_output_path(const std::string& flag, const std::string& path);
// The folders of each output path given ("" is none), created where missing, before the command's
// work; throws OutputError.
void create_output_folders(std::initializer_list<std::string> paths);

// A file a command reads or writes, and the flag that named it. `streamed`: an output written as
// a stream (--metrics), not renamed into place; `what`: how a message names it, if not
// "<flag>'s file".
struct NamedPath {
  std::string flag, path;
  bool streamed = false;
  std::string what = "";
};

// Refuses (InputError, before any work) an output that would replace one of `inputs`, another
// output, or a file of the data folder `data_dir` (data::is_data_file; "" for none), links
// followed; and an output written whole (write_file_atomically) over a FIFO, device, socket or
// folder (config::replace_problem). Empty paths are off.
void check_outputs_apart(const std::vector<NamedPath>& outputs,
                         const std::vector<NamedPath>& inputs, const std::string& data_dir = "");

// The shortest decimal that reads back as the float (0.05f as "0.05").
std::string float_text(float f);

// The effective configuration, as printed at the start and stored in the summary and the
// checkpoint.
json config_json(const train::TrainConfig& c, const std::string& data_dir);

// --init-from DIR (a Hugging Face folder): the model its config.json describes, against the
// --model given (`given`, "" if none; its dropout and its pad= aside: config.json says neither).
// Returns the spec to train or evaluate: `given`, or the folder's. InputError naming both where
// they differ.
// A file (not a folder): `given`, unchecked. `vocab` receives the folder's vocabulary (0 for a
// file), which the data's must equal (check_folder_vocab).
std::string folder_model(const std::string& init_from, const std::string& given,
                         std::int64_t& vocab);
void check_folder_vocab(const std::string& init_from, std::int64_t vocab,
                        const data::Dataset& train);

// The --augment recorded in checkpoint `ck`'s effective config, canonical; "" if none is recorded
// (no augmentation, or a checkpoint written before --augment existed or by a library user).
// Throws InputError naming `name` if the recorded value is not a valid spec.
std::string recorded_augment(const checkpoint::Checkpoint& ck, const std::string& name);

// The effective configuration as a run and --dry-run print it: a few aligned lines, one a
// section ("  optimizer  sgd lr=0.1 momentum=0.9 ..."), each ending in a newline. The JSON
// stays in the summary file, the trace and the checkpoint.
std::string config_text(const json& config);

// The effective configuration (config_json's, as a summary, trace or checkpoint holds it) as a
// TOML job file: each value under its key in `cohort train`'s schema (model -> model.spec, data
// -> data.dir, drop_last -> run.keep_last negated, ...), less what is the machine's own
// (workers) and what follows from the rest (schedule.base_lr). A key the schema lacks stays, to
// be refused by the reader as unknown.
std::string config_toml(const json& config);

// `path`'s effective configuration: a JSON file that is a run's summary (its "config") or an
// effective configuration itself, as TOML (config_toml). Throws InputError naming `path`.
std::string effective_config_toml(const std::string& path);

// The checkpoints a run wrote, and the seconds it spent on them (copying the state out, every
// rank; encoding, writing, fsync and rename, rank 0).
struct SaveAccount {
  std::uint64_t count = 0;
  double seconds = 0;
};

// A language model's figures, added to a summary or an epoch's metrics line: tokens_per_second,
// val_loss (the validation split's mean cross-entropy per token, nats) and val_bpc (bits per
// token: per character for character-level text).
void language_model_figures(json& j, double samples_per_second, double test_loss,
                            std::size_t tokens_per_sample);

// --summary's object: the run's figures, its checkpoints and `config`.
json summary_json(const train::Summary& s, const json& config, const SaveAccount& saves = {});

// A resumed run's --metrics file, made ready to append to: of the lines a run wrote there, those
// of steps up to `step` (the checkpoint's) are kept and the later ones (written after that
// checkpoint by a run that then failed, and about to be trained again) are dropped, as is a line
// its writer left unfinished; the file is rewritten atomically only if a line goes. Returns the
// elapsed_s of the last line kept (0 if none, or no file), from which the run's own lines count
// on. Throws OutputError if the file cannot be rewritten.
double continue_metrics(const std::string& path, std::uint64_t step);

// The trainer's spans as a Chrome trace, written atomically.
void write_trace(const std::string& path, const train::Trainer& trainer, const json& config);

}  // namespace cohort::cli
