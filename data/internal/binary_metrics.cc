#include "data/internal/binary_metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "common/check.h"

namespace troupe::data::internal {

double rocAuc(std::span<const double> scores, std::span<const uint8_t> labels) {
  TROUPE_CHECK(scores.size() == labels.size(), "rocAuc: {} scores, {} labels", scores.size(),
               labels.size());
  const size_t n = scores.size();
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return scores[a] < scores[b]; });
  double positives = 0;
  double rankSum = 0;  // sum of 1-based ranks of the positives
  for (size_t i = 0; i < n;) {
    size_t j = i;
    double groupPositives = 0;
    while (j < n && scores[order[j]] == scores[order[i]]) groupPositives += labels[order[j++]] ? 1 : 0;
    const double averageRank = 0.5 * double(i + 1 + j);  // mean of i+1 .. j
    rankSum += groupPositives * averageRank;
    positives += groupPositives;
    i = j;
  }
  const double negatives = double(n) - positives;
  if (positives == 0 || negatives == 0) return std::numeric_limits<double>::quiet_NaN();
  return (rankSum - positives * (positives + 1) / 2) / (positives * negatives);
}

double logLoss(std::span<const double> p, std::span<const uint8_t> labels) {
  TROUPE_CHECK(p.size() == labels.size(), "logLoss: {} predictions, {} labels", p.size(),
               labels.size());
  if (p.empty()) return std::numeric_limits<double>::quiet_NaN();
  double sum = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double q = std::clamp(p[i], 1e-15, 1.0 - 1e-15);
    sum -= labels[i] ? std::log(q) : std::log1p(-q);
  }
  return sum / double(p.size());
}

}  // namespace troupe::data::internal
