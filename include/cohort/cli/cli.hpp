// The `cohort` command line: argument parsing (CLI11), progress on the terminal, the summary
// table, and the JSON summary / JSON Lines metrics files. A thin shell over train::Trainer.
#pragma once

#include <iosfwd>

namespace cohort::cli {

// Exit codes (README): 0 success, 1 internal error, 2 bad input or usage, 130 stopped by
// Ctrl-C / SIGTERM (after the step in progress, and a checkpoint if --save is set).
inline constexpr int kExitOk = 0;
inline constexpr int kExitInternal = 1;
inline constexpr int kExitBadInput = 2;
inline constexpr int kExitInterrupted = 130;

// Runs `cohort <args>`; human output to `out`, errors to `err`. Never throws.
int run(int argc, const char* const* argv, std::ostream& out, std::ostream& err);

}  // namespace cohort::cli
