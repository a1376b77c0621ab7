// Same-run rates for the step's roofline (train/roofline.hpp): how long oneDNN's GEMM takes for
// a given shape on this thread, in the run's precision. Measured, never assumed: the machine is
// shared and its speed drifts, so a roofline is only meaningful against this run's own rates.
#pragma once

#include <cstdint>

#include "cohort/nn/net.hpp"

namespace cohort::nn {

// The best of `reps` timings of one (m x k) * (k x n) GEMM (f32: sgemm; bf16: bf16 inputs, f32
// accumulation and output), on the calling thread, after one warm-up. The thread must run
// OpenMP with one thread (as for Net).
double gemm_seconds(std::int64_t m, std::int64_t k, std::int64_t n, Precision precision,
                    int reps = 5);

}  // namespace cohort::nn
