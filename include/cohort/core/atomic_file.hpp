// Writing a whole file so that a reader never sees half of it and an earlier file survives a
// crash: a temporary file in the same folder, fsync, rename. Not checkpoint rotation (that is
// checkpoint/), and not a check of the path before work starts (config::path_problem).
#pragma once

#include <filesystem>
#include <string_view>

namespace cohort {

// Replaces `path` with `bytes` through `path.tmp.<pid>`. Throws InputError naming the file and
// the system's reason; the temporary file is removed on failure.
void write_file_atomically(const std::filesystem::path& path, std::string_view bytes);

}  // namespace cohort
