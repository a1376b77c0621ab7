// Job config: a fixed schema of [section] key = value, each mapped to one `cohort train` flag.
#include "cohort/config/job_config.hpp"

#include <toml++/toml.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>

#include "cohort/core/error.hpp"

namespace cohort::config {

namespace {

enum class Type { kString, kChoice, kInteger, kFloat, kBool, kDir, kFileIn, kFileOut };

struct Key {
  const char* flag;
  Type type;
  double min = 0;                         // numbers: smallest allowed value
  double max = 1e18;                      // numbers: largest allowed value
  bool min_exclusive = false;             // numbers: the value must be > min
  bool max_exclusive = false;             // numbers: the value must be < max
  std::vector<std::string> choices = {};  // kChoice: the allowed strings
};

// section.key -> flag. Ranges are the ones the flags' own checks enforce, stated here too so a
// config file's mistake is reported with its line.
const std::map<std::string, Key>& schema() {
  static const std::map<std::string, Key> keys = {
      {"data.dir", {"--data", Type::kDir}},
      {"model.spec", {"--model", Type::kString}},
      {"run.workers", {"--workers", Type::kInteger, 0, 1024}},
      {"run.batch", {"--batch", Type::kInteger, 1, 1 << 24}},
      {"run.micro_batch", {"--micro-batch", Type::kInteger, 0, 1 << 24}},
      {"run.epochs", {"--epochs", Type::kInteger, 0, 1e6}},
      {"run.steps", {"--steps", Type::kInteger, 0, 1e15}},
      {"run.seed", {"--seed", Type::kInteger, 0, 9.2e18}},
      {"run.reducer", {"--reducer", Type::kString}},
      {"run.weight_grads",
       {"--weight-grads", Type::kChoice, 0, 0, false, false, {"batch", "leaf"}}},
      {"run.keep_last", {"--keep-last", Type::kBool}},
      {"run.on_nonfinite", {"--on-nonfinite", Type::kChoice, 0, 0, false, false, {"stop", "skip"}}},
      {"run.max_skips", {"--max-skips", Type::kInteger, 1, 1e9}},
      {"optimizer.kind",
       {"--optimizer", Type::kChoice, 0, 0, false, false, {"sgd", "adam", "adamw"}}},
      {"optimizer.lr", {"--lr", Type::kFloat, 0, 1e6, true}},
      {"optimizer.momentum", {"--momentum", Type::kFloat, 0, 1, false, true}},
      {"optimizer.weight_decay", {"--weight-decay", Type::kFloat, 0, 1e6}},
      {"optimizer.nesterov", {"--nesterov", Type::kBool}},
      {"optimizer.beta1", {"--beta1", Type::kFloat, 0, 1, false, true}},
      {"optimizer.beta2", {"--beta2", Type::kFloat, 0, 1, false, true}},
      {"optimizer.eps", {"--eps", Type::kFloat, 0, 1, true}},
      {"optimizer.clip_norm", {"--clip-norm", Type::kFloat, 0, 1e9}},
      {"schedule.kind",
       {"--schedule", Type::kChoice, 0, 0, false, false, {"constant", "step", "cosine"}}},
      {"schedule.warmup_steps", {"--warmup-steps", Type::kInteger, 0, 1e12}},
      {"schedule.step_every", {"--lr-step-every", Type::kInteger, 1, 1e15}},
      {"schedule.gamma", {"--lr-gamma", Type::kFloat, 0, 1, true}},
      {"schedule.min_lr", {"--min-lr", Type::kFloat, 0, 1e6}},
      {"schedule.scale_batch", {"--lr-scale-batch", Type::kInteger, 0, 1 << 24}},
      {"output.trace", {"--trace", Type::kFileOut}},
      {"output.summary", {"--summary", Type::kFileOut}},
      {"output.metrics", {"--metrics", Type::kFileOut}},
      {"output.log_every", {"--log-every", Type::kInteger, 1, 1e9}},
      {"output.quiet", {"--quiet", Type::kBool}},
      {"checkpoint.save", {"--save", Type::kFileOut}},
      {"checkpoint.save_every", {"--save-every", Type::kInteger, 0, 1e15}},
      {"checkpoint.keep", {"--keep", Type::kInteger, 1, 1000}},
      {"checkpoint.resume", {"--resume", Type::kFileIn}},
  };
  return keys;
}

const char* type_name(Type t) {
  switch (t) {
    case Type::kString:
      return "a string";
    case Type::kChoice:
      return "one of the names";
    case Type::kInteger:
      return "an integer";
    case Type::kFloat:
      return "a number";
    case Type::kBool:
      return "true or false";
    case Type::kDir:
      return "an existing folder";
    case Type::kFileIn:
      return "an existing file";
    case Type::kFileOut:
      return "a file path in a writable folder";
  }
  return "?";
}

std::string type_of(const toml::node& node) {
  std::ostringstream s;
  s << node.type();
  return s.str();
}

std::string where(const std::string& source, const toml::source_region& at) {
  return source + ":" + std::to_string(at.begin.line) + ":" + std::to_string(at.begin.column);
}

std::string range_text(const Key& k) {
  std::ostringstream s;
  s << (k.min_exclusive ? "> " : ">= ") << k.min;
  if (k.max < 1e15) s << " and " << (k.max_exclusive ? "< " : "<= ") << k.max;
  return s.str();
}

// The parsed document's keys, checked against the schema, as flags.
std::vector<std::string> flags_of(const toml::table& root, const std::string& path) {
  std::vector<std::string> flags;
  for (const auto& [section, node] : root) {
    const auto* table = node.as_table();
    if (!table)
      throw InputError(where(path, node.source()) + ": '" + std::string(section.str()) +
                       "': expected a [section] (data, model, run, optimizer, schedule, output, "
                       "checkpoint), found a value");
    for (const auto& entry : *table) {
      // Not a structured binding: clang 14 (the fuzz preset) cannot capture one in a lambda.
      const auto& name = entry.first;
      const toml::node& value = entry.second;
      const std::string key = std::string(section.str()) + "." + std::string(name.str());
      auto it = schema().find(key);
      if (it == schema().end()) {
        std::string known;
        for (const auto& [k, unused] : schema()) known += (known.empty() ? "" : ", ") + k;
        throw InputError(where(path, value.source()) + ": unknown key '" + key +
                         "' (known keys: " + known + ")");
      }
      const Key& k = it->second;
      auto wrong = [&](const std::string& expected, const std::string& found) {
        throw InputError(where(path, value.source()) + ": " + key + ": expected " + expected +
                         ", found " + found);
      };
      switch (k.type) {
        case Type::kChoice: {
          const auto* v = value.as_string();
          std::string names;
          for (const auto& c : k.choices) names += (names.empty() ? "" : ", ") + c;
          if (!v) wrong("one of " + names, type_of(value));
          if (std::find(k.choices.begin(), k.choices.end(), v->get()) == k.choices.end())
            wrong("one of " + names, "'" + v->get() + "'");
          flags.insert(flags.end(), {k.flag, v->get()});
          break;
        }
        case Type::kString:
        case Type::kDir:
        case Type::kFileIn:
        case Type::kFileOut: {
          const auto* v = value.as_string();
          if (!v) wrong(type_name(k.type), type_of(value));
          const std::string& text = v->get();
          if (text.empty()) wrong("a non-empty string", "\"\"");
          const std::filesystem::path p(text);
          std::error_code e;
          if (k.type == Type::kDir && !std::filesystem::is_directory(p, e))
            wrong(type_name(k.type), "'" + text + "', which is not a folder");
          if (k.type == Type::kFileIn && !std::filesystem::is_regular_file(p, e))
            wrong(type_name(k.type), "'" + text + "', which is not a file");
          if (k.type == Type::kFileOut) {
            const auto dir = p.has_parent_path() ? p.parent_path() : std::filesystem::path(".");
            if (!std::filesystem::is_directory(dir, e) || ::access(dir.c_str(), W_OK) != 0)
              wrong(type_name(k.type),
                    "'" + text + "' (folder " + dir.string() + " missing or read-only)");
          }
          flags.insert(flags.end(), {k.flag, text});
          break;
        }
        case Type::kBool: {
          const auto* v = value.as_boolean();
          if (!v) wrong(type_name(k.type), type_of(value));
          flags.push_back(std::string(k.flag) + "=" + (v->get() ? "true" : "false"));
          break;
        }
        case Type::kInteger:
        case Type::kFloat: {
          double x = 0;
          std::string text;
          if (const auto* i = value.as_integer()) {
            x = static_cast<double>(i->get());
            text = std::to_string(i->get());
          } else if (const auto* f = value.as_floating_point(); f && k.type == Type::kFloat) {
            x = f->get();
            std::ostringstream s;
            s.precision(17);
            s << x;
            text = s.str();
          } else {
            wrong(type_name(k.type), type_of(value));
          }
          const bool ok = std::isfinite(x) && (k.min_exclusive ? x > k.min : x >= k.min) &&
                          (k.max_exclusive ? x < k.max : x <= k.max);
          if (!ok) wrong(type_name(k.type) + std::string(" ") + range_text(k), text);
          flags.insert(flags.end(), {k.flag, text});
          break;
        }
      }
    }
  }
  return flags;
}

}  // namespace

std::vector<std::string> job_config_flags(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw InputError(path.string() + ": --config: expected a TOML file, found " +
                     (std::filesystem::exists(path, ec) ? "something else" : "nothing"));
  try {
    return flags_of(toml::parse_file(path.string()), path.string());
  } catch (const toml::parse_error& e) {
    throw InputError(where(path.string(), e.source()) + ": " + std::string(e.description()));
  }
}

std::vector<std::string> job_config_flags_from_text(std::string_view text,
                                                    const std::string& source) {
  try {
    return flags_of(toml::parse(text, source), source);
  } catch (const toml::parse_error& e) {
    throw InputError(where(source, e.source()) + ": " + std::string(e.description()));
  }
}

}  // namespace cohort::config
