// cohort's entry point: everything is in cli::run, which maps every failure to an exit code.
#include <iostream>

#include "cohort/cli/cli.hpp"

int main(int argc, char** argv) { return cohort::cli::run(argc, argv, std::cout, std::cerr); }
