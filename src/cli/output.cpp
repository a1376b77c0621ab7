// The JSON files of `cohort train` (effective config, summary, Chrome trace) and the checks and
// atomic writes that keep every output whole. Not the metrics stream (progress.cpp) and not
// the SVG (report/).
#include "output.hpp"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <numbers>
#include <utility>
#include <vector>

#include "cohort/config/job_config.hpp"
#include "cohort/core/atomic_file.hpp"
#include "cohort/core/error.hpp"
#include "cohort/core/names.hpp"
#include "cohort/data/augment.hpp"
#include "cohort/data/dataset.hpp"
#include "cohort/export/export.hpp"
#include "cohort/nn/gpt/gpt.hpp"
#include "cohort/nn/version.hpp"
#include "cohort/version.hpp"

namespace cohort::cli {

namespace {

namespace fs = std::filesystem;

json to_json(const train::TimeBreakdown& t) {
  return {
      {"step", t.step},           {"compute", t.compute},
      {"matmul", t.matmul},       {"attention", t.attention},
      {"eltwise", t.eltwise},     {"loss", t.loss},
      {"other", t.other},         {"data", t.data},
      {"reduce", t.reduce},       {"reduce_critical", t.reduce_critical},
      {"optimizer", t.optimizer}, {"weight_grad", t.weight_grad},
      {"idle", t.idle},           {"exchange", t.exchange},
  };
}

// A float as the shortest decimal that reads back as it (0.05f as 0.05, not as the double
// 0.05000000074505806), for the config JSON.
double shortest(float f) { return std::strtod(float_text(f).c_str(), nullptr); }

// A scalar as config_text shows it: strings without quotes, numbers as JSON writes them.
std::string scalar_text(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

}  // namespace

std::string config_text(const json& config) {
  // Top-level scalars other than model, data and kernels gather on two lines; an object (optimizer,
  // schedule) is a line of its own, led by its kind.
  std::vector<std::pair<std::string, std::string>> lines{
      {"model", ""}, {"data", ""}, {"run", ""}, {"engine", ""}};
  auto line = [&](const std::string& name) -> std::string& {
    for (auto& [n, text] : lines)
      if (n == name) return text;
    return lines.emplace_back(name, "").second;
  };
  auto add = [](std::string& text, const std::string& item) {
    text += (text.empty() ? "" : " ") + item;
  };
  for (const auto& [key, value] : config.items()) {
    if (key == "model" || key == "data" || key == "kernels") {
      line(key) = scalar_text(value);
    } else if (value.is_object()) {
      std::string& text = line(key);
      if (value.contains("kind")) add(text, scalar_text(value["kind"]));
      for (const auto& [k, v] : value.items())
        if (k != "kind") add(text, k + "=" + scalar_text(v));
    } else {
      const bool engine = key == "reducer" || key == "weight_grads" || key == "blocked_layouts" ||
                          key == "precision";
      add(line(engine ? "engine" : "run"), key + "=" + scalar_text(value));
    }
  }
  std::size_t width = 0;
  for (const auto& l : lines) width = std::max(width, l.first.size());
  std::string text;
  for (const auto& [name, items] : lines)
    if (!items.empty())
      text += "  " + name + std::string(width + 2 - name.size(), ' ') + items + "\n";
  return text;
}

std::string config_toml(const json& config) {
  const std::vector<std::string> order{"model", "data", "run", "optimizer", "schedule"};
  std::map<std::string, std::string> sections;
  auto add = [&](const std::string& section, const std::string& key, const json& value) {
    sections[section] += key + " = " + value.dump() + "\n";  // JSON's scalars are TOML's
  };
  for (const auto& [key, value] : config.items()) {
    if (value.is_object()) {
      for (const auto& [k, v] : value.items())
        if (!(key == "schedule" && k == "base_lr")) add(key, k, v);
    } else if (key == "model") {
      add("model", "spec", value);
    } else if (key == "data") {
      add("data", "dir", value);
    } else if (key == "augment") {
      add("data", "augment", value);
    } else if (key == "init_from") {
      add("model", "init_from", value);
    } else if (key == "drop_last" && value.is_boolean()) {
      add("run", "keep_last", !value.get<bool>());
    } else if (key == "blocked_layouts" && value.is_boolean()) {
      add("run", "plain_layouts", !value.get<bool>());
    } else if (key != "workers") {
      add("run", key, value);
    }
  }
  std::string text;
  for (const std::string& name : order)
    if (sections.contains(name)) text += "[" + name + "]\n" + sections[name];
  for (const auto& [name, body] : sections)
    if (std::find(order.begin(), order.end(), name) == order.end())
      text += "[" + name + "]\n" + body;
  return text;
}

std::string effective_config_toml(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError(path + ": --config: cannot open it");
  const json doc = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object())
    throw InputError(path +
                     ": --config: expected a JSON object (a run's summary or its effective "
                     "config), found " +
                     (doc.is_discarded() ? std::string("invalid JSON") : doc.type_name()));
  const json& config = doc.contains("config") ? doc["config"] : doc;
  if (!config.is_object() || !config.contains("model"))
    throw InputError(path +
                     ": --config: expected a run's summary (with its \"config\") or an "
                     "effective config (with \"model\"), found neither");
  return config_toml(config);
}

std::string float_text(float f) {
  char text[32];
  return std::string(text, std::to_chars(text, text + sizeof text, f).ptr);
}

void check_output_path(const std::string& flag, const std::string& path) {
  if (path.empty()) return;
  if (const std::string problem = config::path_problem(config::Type::kFileOut, path);
      !problem.empty())
    throw InputError(flag + ": " + problem);
}

void create_output_folders(std::initializer_list<std::string> paths) {
  for (const std::string& path : paths)
    if (!path.empty()) cohort::create_output_folders(path);
}

void check_outputs_apart(const std::vector<NamedPath>& outputs,
                         const std::vector<NamedPath>& inputs, const std::string& data_dir) {
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const NamedPath& o = outputs[i];
    if (o.path.empty()) continue;
    if (!o.streamed)
      if (const std::string problem = config::replace_problem(o.path); !problem.empty())
        throw InputError(o.flag + ": " + problem);
    auto refuse = [&](const std::string& which) {
      throw InputError(o.flag + ": expected a file of its own, found '" + o.path + "', which is " +
                       which + " (writing it would replace that)");
    };
    for (const NamedPath& in : inputs)
      if (!in.path.empty() && config::same_file(o.path, in.path))
        refuse((in.what.empty() ? in.flag + "'s file" : in.what) + " ('" + in.path + "')");
    for (std::size_t j = 0; j < i; ++j)
      if (!outputs[j].path.empty() && config::same_file(o.path, outputs[j].path))
        refuse(outputs[j].flag + "'s file too ('" + outputs[j].path + "')");
    if (!data_dir.empty()) {
      fs::path target;
      try {
        target = output_target(o.path);
      } catch (const OutputError&) {
        continue;  // check_output_path names the loop of links
      }
      if (data::is_data_file(data_dir, target)) refuse("data of --data " + data_dir);
    }
  }
}

json config_json(const train::TrainConfig& c, const std::string& data_dir) {
  const auto& o = c.optimizer;
  json optimizer{{"kind", optim::to_string(o.kind)}, {"lr", shortest(o.lr)}};
  if (o.kind == optim::Kind::kSgd)
    optimizer.update(json{{"momentum", shortest(o.momentum)}, {"nesterov", o.nesterov}});
  else
    optimizer.update(
        json{{"beta1", shortest(o.beta1)}, {"beta2", shortest(o.beta2)}, {"eps", shortest(o.eps)}});
  optimizer["weight_decay"] = shortest(o.weight_decay);
  optimizer["no_decay_norm_bias"] = c.no_decay_norm_bias;
  optimizer["clip_norm"] = shortest(c.clip_norm);
  const auto& sc = c.schedule;
  json schedule{{"kind", optim::to_string(sc.kind)},
                {"warmup_steps", sc.warmup_steps},
                {"scale_batch", sc.scale_batch},
                {"base_lr", shortest(optim::scaled_base_lr(sc, o.lr, c.batch))}};
  if (sc.kind == optim::ScheduleKind::kStep)
    schedule.update(json{{"step_every", sc.step_every}, {"gamma", shortest(sc.gamma)}});
  if (sc.kind == optim::ScheduleKind::kCosine) schedule["min_lr"] = shortest(sc.min_lr);
  using TC = train::TrainConfig;
  json config{{"model", c.model},
              {"data", data_dir},
              {"batch", c.batch},
              {"micro_batch", c.micro_batch},
              {"workers", c.workers},
              {"epochs", c.epochs},
              {"steps", c.steps},
              {"seed", c.seed},
              {"optimizer", optimizer},
              {"schedule", schedule},
              {"on_nonfinite", std::string(name_of(TC::kOnNonFiniteNames, c.on_nonfinite))},
              {"max_skips", c.max_skips},
              {"reducer", std::string(reduce::to_string(c.reducer))},
              {"weight_grads", std::string(name_of(TC::kWeightGradsNames, c.weight_grads))},
              {"precision", std::string(name_of(nn::kPrecisionNames, c.precision))},
              {"drop_last", c.drop_last},
              {"blocked_layouts", c.blocked_layouts},
              {"eval_every", c.eval_every},
              {"kernels", nn::kernel_set()}};
  // --augment in its canonical form, recorded only when set (a config without the key, as every
  // one written before it existed, has none); `cohort eval` reads it back to normalize.
  if (const std::string augment = data::to_string(data::parse_augment(c.augment)); !augment.empty())
    config["augment"] = augment;
  if (!c.init_from.empty()) config["init_from"] = c.init_from;  // recorded only when set
  return config;
}

std::string folder_model(const std::string& init_from, const std::string& given,
                         std::int64_t& vocab) {
  vocab = 0;
  std::error_code ec;
  if (init_from.empty()) return given;
  const bool folder = std::filesystem::is_directory(init_from, ec);
  if (!folder && !exporting::is_llmc_checkpoint(init_from)) return given;
  const exporting::FolderModel m =
      folder ? exporting::read_folder_model(init_from) : exporting::read_llmc_model(init_from);
  vocab = m.vocab;
  if (given.empty()) return m.spec;
  // What config.json can say: the sizes, the biases and the GELU's form (a dropout and the
  // vocabulary's padding are the run's own).
  const nn::GptShape want = nn::GptModel::parse(m.spec, m.vocab).shape();
  nn::GptShape got = nn::GptModel::parse(given, m.vocab).shape();
  got.dropout = want.dropout;
  got.vocab_multiple = want.vocab_multiple;
  if (got != want)
    throw InputError("--model: expected '" + m.spec + "' (" + m.source +
                     "'s model; a dropout and pad= may be added), found '" + given + "'");
  return given;
}

void check_folder_vocab(const std::string& init_from, std::int64_t vocab,
                        const data::Dataset& train) {
  if (vocab != 0 && static_cast<std::size_t>(vocab) != train.num_classes)
    throw InputError("--init-from " + init_from +
                     ": its model's vocabulary (config.json's vocab_size, llm.c's V) is " +
                     std::to_string(vocab) + ", the data's vocabulary (--data) " +
                     std::to_string(train.num_classes) + " tokens");
}

std::string recorded_augment(const checkpoint::Checkpoint& ck, const std::string& name) {
  const json config = json::parse(ck.config_json, nullptr, /*allow_exceptions=*/false);
  if (!config.is_object() || !config.contains("augment")) return "";
  const json& spec = config["augment"];
  if (!spec.is_string())
    throw InputError(name + ": effective config: augment: expected a string, found " + spec.dump());
  try {
    return data::to_string(data::parse_augment(spec.get<std::string>()));
  } catch (const InputError& e) {
    throw InputError(name + ": effective config: " + e.what());
  }
}

json summary_json(const train::Summary& s, const json& config, const SaveAccount& saves) {
  json j{{"steps", s.steps},
         {"updates", s.updates},
         {"skipped_steps", s.skipped},
         {"epochs", s.epochs},
         {"workers", s.workers},
         {"ranks", s.ranks},
         {"precision", std::string(name_of(nn::kPrecisionNames, s.precision))},
         {"workers_per_rank", s.workers},
         {"bytes_sent_per_step", s.bytes_sent_per_step},
         {"rows_staged_ahead", s.rows_staged_ahead},
         {"batch", s.batch},
         {"micro_batch", s.micro_batch},
         {"parameters", s.parameters},
         {"samples_per_second", s.samples_per_second},
         {"train_loss", s.train_loss},
         {"test_loss", s.test_loss},
         {"test_accuracy", s.test_accuracy},
         {"weights_digest", s.weights_digest},
         {"roofline",
          {{"leaf_gemm_seconds", s.roofline.leaf_gemm_seconds},
           {"linear_layout_seconds", s.roofline.linear_layout_seconds},
           {"root_gemm_seconds", s.roofline.root_gemm_seconds},
           {"leaves", s.roofline.leaves},
           {"replicas", s.roofline.replicas},
           {"root_threads", s.roofline.root_threads},
           {"gemm_alone_seconds", s.roofline.gemm_alone_seconds},
           {"run_gemm_seconds", s.roofline.run_gemm_seconds},
           {"gemm_seconds", s.roofline.gemm_seconds},
           {"root_bytes", s.roofline.root_bytes},
           {"sweep_seconds", s.roofline.sweep_seconds},
           {"run_root_seconds", s.roofline.run_root_seconds},
           {"root_seconds", s.roofline.root_seconds},
           {"floor_seconds", s.roofline.floor_seconds},
           {"step_seconds", s.roofline.step_seconds},
           {"first_step_seconds", s.roofline.first_step_seconds},
           {"fraction", s.roofline.fraction}}},
         {"time", to_json(s.time)},
         {"memory",
          {{"weights", s.memory.weights},
           {"optimizer_state", s.memory.optimizer_state},
           {"gradients", s.memory.gradients},
           {"plans", s.memory.plans},
           {"logits", s.memory.logits},
           {"weight_copies", s.memory.weight_copies},
           {"peak_rss", s.memory.peak_rss}}},
         {"checkpoints", {{"saves", saves.count}, {"seconds", saves.seconds}}},
         {"config", config}};
  if (s.tokens_per_sample != 0)
    language_model_figures(j, s.samples_per_second, s.test_loss, s.tokens_per_sample);
  return j;
}

void language_model_figures(json& j, double samples_per_second, double test_loss,
                            std::size_t tokens_per_sample) {
  j["tokens_per_second"] = samples_per_second * static_cast<double>(tokens_per_sample);
  j["val_loss"] = test_loss;
  j["val_bpc"] = test_loss / std::numbers::ln2;
}

// JSON object format: "X" complete events, one thread per track, named by "M" metadata events,
// which Perfetto and chrome://tracing open.
void write_trace(const std::string& path, const train::Trainer& trainer, const json& config) {
  json events = json::array();
  const auto tracks = trainer.trace_tracks();
  for (std::size_t t = 0; t < tracks.size(); ++t) {
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", 1},
                      {"tid", t},
                      {"args", {{"name", tracks[t]}}}});
    events.push_back({{"name", "thread_sort_index"},
                      {"ph", "M"},
                      {"pid", 1},
                      {"tid", t},
                      {"args", {{"sort_index", t}}}});
  }
  for (const train::TraceSpan& s : trainer.trace()) {
    json args{{"step", s.step}};
    if (s.index_name) args[s.index_name] = s.index;
    events.push_back({{"name", s.name},
                      {"ph", "X"},
                      {"pid", 1},
                      {"tid", s.track},
                      {"ts", s.begin_us},
                      {"dur", std::max(0.0, s.end_us - s.begin_us)},
                      {"args", std::move(args)}});
  }
  json trace{{"traceEvents", std::move(events)},
             {"displayTimeUnit", "ms"},
             {"otherData",
              {{"tool", "cohort " COHORT_VERSION},
               {"truncated", trainer.trace_truncated()},
               {"config", config}}}};
  write_file_atomically(path, trace.dump() + "\n");
}

double continue_metrics(const std::string& path, std::uint64_t step) {
  std::ifstream in(path);
  if (!in) return 0;  // no file yet: the run starts it
  std::string kept, line;
  bool dropped = false;
  double elapsed = 0;
  while (std::getline(in, line)) {
    // A line the writer finished ends in a newline and parses; getline cannot tell the last
    // line's newline, the parse can (a line cut short is not a whole JSON object).
    const json record = json::parse(line, nullptr, /*allow_exceptions=*/false);
    const bool ours = record.is_object() && record.contains("step") &&
                      record["step"].is_number_unsigned() &&
                      record["step"].get<std::uint64_t>() <= step;
    if (!ours) {
      dropped = true;
      continue;
    }
    kept += line + "\n";
    if (record.contains("elapsed_s") && record["elapsed_s"].is_number())
      elapsed = record["elapsed_s"].get<double>();
  }
  if (dropped) write_file_atomically(path, kept);
  return elapsed;
}

}  // namespace cohort::cli
