// The job config file (TOML, read with toml++) against a schema the caller gives: each key
// `section.key` stands for one flag, so the file turns into flags that the command line, parsed
// after them, overrides. Not the option table itself (cli owns `cohort train`'s) and not an
// option parser: it knows nothing of CLI11 or training, only keys, types, ranges and choices.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace cohort::config {

// How a value is read and checked. kDir, kFileIn and kFileOut are strings checked against the
// file system: an existing folder, an existing file, a file in an existing writable folder.
enum class Type { kString, kChoice, kInteger, kFloat, kBool, kDir, kFileIn, kFileOut };

// Numbers: the allowed interval. A max of kNoMax or more is not printed in messages.
inline constexpr double kNoMax = 1e18;
struct Range {
  double min = 0;
  double max = kNoMax;
  bool min_exclusive = false;  // the value must be > min
  bool max_exclusive = false;  // the value must be < max
};

// One key of a schema.
struct Key {
  std::string flag;  // "--batch"
  std::string toml;  // "run.batch"
  Type type = Type::kString;
  Range range{};  // kInteger, kFloat
  // kChoice: the accepted names. kFileIn: words that stand for themselves, not for a file
  // (--resume auto); a file of that name is written with a folder, ./auto.
  std::vector<std::string> choices = {};
  // A flag on the command line replaces this key: a file's value for it is neither checked nor
  // returned (the key is still a known one).
  bool replaced = false;
};
using Schema = std::vector<Key>;

// Reads `path` and returns the equivalent flags ("--lr", "0.1", "--nesterov=true", ...), by
// section and key in name order (each key stands once, so the order changes no value). Throws
// InputError naming file:line:column and the key for a syntax error, a duplicate or unknown key, a
// wrong type, an out-of-range value, a missing folder or file, or an output whose folder cannot
// be created or written — before anything else runs. Keys marked `replaced` are skipped.
std::vector<std::string> job_config_flags(const std::filesystem::path& path, const Schema& schema);

// The same for a config's text; `source` names it in messages (as the path does above).
std::vector<std::string> job_config_flags_from_text(std::string_view text,
                                                    const std::string& source,
                                                    const Schema& schema);

// The checks the reader applies, for a command line to apply to its own flags. Each returns ""
// when the value suits the key (a number its range, a path its type: kDir, kFileIn or
// kFileOut; other types pass), or "expected <what>, found <value>" (the caller adds the flag
// or the file position). `text` is the value as the user wrote it, for the message.
std::string number_problem(const Key& key, double value, const std::string& text);
std::string path_problem(Type type, const std::string& text);
// path_problem, but a kFileIn key's words (Key::choices) pass as they are.
std::string path_problem(const Key& key, const std::string& text);

// "" when `text` (through its links) names nothing yet or a regular file, which an output written
// whole (write_file_atomically: a new file renamed over it) may replace; else "expected ...,
// found ..." for a FIFO, device, socket or folder, which such an output would destroy.
std::string replace_problem(const std::string& text);

// Whether writing `output` (through its links, as write_file_atomically writes) would replace
// the file `other` names: the same file when both exist, else the same path.
bool same_file(const std::string& output, const std::string& other);

// "a, b or c".
std::string choices_text(const std::vector<std::string>& choices);

}  // namespace cohort::config
