// Temporary file, fsync, rename; see atomic_file.hpp.
#include "cohort/core/atomic_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "cohort/core/error.hpp"

namespace cohort {

void write_file_atomically(const std::filesystem::path& path, std::string_view bytes) {
  const std::filesystem::path tmp = path.string() + ".tmp." + std::to_string(::getpid());
  auto fail = [&](const std::string& what, int error) {
    ::unlink(tmp.c_str());
    throw InputError(path.string() + ": " + what + " " + tmp.string() + ": " +
                     std::strerror(error) + " (nothing was replaced)");
  };
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("cannot create", errno);
  const char* p = bytes.data();
  std::size_t left = bytes.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = n < 0 ? errno : ENOSPC;
      ::close(fd);
      fail("cannot write", error);
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) {
    const int error = errno;
    ::close(fd);
    fail("cannot sync", error);
  }
  if (::close(fd) != 0) fail("cannot write", errno);
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail("cannot rename", errno);
}

}  // namespace cohort
