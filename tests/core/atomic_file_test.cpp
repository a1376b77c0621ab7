// The crash-safe writer: each system call it makes failing in turn (through set_file_calls)
// leaves the previous file whole and no temporary file; a symbolic link is written through.
#include "cohort/core/atomic_file.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cohort/core/error.hpp"

#include "../common/scratch_dir.hpp"

namespace cohort {
namespace atomic_file_test {

namespace fs = std::filesystem;

class AtomicFile : public ::testing::Test {
 protected:
  void SetUp() override {
    scratch_.emplace("cohort_atomic");
    dir_ = scratch_->path();
  }
  void TearDown() override {
    set_file_calls(system_file_calls());
    scratch_.reset();
  }
  static std::string read(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    std::ostringstream s;
    s << f.rdbuf();
    return s.str();
  }
  std::vector<std::string> names() const {
    std::vector<std::string> n;
    for (const auto& e : fs::directory_iterator(dir_)) n.push_back(e.path().filename().string());
    std::sort(n.begin(), n.end());
    return n;
  }
  // Writes `path` with the calls given; the OutputError's message, or "" if none was thrown.
  static std::string failure(const fs::path& path, const FileCalls& calls) {
    set_file_calls(calls);
    try {
      write_file_atomically(path, std::string(100000, 'n'));
    } catch (const OutputError& e) {
      set_file_calls(system_file_calls());
      return e.what();
    }
    set_file_calls(system_file_calls());
    return "";
  }
  std::optional<testing::ScratchDir> scratch_;
  fs::path dir_;
};

TEST_F(AtomicFile, ReplacesTheFileAndLeavesNoTemporary) {
  const fs::path f = dir_ / "out.json";
  write_file_atomically(f, "first");
  write_file_atomically(f, "second");
  EXPECT_EQ(read(f), "second");
  EXPECT_EQ(names(), std::vector<std::string>{"out.json"});
}

// Write (the kernel's own ENOSPC, from /dev/full), fsync, close, the folder's fsync before the
// rename, and the rename: each failing leaves the previous file and no temporary file, and the
// message names the file and the system's reason.
TEST_F(AtomicFile, EveryFailureBeforeTheRenameLeavesThePreviousFile) {
  const fs::path f = dir_ / "out.json";
  write_file_atomically(f, "previous");
  const int full = ::open("/dev/full", O_WRONLY | O_CLOEXEC);
  ASSERT_GE(full, 0) << std::strerror(errno);
  auto fails = [](int error) {
    return [error](int) {
      errno = error;
      return -1;
    };
  };
  struct Case {
    const char* name;
    FileCalls calls;
    int error;
  };
  std::vector<Case> cases(5, {"", system_file_calls(), 0});
  cases[0].name = "write";
  cases[0].calls.write = [full](int, const void* p, std::size_t n) { return ::write(full, p, n); };
  cases[0].error = ENOSPC;
  cases[1].name = "fsync";
  cases[1].calls.fsync = fails(EIO);
  cases[1].error = EIO;
  cases[2].name = "close";
  cases[2].calls.close = [](int fd) {
    ::close(fd);
    errno = EIO;
    return -1;
  };
  cases[2].error = EIO;
  cases[3].name = "folder fsync";
  cases[3].calls.fsync_folder = fails(EIO);
  cases[3].error = EIO;
  cases[4].name = "rename";
  cases[4].calls.rename = [](const char*, const char*) {
    errno = EXDEV;
    return -1;
  };
  cases[4].error = EXDEV;
  for (const Case& c : cases) {
    const std::string message = failure(f, c.calls);
    ASSERT_NE(message, "") << c.name << ": no OutputError";
    EXPECT_NE(message.find(f.string()), std::string::npos) << c.name << ": " << message;
    EXPECT_NE(message.find(std::strerror(c.error)), std::string::npos) << c.name << ": " << message;
    EXPECT_EQ(read(f), "previous") << c.name;
    EXPECT_EQ(names(), std::vector<std::string>{"out.json"}) << c.name;
  }
  ::close(full);
}

// A short write that makes no progress is a full disk too, not an endless loop.
TEST_F(AtomicFile, AWriteOfNothingIsAFullDisk) {
  const fs::path f = dir_ / "out.json";
  write_file_atomically(f, "previous");
  FileCalls calls = system_file_calls();
  calls.write = [](int, const void*, std::size_t) -> ssize_t { return 0; };
  EXPECT_NE(failure(f, calls).find(std::strerror(ENOSPC)), std::string::npos);
  EXPECT_EQ(read(f), "previous");
  EXPECT_EQ(names(), std::vector<std::string>{"out.json"});
}

// What before_rename throws (checkpoint rotation failing) reaches the caller; the temporary file
// is gone and the previous file stays.
TEST_F(AtomicFile, AFailureBeforeTheRenameRemovesTheTemporary) {
  const fs::path f = dir_ / "out.json";
  write_file_atomically(f, "previous");
  EXPECT_THROW(write_file_atomically(f, "new",
                                     [](const fs::path&) { throw OutputError("rotation failed"); }),
               OutputError);
  EXPECT_EQ(read(f), "previous");
  EXPECT_EQ(names(), std::vector<std::string>{"out.json"});
}

// The folder's fsync after the rename: the file is the new one, whole, and the failure is still
// reported; a filesystem that cannot sync folders at all (EINVAL) is no failure.
TEST_F(AtomicFile, TheFolderSyncAfterTheRenameIsReportedWithTheNewFileInPlace) {
  const fs::path f = dir_ / "out.json";
  write_file_atomically(f, "previous");
  FileCalls calls = system_file_calls();
  int folder_syncs = 0;
  calls.fsync_folder = [&folder_syncs](int fd) {
    if (++folder_syncs == 1) return ::fsync(fd);
    errno = EIO;
    return -1;
  };
  const std::string message = failure(f, calls);
  EXPECT_NE(message.find("written, but cannot sync the folder"), std::string::npos) << message;
  EXPECT_NE(message.find(std::strerror(EIO)), std::string::npos) << message;
  EXPECT_EQ(read(f), std::string(100000, 'n'));
  EXPECT_EQ(names(), std::vector<std::string>{"out.json"});
  calls.fsync_folder = [](int) {
    errno = EINVAL;
    return -1;
  };
  set_file_calls(calls);
  write_file_atomically(f, "again");
  EXPECT_EQ(read(f), "again");
}

// A link is written through: the link stays, its target (in another folder, through a relative
// link and a chain of two) is replaced, and the temporary file goes beside the target.
TEST_F(AtomicFile, ALinkIsWrittenThroughToItsTarget) {
  fs::create_directories(dir_ / "real");
  fs::create_directories(dir_ / "links");
  write_file_atomically(dir_ / "real" / "out.json", "previous");
  fs::create_symlink("../real/out.json", dir_ / "links" / "latest.json");
  fs::create_symlink(dir_ / "links" / "latest.json", dir_ / "chain.json");
  EXPECT_EQ(output_target(dir_ / "chain.json"), dir_ / "links" / "../real/out.json");
  std::string tmp_folder;
  write_file_atomically(dir_ / "chain.json", "new", [&](const fs::path& target) {
    for (const auto& e : fs::directory_iterator(target.parent_path()))
      if (e.path().filename().string().find(".tmp.") != std::string::npos)
        tmp_folder = fs::canonical(e.path().parent_path()).string();
  });
  EXPECT_EQ(tmp_folder, fs::canonical(dir_ / "real").string());
  EXPECT_TRUE(fs::is_symlink(dir_ / "chain.json"));
  EXPECT_TRUE(fs::is_symlink(dir_ / "links" / "latest.json"));
  EXPECT_EQ(read(dir_ / "real" / "out.json"), "new");
  // A dangling link: its target is created.
  fs::create_symlink("made.json", dir_ / "dangling.json");
  write_file_atomically(dir_ / "dangling.json", "made");
  EXPECT_TRUE(fs::is_symlink(dir_ / "dangling.json"));
  EXPECT_EQ(read(dir_ / "made.json"), "made");
  // A loop of links is refused, naming the path.
  fs::create_symlink("b", dir_ / "a");
  fs::create_symlink("a", dir_ / "b");
  try {
    write_file_atomically(dir_ / "a", "x");
    FAIL() << "no OutputError";
  } catch (const OutputError& e) {
    EXPECT_NE(std::string(e.what()).find((dir_ / "a").string()), std::string::npos) << e.what();
  }
}

}  // namespace atomic_file_test
}  // namespace cohort
