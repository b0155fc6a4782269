// Machine ceilings every benchmark compares itself with (STYLE.md,
// Benchmarks): the memory bandwidth of a large parallel memcpy and the
// FLOP rate of a large OpenBLAS sgemm, measured in the same run.
#pragma once

#include <cstddef>

namespace troupe::bench {

struct Ceilings {
  double memcpyBytesPerSecond = 0;  // bytes read + written per second
  double sgemmFlopsPerSecond = 0;
};

// Copies a `bytes` buffer into another, split over `threads` threads, a few
// times; returns the best rate counting each byte read and each byte written
// (2 * bytes per copy). Buffers are far larger than the caches by default.
double measureMemcpyBandwidth(int threads, size_t bytes = size_t{256} << 20, int repeats = 5);

// Best FLOP rate (2 n^3 per call) of cblas_sgemm on n x n matrices with
// OpenBLAS set to `threads` threads.
double measureSgemmFlops(int threads, int n = 2048, int repeats = 3);

Ceilings measureCeilings(int threads);

}  // namespace troupe::bench
