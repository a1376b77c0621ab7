// Several ranks of one `cohort train` agree before any work. Each rank states what it found —
// its failure, if any of its checks threw, and digests of what it would train on — and one
// collective gives every rank every statement, so a failure or a difference on any rank ends
// every rank with exit 2 as soon as the slowest rank's checks are done, and rank 0 says why, once.
// Not the checks themselves (train_command.cpp) and not the transport (dist::Comm).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cohort/checkpoint/checkpoint.hpp"
#include "cohort/core/error.hpp"
#include "cohort/data/dataset.hpp"
#include "cohort/dist/comm.hpp"

namespace cohort::cli {

// Something every rank must have alike: what it is (for the message), a digest of it and how it
// is shown when ranks differ. A JSON object's text is compared key by key.
struct Fact {
  std::string what;  // e.g. "the training split (--data)"
  bool json_object = false;
  bool known = false;  // false: this rank failed before it could tell
  std::uint64_t digest = 0;
  std::string shown;  // e.g. "512 samples of 28x28 images"
};

// What one rank brings to an agreement. Every rank brings the same list of facts (the same
// `what`s in the same order).
struct Stand {
  std::optional<std::string> problem;  // this rank's checks failed: why
  std::vector<Fact> facts;             // at most kMaxFacts
};
inline constexpr std::size_t kMaxFacts = 8;

// The agreement's refusal, on every rank: the lines rank 0 prints, each after "cohort: error: ".
class JobInputError : public InputError {
 public:
  explicit JobInputError(std::vector<std::string> lines);
  const std::vector<std::string>& lines() const { return lines_; }

 private:
  std::vector<std::string> lines_;
};

// Every rank calls it at the same point with its stand: one collective (fixed-size records), and
// a second one only when some rank failed or some known fact differs (the texts). Returns when
// every rank's checks passed and every fact is the same wherever it is known. Otherwise throws
// JobInputError on every rank with the same lines: each fact that differs, naming the ranks and
// what each has, then each distinct problem once, naming the ranks that had it unless every rank
// did.
void agree(dist::Comm& comm, const Stand& mine);

// The exception being handled as a rank's problem: an InputError's message as it is, any other
// as "internal error: ..." (e.g. std::bad_alloc while loading). Call from a catch block.
std::string current_problem();

// 64-bit digests (XXH3) of what facts compare.
std::uint64_t digest_of(std::string_view bytes);
std::uint64_t digest_of(const data::Dataset& set);  // shape, classes, every sample, label, token
std::uint64_t digest_of(const checkpoint::Checkpoint& c);  // every field

}  // namespace cohort::cli
