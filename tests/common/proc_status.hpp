// A field of /proc/self/status (RssAnon, VmRSS, ...) in kB, or -1 where the kernel gives none:
// the tests that check what a step or a load adds to the process's own memory.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

namespace cohort::testing {

inline std::int64_t status_kb(const std::string& field) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1));
  return -1;
}

}  // namespace cohort::testing
