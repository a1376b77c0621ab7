// The export module's shared parts: format, num_batches_tracked, the metadata, and writing a
// checkpoint's export atomically (the tensors' PyTorch names come from the model's kind:
// nn/state_dict.hpp). The
// encoders are safetensors.cpp and onnx.cpp (onnx_gpt.cpp: the language model's graph).
#include "cohort/export/export.hpp"

#include <algorithm>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

#include "cohort/config/job_config.hpp"
#include "cohort/core/atomic_file.hpp"
#include "cohort/core/error.hpp"
#include "cohort/data/dataset.hpp"
#include "cohort/data/text.hpp"
#include "cohort/nn/gpt/gpt.hpp"
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

bool hugging_face_conv1d(const std::string& name) {
  for (const char* m :
       {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"})
    if (name.ends_with(m)) return true;
  return false;
}

namespace {

// A language model's weights in Hugging Face's GPT-2 layout, as a safetensors file.
std::string encode_hugging_face(const nn::Model& model, const float* params, const Metadata& m) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  std::string data;
  for (const nn::StateTensor& t : model.state_dict()) {
    if (t.name == "lm_head.weight") continue;  // tied to the token embedding: not stored
    const std::string name = t.name.substr(t.name.rfind("transformer.", 0) == 0 ? 12 : 0);
    std::vector<std::int64_t> shape = t.shape;
    const float* v = params + t.offset;
    const std::size_t begin = data.size();
    if (hugging_face_conv1d(t.name) && shape.size() == 2) {
      const auto rows = static_cast<std::size_t>(shape[0]),
                 cols = static_cast<std::size_t>(shape[1]);
      for (std::size_t c = 0; c < cols; ++c)
        for (std::size_t r = 0; r < rows; ++r)
          data.append(reinterpret_cast<const char*>(v + r * cols + c), sizeof(float));
      std::swap(shape[0], shape[1]);
    } else {
      data.append(reinterpret_cast<const char*>(v), t.numel() * sizeof(float));
    }
    header[name] = {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {begin, data.size()}}};
  }
  header["__metadata__"] = metadata_strings(m);
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string file(8, '\0');
  for (int i = 0; i < 8; ++i) file[i] = static_cast<char>((text.size() >> (8 * i)) & 0xff);
  return file + text + data;
}

}  // namespace

FolderModel read_folder_model(const fs::path& dir) {
  const fs::path path = dir / "config.json";
  const std::string name = path.string();
  const std::vector<std::uint8_t> bytes = data::read_file_bytes(path, std::uint64_t{1} << 24);
  const nlohmann::json c = nlohmann::json::parse(bytes.begin(), bytes.end(), nullptr, false);
  if (c.is_discarded() || !c.is_object())
    throw InputError(name + ": expected a JSON object (Hugging Face's GPT-2 config), found " +
                     (c.is_discarded() ? std::string("invalid JSON") : c.type_name()));
  auto number = [&](const char* key) {
    if (!c.contains(key) || !c[key].is_number_unsigned() || c[key].get<std::int64_t>() < 1)
      throw InputError(name + ": " + key + ": expected a positive integer, found " +
                       (c.contains(key) ? c[key].dump() : std::string("none")));
    return c[key].get<std::int64_t>();
  };
  FolderModel m;
  m.spec = "gpt:" + std::to_string(number("n_layer")) + "-" + std::to_string(number("n_head")) +
           "-" + std::to_string(number("n_embd")) + "-" + std::to_string(number("n_positions"));
  m.vocab = number("vocab_size");
  m.source = name;
  // GPT-2's own configs have biases and no "bias" key; nanoGPT's architecture says bias: false.
  const std::string gelu = c.value("activation_function", std::string("gelu_new"));
  if (gelu != "gelu" && gelu != "gelu_new")
    throw InputError(name + ": activation_function: expected \"gelu\" (the exact GELU) or " +
                     "\"gelu_new\" (GPT-2's tanh form), found \"" + gelu + "\"");
  if (c.contains("bias") && !c["bias"].is_boolean())
    throw InputError(name + ": bias: expected true or false, found " + c["bias"].dump());
  if (c.value("bias", true)) m.spec += ",bias";
  if (gelu == "gelu_new") m.spec += ",gelu=tanh";
  if (m.vocab % 128 != 0 && m.vocab > 1024) m.spec += ",pad=128";  // GPT-2's 50,257: 50,304
  return m;
}

fs::path weights_file(const fs::path& init_from) {
  std::error_code ec;
  return fs::is_directory(init_from, ec) ? init_from / "model.safetensors" : init_from;
}

void export_checkpoint(const fs::path& checkpoint, Format format, const fs::path& out,
                       Layout layout) {
  if (layout == Layout::kHuggingFace) {
    if (format != Format::kSafetensors)
      throw InputError("--layout hf: expected --format safetensors, found --format " +
                       std::string(to_string(format)));
    if (out.empty()) throw InputError("-o/--output: expected a folder name, found ''");
    const checkpoint::Checkpoint ck = checkpoint::load_checkpoint(checkpoint);
    const nn::Model model = checkpoint_model(ck, checkpoint.string());
    if (model.kind().window() == 0)
      throw InputError("--layout hf: expected a language model's checkpoint, found '" + ck.model +
                       "' (a classifier: its layout is the PyTorch peer's)");
    const nn::GptShape& s = nn::gpt_model(model).shape();
    std::error_code ec;
    fs::create_directories(out, ec);
    if (ec)
      throw InputError("-o/--output: cannot create the folder " + out.string() + " (" +
                       ec.message() + ")");
    const Metadata meta{.model = ck.model,
                        .step = ck.step,
                        .input = model.input(),
                        .vocab = static_cast<std::int64_t>(ck.vocab)};
    write_file_atomically(out / "model.safetensors",
                          encode_hugging_face(model, ck.weights.data(), meta));
    const nlohmann::ordered_json config{{"model_type", "gpt2"},
                                        {"n_layer", s.layers},
                                        {"n_head", s.heads},
                                        {"n_embd", s.embd},
                                        {"n_positions", s.block},
                                        {"vocab_size", s.vocab},
                                        {"bias", s.bias},
                                        {"activation_function", s.tanh_gelu ? "gelu_new" : "gelu"},
                                        {"layer_norm_epsilon", nn::GptModel::kLayerNormEpsilon}};
    write_file_atomically(out / "config.json", config.dump(1) + "\n");
    return;
  }
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
