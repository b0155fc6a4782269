#include "bench/common/statistics.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace troupe::bench {

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t rank = size_t(std::ceil(q * double(v.size())));
  return v[std::min(v.size() - 1, rank > 0 ? rank - 1 : 0)];
}

benchmark::internal::Benchmark* addStatistics(benchmark::internal::Benchmark* b) {
  return b
      ->ComputeStatistics("min", [](const std::vector<double>& v) { return quantile(v, 0.0); })
      ->ComputeStatistics("p99", [](const std::vector<double>& v) { return quantile(v, 0.99); })
      ->ComputeStatistics("max", [](const std::vector<double>& v) { return quantile(v, 1.0); });
}

}  // namespace troupe::bench
