// Machine ceilings every benchmark compares itself with (STYLE.md,
// Benchmarks): the memory bandwidth of a large parallel memcpy and the
// FLOP rate of a large OpenBLAS sgemm, measured in the same run.
#pragma once

#include <cstddef>

namespace troupe::bench {

struct Ceilings {
  double memcpyBytesPerSecond = 0;  // bytes read + written per second
  double sgemmFlopsPerSecond = 0;
  double randomRowBytesPerSecond = 0;  // random 64-byte rows of a large table
};

// Copies a `bytes` buffer into another, split over `threads` threads, a few
// times; returns the best rate counting each byte read and each byte written
// (2 * bytes per copy). Buffers are far larger than the caches by default.
double measureMemcpyBandwidth(int threads, size_t bytes = size_t{256} << 20, int repeats = 5);

// Best FLOP rate (2 n^3 per call) of cblas_sgemm on n x n matrices with
// OpenBLAS set to `threads` threads.
double measureSgemmFlops(int threads, int n = 2048, int repeats = 3);

// Bytes per second read as random `rowBytes` rows (aligned) of `table`,
// prefetched ahead, split over `threads` threads: the ceiling of a gather from
// a table far larger than the caches (latency and TLB bound, not streaming).
double measureRandomRowBandwidth(const void* table, size_t tableBytes, int threads,
                                 size_t rowBytes = 64);

// memcpy and sgemm always; the random-row ceiling when a table is given.
Ceilings measureCeilings(int threads, const void* table = nullptr, size_t tableBytes = 0);

}  // namespace troupe::bench
