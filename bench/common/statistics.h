// Repetition statistics shared by the Google Benchmark binaries: min, median,
// p99 and max over repetitions (mean and stddev stay on as well).
#pragma once

#include <benchmark/benchmark.h>

namespace troupe::bench {

// Adds min / median / p99 / max to a registered benchmark.
benchmark::internal::Benchmark* addStatistics(benchmark::internal::Benchmark* b);

// The q-quantile (0 <= q <= 1, nearest rank) of a sample.
double quantile(std::vector<double> v, double q);

}  // namespace troupe::bench
