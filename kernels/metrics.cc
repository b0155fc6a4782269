#include "kernels/metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

namespace troupe::kernels {

double rocAuc(const float* scores, const float* labels, int64_t n) {
  const double kNan = std::numeric_limits<double>::quiet_NaN();
  if (n <= 0) return kNan;
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), int64_t{0});
  std::sort(order.begin(), order.end(),
            [scores](int64_t a, int64_t b) { return scores[a] < scores[b]; });
  // Sum of the (1-based, tie-averaged) ranks of the positives.
  double positiveRankSum = 0;
  int64_t positives = 0;
  for (int64_t i = 0; i < n;) {
    int64_t j = i + 1;
    while (j < n && scores[order[j]] == scores[order[i]]) ++j;
    const double averageRank = 0.5 * double(i + 1 + j);  // mean of i+1 .. j
    for (int64_t k = i; k < j; ++k) {
      if (labels[order[k]] > 0.5f) {
        positiveRankSum += averageRank;
        ++positives;
      }
    }
    i = j;
  }
  const int64_t negatives = n - positives;
  if (positives == 0 || negatives == 0) return kNan;
  const double p = double(positives);
  return (positiveRankSum - p * (p + 1) / 2) / (p * double(negatives));
}

double logLoss(const float* probs, const float* labels, int64_t n, double eps) {
  if (n <= 0) return std::numeric_limits<double>::quiet_NaN();
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double p = std::clamp(double(probs[i]), eps, 1.0 - eps);
    const double y = labels[i];
    sum -= y * std::log(p) + (1.0 - y) * std::log1p(-p);
  }
  return sum / double(n);
}

}  // namespace troupe::kernels
