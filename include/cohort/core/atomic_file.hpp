// Writing a whole file so that a reader never sees half of it and an earlier file survives a
// crash: a temporary file in the same folder, fsync, rename, fsync of the folder. Not checkpoint
// rotation (that is checkpoint/, through the before_rename hook), and not the check of a path
// before work starts (config::path_problem).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <filesystem>
#include <functional>
#include <span>
#include <string_view>

namespace cohort {

// The file a write to `path` replaces: `path` itself, or, when `path` is a symbolic link, the
// file at the end of its links (each relative link read against its own folder), whether that
// file exists yet or not. Throws OutputError naming `path` after 40 links (a loop).
//
// A link is written through, not replaced: a link named as an output is how a user points a run
// at the real file (a checkpoint on scratch storage, "latest" in a folder of runs), and replacing
// it would silently cut that tie; shells (`>`) and cp write through links too. The temporary
// file and the rotated copies go beside the target, not the link: a rename is atomic only within
// one filesystem, and the target's folder is the one that certainly holds the target.
std::filesystem::path output_target(const std::filesystem::path& path);

// Creates the folders output_target(path) is to be written in, where missing (mkdir -p): what a
// run does for each of its outputs before its work starts. Throws OutputError naming `path` and
// the system's reason.
void create_output_folders(const std::filesystem::path& path);

// Replaces output_target(path) with `bytes` through `<target>.tmp.<pid>`: write, fsync, close,
// fsync of the folder, rename over the target, fsync of the folder. `before_rename(target)`, if
// given, runs once the temporary file is whole and on disk, just before the rename (checkpoint
// rotation); what it throws is rethrown after the temporary file is removed.
//
// On any failure (create, write, fsync, close, folder fsync, rename, before_rename) the
// temporary file is removed and the target is the previous file, untouched; OutputError names
// the file and the system's reason. Only the last folder fsync fails after the rename: the
// target then holds the new file, whole, and the message says so. A folder the filesystem cannot
// sync at all (fsync gives EINVAL) is not a failure: nothing more durable is possible there.
void write_file_atomically(
    const std::filesystem::path& path, std::string_view bytes,
    const std::function<void(const std::filesystem::path& target)>& before_rename = {});
// The same for a file that is `pieces` one after another (large arrays written from where they
// are, without a copy of the whole file in memory).
void write_file_atomically(
    const std::filesystem::path& path, std::span<const std::string_view> pieces,
    const std::function<void(const std::filesystem::path& target)>& before_rename = {});

// The system calls the writer makes, one member each, so that a test can make one of them fail
// as a full disk or a failing device would (fsync_folder is the fsync of the target's folder,
// twice a write). Each returns what the system call returns and sets errno likewise.
struct FileCalls {
  std::function<ssize_t(int fd, const void* data, std::size_t size)> write;
  std::function<int(int fd)> fsync;
  std::function<int(int fd)> close;  // closes fd whatever it returns, as ::close does on Linux
  std::function<int(const char* from, const char* to)> rename;
  std::function<int(int fd)> fsync_folder;
};
FileCalls system_file_calls();  // the real ones

// Makes every later write_file_atomically use `calls`; returns the ones in use before. For tests:
// not thread-safe, and no write may be in flight.
FileCalls set_file_calls(FileCalls calls);

}  // namespace cohort
