// Binary-classification metrics for the generator's oracle: exact ROC AUC
// and log-loss. Private to data/ (kernels/ has the training-time versions;
// data/ does not depend on kernels/).
#pragma once

#include <cstdint>
#include <span>

namespace troupe::data::internal {

// Exact ROC AUC (Mann-Whitney U) with average ranks for tied scores. labels
// are 0 / 1. NaN when one class is absent. O(n log n).
double rocAuc(std::span<const double> scores, std::span<const uint8_t> labels);

// Mean binary cross-entropy (natural log), p clamped to [1e-15, 1 - 1e-15].
double logLoss(std::span<const double> p, std::span<const uint8_t> labels);

}  // namespace troupe::data::internal
