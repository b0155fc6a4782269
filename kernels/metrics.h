// Host-side evaluation metrics: exact ROC AUC and clipped log-loss. Plain
// functions over caller-owned arrays; single-threaded, no state, safe to call
// from any thread.
#pragma once

#include <cstdint>

namespace troupe::kernels {

// Probability clipping of logLoss by default.
inline constexpr double kLogLossEps = 1e-7;

// Exact area under the ROC curve of scores against binary labels (a label
// > 0.5 is positive), i.e. P(score of a random positive > score of a random
// negative) with ties counting one half. O(n log n): ranks by sorting, tied
// scores get their average rank. Returns NaN when n == 0 or when only one
// class is present (AUC is undefined then). NaN scores are not supported.
double rocAuc(const float* scores, const float* labels, int64_t n);

// Mean binary cross-entropy -(y log p + (1 - y) log(1 - p)) of predicted
// probabilities, each clipped to [eps, 1 - eps] first. Labels may be soft
// (in [0, 1]). Returns NaN when n == 0.
double logLoss(const float* probs, const float* labels, int64_t n, double eps = kLogLossEps);

}  // namespace troupe::kernels
