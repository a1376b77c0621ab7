// train::tbb_version: the loaded oneTBB's version beside the one cohort was compiled against.
#include "cohort/train/version.hpp"

#include <oneapi/tbb/version.h>

namespace cohort::train {

std::string tbb_version() {
  return std::string(TBB_runtime_version()) + " (built with " TBB_VERSION_STRING ")";
}

}  // namespace cohort::train
