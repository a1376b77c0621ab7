// Temporary file, fsync, rename; see atomic_file.hpp.
#include "cohort/core/atomic_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "cohort/core/error.hpp"

namespace cohort {

namespace fs = std::filesystem;

namespace {

FileCalls& calls() {
  static FileCalls c = system_file_calls();
  return c;
}

// The temporary file until it is renamed: closed and removed on every other way out.
struct Temporary {
  explicit Temporary(fs::path p) : path(std::move(p)) {}
  ~Temporary() {
    if (fd >= 0) ::close(fd);
    if (!renamed) ::unlink(path.c_str());
  }
  Temporary(const Temporary&) = delete;
  Temporary& operator=(const Temporary&) = delete;
  const fs::path path;
  int fd = -1;
  bool renamed = false;
};

}  // namespace

FileCalls system_file_calls() {
  return {.write = [](int fd, const void* p, std::size_t n) { return ::write(fd, p, n); },
          .fsync = [](int fd) { return ::fsync(fd); },
          .close = [](int fd) { return ::close(fd); },
          .rename = [](const char* from, const char* to) { return std::rename(from, to); },
          .fsync_folder = [](int fd) { return ::fsync(fd); }};
}

FileCalls set_file_calls(FileCalls c) {
  FileCalls before = std::move(calls());
  calls() = std::move(c);
  return before;
}

fs::path output_target(const fs::path& path) {
  fs::path p = path;
  for (int links = 0;; ++links) {
    std::error_code ec;
    if (!fs::is_symlink(fs::symlink_status(p, ec))) return p;
    if (links == 40)
      throw OutputError(path.string() + ": " + std::strerror(ELOOP) + " (a loop of links?)");
    const fs::path to = fs::read_symlink(p, ec);
    if (ec)
      throw OutputError(path.string() + ": cannot read the link " + p.string() + ": " +
                        ec.message());
    p = to.is_absolute() ? to : p.parent_path() / to;
  }
}

void create_output_folders(const fs::path& path) {
  const fs::path dir = output_target(path).parent_path();
  if (dir.empty()) return;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    throw OutputError(path.string() + ": cannot create the folder " + dir.string() + ": " +
                      ec.message());
}

void write_file_atomically(const fs::path& path, std::string_view bytes,
                           const std::function<void(const fs::path& target)>& before_rename) {
  write_file_atomically(path, std::span<const std::string_view>(&bytes, 1), before_rename);
}

void write_file_atomically(const fs::path& path, std::span<const std::string_view> pieces,
                           const std::function<void(const fs::path& target)>& before_rename) {
  const fs::path target = output_target(path);
  const std::string name =
      target == path ? path.string() : path.string() + " (a link to " + target.string() + ")";
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  Temporary tmp(target.string() + ".tmp." + std::to_string(::getpid()));
  const FileCalls& sys = calls();
  auto fail = [&](const std::string& what, int error) {
    throw OutputError(name + ": " + what + ": " + std::strerror(error) + " (" + target.string() +
                      " is as it was; the temporary file is removed)");
  };
  // Syncs the folder, so that the names in it (the temporary file, then the rename) are on disk.
  auto sync_folder = [&]() -> int {
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return errno;
    const int rc = sys.fsync_folder(fd);
    const int error = rc != 0 && errno != EINVAL ? errno : 0;
    ::close(fd);
    return error;
  };
  // O_NOFOLLOW: a link planted under the temporary name is refused, never written through.
  tmp.fd = ::open(tmp.path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0666);
  if (tmp.fd < 0) {
    const int error = errno;
    fail("cannot create " + tmp.path.string(), error);
  }
  for (const std::string_view bytes : pieces) {
    const char* p = bytes.data();
    std::size_t left = bytes.size();
    while (left > 0) {
      const ssize_t n = sys.write(tmp.fd, p, left);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const int error = n < 0 ? errno : ENOSPC;  // no progress: a full disk that says nothing
        fail("cannot write " + tmp.path.string(), error);
      }
      p += n;
      left -= static_cast<std::size_t>(n);
    }
  }
  // The bytes are on disk before the name points at them.
  if (sys.fsync(tmp.fd) != 0) {
    const int error = errno;
    fail("cannot sync " + tmp.path.string(), error);
  }
  const int fd = tmp.fd;
  tmp.fd = -1;               // closed by the call below, whatever it returns
  if (sys.close(fd) != 0) {  // NFS, for one, reports a failed write-back here
    const int error = errno;
    fail("cannot close " + tmp.path.string(), error);
  }
  // A folder that cannot be synced is found while the previous file is still in place.
  if (const int error = sync_folder(); error != 0)
    fail("cannot sync the folder " + dir.string(), error);
  if (before_rename) before_rename(target);
  if (sys.rename(tmp.path.c_str(), target.c_str()) != 0) {
    const int error = errno;
    fail("cannot rename " + tmp.path.string() + " to " + target.string(), error);
  }
  tmp.renamed = true;
  if (const int error = sync_folder(); error != 0)
    throw OutputError(name + ": written, but cannot sync the folder " + dir.string() + ": " +
                      std::strerror(error) + " (" + target.string() +
                      " holds the new file, whole; a crash before the system writes the folder "
                      "may bring back the previous one)");
}

}  // namespace cohort
