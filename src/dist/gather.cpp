// The pieces of an all-gather too large for one call; see include/cohort/dist/comm.hpp.
#include <algorithm>

#include "cohort/core/error.hpp"
#include "cohort/dist/comm.hpp"

namespace cohort::dist {

std::vector<GatherPiece> gather_pieces(std::span<const std::size_t> bytes, std::size_t limit) {
  COHORT_CHECK(limit > 0, "gather_pieces: a positive limit");
  std::size_t total = 0;
  for (std::size_t b : bytes) total += b;
  std::vector<GatherPiece> pieces;
  if (total <= limit) return pieces;  // every count and offset fits: one call
  std::size_t at = 0;
  for (std::size_t r = 0; r < bytes.size(); at += bytes[r++])
    for (std::size_t done = 0; done < bytes[r];) {
      const std::size_t n = std::min(limit, bytes[r] - done);
      pieces.push_back({static_cast<int>(r), at + done, n});
      done += n;
    }
  return pieces;
}

}  // namespace cohort::dist
