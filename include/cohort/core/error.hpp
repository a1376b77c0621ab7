// Error types and the always-on invariant check shared by every module.
// Not a logging facility: user-fixable problems throw InputError (exit code 2 in main), a file
// that cannot be written once the run is under way OutputError (exit code 74), broken
// invariants InternalError (exit code 1). Nothing here aborts.
#pragma once

#include <stdexcept>
#include <string>

namespace cohort {

// A problem the user can fix: a bad flag, file, config field or checkpoint. The message names
// the place (path, field, offset), what was expected and what was found.
class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A file that could not be written although its path passed the checks before work started:
// the disk is full, a write, fsync, close or rename failed. The message names the file and the
// system's reason. Not bad input (the user's flags were fine), so not an InputError.
class OutputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A broken invariant inside cohort: a bug, never the user's input.
class InternalError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

[[noreturn]] void fail_check(const char* expr, const char* file, int line, const std::string& what);

}  // namespace cohort

// Always-on invariant check (not compiled out in release). Use for internal invariants only;
// validate user input with InputError and a message that names the place.
#define COHORT_CHECK(cond, what)                                          \
  do {                                                                    \
    if (!(cond)) ::cohort::fail_check(#cond, __FILE__, __LINE__, (what)); \
  } while (0)
