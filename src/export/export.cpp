// The export module's shared parts: format, num_batches_tracked, the metadata, and writing a
// checkpoint's export atomically (the tensors' PyTorch names come from the model's kind:
// nn/state_dict.hpp). The
// encoders are safetensors.cpp and onnx.cpp (onnx_gpt.cpp: the language model's graph).
#include "cohort/export/export.hpp"

#include <algorithm>
#include <string_view>
#include <utility>

#include "cohort/config/job_config.hpp"
#include "cohort/core/atomic_file.hpp"
#include "cohort/core/error.hpp"
#include "cohort/data/text.hpp"
#include "cohort/version.hpp"

namespace cohort::exporting {

namespace fs = std::filesystem;
Format parse_format(const std::string& name) { return parse_name(kFormatNames, name, "--format"); }

const char* to_string(Format f) { return name_of(kFormatNames, f).data(); }

std::int64_t batches_tracked(const checkpoint::Checkpoint& c) {
  const auto updates = static_cast<std::int64_t>(c.updates);
  const std::uint64_t B = c.batch, N = c.train_count;
  if (B == 0 || N == 0) return updates;
  const std::uint64_t M = c.micro_batch != 0 ? std::min(c.micro_batch, B) : B;
  const auto leaves = [M](std::uint64_t rows) { return (rows + M - 1) / M; };
  const std::uint64_t per_epoch = c.drop_last ? N / B : (N + B - 1) / B;  // steps
  if (per_epoch == 0) return updates;
  // Every step has a full batch but an epoch's last one without drop_last, of N % B rows.
  const std::uint64_t last = !c.drop_last && N % B != 0 ? leaves(N % B) : leaves(B);
  // The steps of the unfinished epoch are its first `rest`, none of them its last.
  const std::uint64_t epochs = c.step / per_epoch, rest = c.step % per_epoch;
  const std::uint64_t folded = epochs * ((per_epoch - 1) * leaves(B) + last) + rest * leaves(B);
  return static_cast<std::int64_t>(folded - std::min(folded, c.skipped * leaves(B)));
}

const char* cohort_version() { return COHORT_VERSION; }

std::map<std::string, std::string> metadata_strings(const Metadata& m) {
  std::map<std::string, std::string> out{
      {"format", "cohort"},
      {"model", m.model},
      {"naming", to_string(naming_for(m.model))},
      {"input", std::to_string(m.input.C) + "," + std::to_string(m.input.H) + "," +
                    std::to_string(m.input.W)},
      {"step", std::to_string(m.step)},
      {"cohort_version", cohort_version()}};
  if (m.vocab != 0) out["vocab"] = std::to_string(m.vocab);
  if (!m.characters.empty()) out["characters"] = m.characters;
  return out;
}

namespace {

// The output's folder must be writable or creatable before anything is encoded.
void check_output(const fs::path& out) {
  if (out.empty()) throw InputError("-o/--output: expected a file name, found ''");
  for (const std::string& problem : {config::path_problem(config::Type::kFileOut, out.string()),
                                     config::replace_problem(out.string())})
    if (!problem.empty()) throw InputError("-o/--output: " + problem);
}

}  // namespace

nn::Model checkpoint_model(const checkpoint::Checkpoint& ck, const std::string& name) {
  const nn::SampleShape input{static_cast<std::int64_t>(ck.input[0]),
                              static_cast<std::int64_t>(ck.input[1]),
                              static_cast<std::int64_t>(ck.input[2])};
  nn::Model model = nn::Model::parse(ck.model, input, static_cast<std::int64_t>(ck.vocab));
  if (ck.weights.size() != model.layout().total())
    throw InputError(
        name + ": the model '" + ck.model + "' on samples " + input.str() + " has " +
        std::to_string(model.layout().total()) + " parameter floats, the checkpoint holds " +
        std::to_string(ck.weights.size()) + " (was it trained on samples of another shape?)");
  if (ck.running_stats.size() != model.stats_layout().total())
    throw InputError(name + ": the model '" + ck.model + "' on samples " + input.str() + " has " +
                     std::to_string(model.stats_layout().total()) +
                     " running-statistics floats (its bn layers), the checkpoint holds " +
                     std::to_string(ck.running_stats.size()));
  return model;
}

void export_checkpoint(const fs::path& checkpoint, Format format, const fs::path& out) {
  check_output(out);
  if (config::same_file(out.string(), checkpoint.string()))
    throw InputError("-o/--output: expected a file of its own, found '" + out.string() +
                     "', which is --checkpoint's file ('" + checkpoint.string() +
                     "') (writing it would replace that)");
  const checkpoint::Checkpoint ck = checkpoint::load_checkpoint(checkpoint);
  const nn::Model model = checkpoint_model(ck, checkpoint.string());
  const Weights w{.params = ck.weights.data(),
                  .stats = ck.running_stats.empty() ? nullptr : ck.running_stats.data(),
                  .batches_tracked = batches_tracked(ck)};
  std::string characters;
  for (const std::uint32_t c : ck.characters) characters += data::encode_utf8(c);
  const Metadata meta{.model = ck.model,
                      .step = ck.step,
                      .input = model.input(),
                      .vocab = static_cast<std::int64_t>(ck.vocab),
                      .characters = characters};
  create_output_folders(out);
  if (format == Format::kSafetensors) {
    const std::vector<std::uint8_t> bytes = encode_safetensors(model, w, meta);
    write_file_atomically(out, {reinterpret_cast<const char*>(bytes.data()), bytes.size()});
  } else {
    write_file_atomically(out, encode_onnx(model, w, meta));
  }
}

}  // namespace cohort::exporting
