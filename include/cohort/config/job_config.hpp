// The job config file (TOML, read with toml++): every `cohort train` option as a key, turned
// into the flags it stands for, so that flags given on the command line, parsed after them,
// override the file. Not a second option parser: the flags' own validation still applies.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace cohort::config {

// Reads `path` and returns the equivalent flags ("--lr", "0.1", ...). Throws InputError naming
// file:line:column and the key for a syntax error, a duplicate or unknown key, a wrong type or
// an out-of-range value — before anything else runs.
std::vector<std::string> job_config_flags(const std::filesystem::path& path);

// The same for a config's text; `source` names it in messages (as the path does above).
std::vector<std::string> job_config_flags_from_text(std::string_view text,
                                                    const std::string& source);

}  // namespace cohort::config
