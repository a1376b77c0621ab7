// Checks on a summed gradient before the optimizer uses it: where the first non-finite value is,
// and the sum of squares for clipping by global norm. Both are defined per range, so a caller
// that splits the array into fixed chunks and adds the chunks' results in chunk order gets the
// same bits on any number of threads.
#pragma once

#include <cstddef>

namespace cohort::optim {

// Index of the first NaN or infinity in x[0, count), or count if all are finite.
std::size_t first_non_finite(const float* x, std::size_t count);

// sum of x[i]^2 in double, in a fixed order (16 interleaved partial sums added in lane order).
double sum_squares(const float* x, std::size_t count);

}  // namespace cohort::optim
