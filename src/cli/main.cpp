// cohort's entry point: the process's descriptors and signals made safe, then cli::run, which maps
// every failure to an exit code.
#include <iostream>

#include "cohort/cli/cli.hpp"

int main(int argc, char** argv) {
  cohort::cli::prepare_process();  // before any file is opened and before MPI starts its threads
  return cohort::cli::run(argc, argv, std::cout, std::cerr);
}
