// The oneTBB library this process runs on, for `cohort --version` and bug reports. The train
// module is the only one that uses oneTBB, so the question is asked here.
#pragma once

#include <string>

namespace cohort::train {

// "2021.8.0 (built with 2021.8.0)": the loaded library's TBB_runtime_version() and the headers'
// TBB_VERSION_STRING, which differ when the runtime library was upgraded under cohort.
std::string tbb_version();

}  // namespace cohort::train
