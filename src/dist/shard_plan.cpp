// The sharding plan; see include/cohort/dist/shard_plan.hpp.
#include "cohort/dist/shard_plan.hpp"

#include <algorithm>

#include "cohort/core/error.hpp"

namespace cohort::dist {

Range even_part(std::size_t n, std::size_t parts, std::size_t index) {
  COHORT_CHECK(parts > 0 && index < parts, "even_part: index within parts");
  const std::size_t base = n / parts, extra = n % parts;
  const std::size_t begin = index * base + std::min(index, extra);
  return {begin, begin + base + (index < extra ? 1 : 0)};
}

ShardPlan::ShardPlan(std::size_t leaves, std::size_t chunks, std::size_t ranks)
    : leaves_(leaves), chunks_(chunks), ranks_(ranks) {
  COHORT_CHECK(leaves > 0 && ranks > 0, "shard plan: at least one leaf and one rank");
}

namespace {
// The index of the part of even_part(n, parts, .) that holds i.
std::size_t part_of(std::size_t i, std::size_t n, std::size_t parts) {
  COHORT_CHECK(i < n, "shard plan: index in range");
  const std::size_t base = n / parts, extra = n % parts;
  const std::size_t big = extra * (base + 1);  // elements in the larger parts
  if (i < big) return i / (base + 1);
  return extra + (i - big) / base;
}
}  // namespace

std::size_t ShardPlan::leaf_rank(std::size_t leaf) const { return part_of(leaf, leaves_, ranks_); }
std::size_t ShardPlan::chunk_owner(std::size_t chunk) const {
  return part_of(chunk, chunks_, ranks_);
}

Range intersect(Range r, std::size_t begin, std::size_t end) {
  const std::size_t b = std::max(r.begin, begin), e = std::min(r.end, end);
  return b < e ? Range{b, e} : Range{b, b};
}

}  // namespace cohort::dist
