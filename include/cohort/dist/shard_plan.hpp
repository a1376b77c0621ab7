// Which rank computes which leaves and which rank owns which of the root's chunks, for R ranks.
// Pure arithmetic, no MPI: the same plan on every rank, and unit-testable for any R.
//
// Leaves: the global batch's L leaves in contiguous runs, rank r the r-th run; the first L % R
// ranks get one leaf more. Chunks: the root's C chunks (the reducer's grid) likewise, so a rank's
// owned chunks are one contiguous range of the flat parameter array and the weights' all-gather
// needs no packing. A rank may get no leaves (R > L) or no chunks (R > C).
#pragma once

#include <cstddef>
#include <vector>

namespace cohort::dist {

struct Range {
  std::size_t begin = 0, end = 0;
  std::size_t size() const { return end - begin; }
  bool empty() const { return begin == end; }
};

// Splits [0, n) into `parts` contiguous runs, sizes differing by at most one, larger ones first.
Range even_part(std::size_t n, std::size_t parts, std::size_t index);

class ShardPlan {
 public:
  // `leaves` >= 1, `chunks` >= 0, `ranks` >= 1.
  ShardPlan(std::size_t leaves, std::size_t chunks, std::size_t ranks);

  std::size_t ranks() const { return ranks_; }
  std::size_t leaves() const { return leaves_; }
  std::size_t chunks() const { return chunks_; }
  Range leaves_of(std::size_t rank) const { return even_part(leaves_, ranks_, rank); }
  Range chunks_of(std::size_t rank) const { return even_part(chunks_, ranks_, rank); }
  // The rank that computes `leaf` (< leaves) / owns `chunk` (< chunks).
  std::size_t leaf_rank(std::size_t leaf) const;
  std::size_t chunk_owner(std::size_t chunk) const;

 private:
  std::size_t leaves_, chunks_, ranks_;
};

// The part of [begin, end) inside `r`, or an empty range.
Range intersect(Range r, std::size_t begin, std::size_t end);

}  // namespace cohort::dist
