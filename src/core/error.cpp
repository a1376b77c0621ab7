// The out-of-line half of COHORT_CHECK: formats file:line and throws InternalError.
#include "cohort/core/error.hpp"

namespace cohort {

void fail_check(const char* expr, const char* file, int line, const std::string& what) {
  throw InternalError(std::string(file) + ":" + std::to_string(line) + ": check failed: " + expr +
                      (what.empty() ? "" : " (" + what + ")"));
}

}  // namespace cohort
