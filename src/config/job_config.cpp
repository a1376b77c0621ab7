// Job config: a TOML file of [section] key = value read against the caller's schema, each key
// turned into the flag it stands for. The schema's rows live with the command that owns them
// (cli/options.cpp for `cohort train`); this file knows only how to read and check them.
#include "cohort/config/job_config.hpp"

#include <toml++/toml.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <sstream>

#include "cohort/core/atomic_file.hpp"
#include "cohort/core/error.hpp"

namespace cohort::config {

namespace {

namespace fs = std::filesystem;

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

// The shortest decimal that reads back as `x` (16777216, 1e+06, 0.999).
std::string number_text(double x) {
  char text[32];
  return std::string(text, std::to_chars(text, text + sizeof text, x).ptr);
}

std::string range_text(const Range& r) {
  std::string s = (r.min_exclusive ? "> " : ">= ") + number_text(r.min);
  if (r.max < kNoMax)
    s += " and " + std::string(r.max_exclusive ? "< " : "<= ") + number_text(r.max);
  return s;
}

std::string type_of(const toml::node& node) {
  std::ostringstream s;
  s << node.type();
  return s.str();
}

std::string where(const std::string& source, const toml::source_region& at) {
  return source + ":" + std::to_string(at.begin.line) + ":" + std::to_string(at.begin.column);
}

// "data, model, run": the schema's sections in first-seen order, for the message about a value
// outside any section.
std::string sections_text(const Schema& schema) {
  std::vector<std::string> sections;
  for (const Key& k : schema) {
    const std::string section = k.toml.substr(0, k.toml.find('.'));
    if (std::find(sections.begin(), sections.end(), section) == sections.end())
      sections.push_back(section);
  }
  std::string text;
  for (const auto& s : sections) text += (text.empty() ? "" : ", ") + s;
  return text;
}

// Appends one value's flags; returns "" or what is wrong with it ("expected ..., found ...").
std::string add_flags(const Key& k, const toml::node& value, std::vector<std::string>& flags) {
  const std::string expected_type = "expected " + std::string(type_name(k.type)) + ", found ";
  switch (k.type) {
    case Type::kChoice: {
      const auto* v = value.as_string();
      if (!v) return "expected one of " + choices_text(k.choices) + ", found " + type_of(value);
      if (std::find(k.choices.begin(), k.choices.end(), v->get()) == k.choices.end())
        return "expected " + choices_text(k.choices) + ", found '" + v->get() + "'";
      flags.insert(flags.end(), {k.flag, v->get()});
      return "";
    }
    case Type::kString:
    case Type::kDir:
    case Type::kFileIn:
    case Type::kFileOut: {
      const auto* v = value.as_string();
      if (!v) return expected_type + type_of(value);
      if (v->get().empty()) return "expected a non-empty string, found \"\"";
      if (std::string problem = path_problem(k, v->get()); !problem.empty()) return problem;
      flags.insert(flags.end(), {k.flag, v->get()});
      return "";
    }
    case Type::kBool: {
      const auto* v = value.as_boolean();
      if (!v) return expected_type + type_of(value);
      flags.push_back(k.flag + "=" + (v->get() ? "true" : "false"));
      return "";
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
        return expected_type + type_of(value);
      }
      if (std::string problem = number_problem(k, x, text); !problem.empty()) return problem;
      flags.insert(flags.end(), {k.flag, text});
      return "";
    }
  }
  return "";
}

// The parsed document's keys, checked against the schema, as flags.
std::vector<std::string> flags_of(const toml::table& root, const std::string& path,
                                  const Schema& schema) {
  std::vector<std::string> flags;
  for (const auto& [section, node] : root) {
    const auto* table = node.as_table();
    if (!table)
      throw InputError(where(path, node.source()) + ": '" + std::string(section.str()) +
                       "': expected a [section] (" + sections_text(schema) + "), found a value");
    for (const auto& entry : *table) {
      // Not a structured binding: clang 14 (the fuzz preset) cannot capture one in a lambda.
      const auto& name = entry.first;
      const toml::node& value = entry.second;
      const std::string key = std::string(section.str()) + "." + std::string(name.str());
      const auto it =
          std::find_if(schema.begin(), schema.end(), [&](const Key& k) { return k.toml == key; });
      if (it == schema.end()) {
        std::string known;
        for (const Key& k : schema) known += (known.empty() ? "" : ", ") + k.toml;
        throw InputError(where(path, value.source()) + ": unknown key '" + key +
                         "' (known keys: " + known + ")");
      }
      if (it->replaced) continue;
      if (const std::string problem = add_flags(*it, value, flags); !problem.empty())
        throw InputError(where(path, value.source()) + ": " + key + ": " + problem);
    }
  }
  return flags;
}

}  // namespace

std::string choices_text(const std::vector<std::string>& choices) {
  std::string text;
  for (std::size_t i = 0; i < choices.size(); ++i) {
    if (i > 0) text += i + 1 == choices.size() ? " or " : ", ";
    text += choices[i];
  }
  return text;
}

std::string number_problem(const Key& k, double x, const std::string& text) {
  const Range& r = k.range;
  const bool ok = std::isfinite(x) && (r.min_exclusive ? x > r.min : x >= r.min) &&
                  (r.max_exclusive ? x < r.max : x <= r.max);
  if (ok) return "";
  return "expected " + std::string(type_name(k.type)) + " " + range_text(r) + ", found " + text;
}

std::string path_problem(Type type, const std::string& text) {
  const fs::path p(text);
  std::error_code e;
  const std::string expected = "expected " + std::string(type_name(type)) + ", found '" + text;
  switch (type) {
    case Type::kDir:
      return fs::is_directory(p, e) ? "" : expected + "', which is not a folder";
    case Type::kFileIn:
      return fs::is_regular_file(p, e) ? "" : expected + "', which is not a file";
    case Type::kFileOut: {
      if (fs::is_directory(p, e)) return expected + "', which is a directory";
      fs::path target;  // a link is written through: its target's folder is the one written
      try {
        target = output_target(p);
      } catch (const OutputError& error) {
        return expected + "' (" + error.what() + ")";
      }
      // The nearest folder that exists: the folders below it are created before the first write
      // (create_output_folders), so it must be a writable folder.
      fs::path dir = target.parent_path();
      while (!dir.empty() && !fs::exists(fs::symlink_status(dir, e)) && dir != dir.parent_path())
        dir = dir.parent_path();
      if (dir.empty()) dir = ".";
      if (!fs::is_directory(dir, e)) return expected + "' (" + dir.string() + " is not a folder)";
      if (::access(dir.c_str(), W_OK) != 0)
        return expected + "' (folder " + dir.string() + " read-only)";
      return "";
    }
    default:
      return "";
  }
}

std::string replace_problem(const std::string& text) {
  fs::path target;
  try {
    target = output_target(text);
  } catch (const OutputError& error) {
    return "expected a file, found '" + text + "' (" + error.what() + ")";
  }
  std::error_code e;
  const fs::file_status st = fs::status(target, e);
  if (e || !fs::exists(st) || fs::is_regular_file(st)) return "";
  return "expected a regular file to replace, found '" + text + "', which is " +
         (fs::is_directory(st) ? "a folder"
          : fs::is_fifo(st)    ? "a FIFO"
          : fs::is_socket(st)  ? "a socket"
                               : "a device") +
         " (the output is written to a new file renamed over it)";
}

bool same_file(const std::string& output, const std::string& other) {
  fs::path target;
  try {
    target = output_target(output);
  } catch (const OutputError&) {
    return false;
  }
  std::error_code e1, e2;
  if (fs::exists(target, e1) && fs::exists(other, e2)) {
    const bool same = fs::equivalent(target, other, e1);
    return same && !e1;
  }
  const fs::path a = fs::weakly_canonical(fs::absolute(target, e1), e1);
  if (e1) return false;
  const fs::path b = fs::weakly_canonical(fs::absolute(other, e2), e2);
  return !e2 && a == b;
}

std::string path_problem(const Key& key, const std::string& text) {
  if (key.type != Type::kFileIn || key.choices.empty()) return path_problem(key.type, text);
  if (std::find(key.choices.begin(), key.choices.end(), text) != key.choices.end()) return "";
  const std::string problem = path_problem(key.type, text);
  return problem.empty() ? ""
                         : "expected an existing file or " + choices_text(key.choices) +
                               ", found '" + text + "', which is not a file";
}

std::vector<std::string> job_config_flags(const fs::path& path, const Schema& schema) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec))
    throw InputError(path.string() + ": --config: expected a TOML file, found " +
                     (fs::exists(path, ec) ? "something else" : "nothing"));
  try {
    return flags_of(toml::parse_file(path.string()), path.string(), schema);
  } catch (const toml::parse_error& e) {
    throw InputError(where(path.string(), e.source()) + ": " + std::string(e.description()));
  }
}

std::vector<std::string> job_config_flags_from_text(std::string_view text,
                                                    const std::string& source,
                                                    const Schema& schema) {
  try {
    return flags_of(toml::parse(text, source), source, schema);
  } catch (const toml::parse_error& e) {
    throw InputError(where(source, e.source()) + ": " + std::string(e.description()));
  }
}

}  // namespace cohort::config
