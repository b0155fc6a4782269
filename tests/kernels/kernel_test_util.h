// Helpers shared by the kernels tests: seeded random data and tolerant
// comparisons against double-precision references.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "common/hash.h"
#include "kernels/kernels.h"

namespace troupe::kernels::test {

inline std::unique_ptr<Kernels> makeKernels(int threads) {
  KernelOptions options;
  options.threads = threads;
  return createKernels(options);
}

inline std::vector<float> randomFloats(Rng& rng, int64_t n, double lo = -1.0, double hi = 1.0) {
  std::vector<float> v(n);
  for (auto& x : v) x = float(lo + (hi - lo) * rng.uniform());
  return v;
}

// |actual - expected| <= atol + rtol * |expected| for every element.
inline void expectClose(const std::vector<float>& actual, const std::vector<double>& expected,
                        double rtol, double atol, const char* what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  int64_t reported = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double tol = atol + rtol * std::fabs(expected[i]);
    if (!(std::fabs(double(actual[i]) - expected[i]) <= tol) && reported++ < 5) {
      ADD_FAILURE() << what << "[" << i << "] = " << actual[i] << ", expected " << expected[i]
                    << " (tolerance " << tol << ")";
    }
  }
}

inline bool bitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

}  // namespace troupe::kernels::test
