// ZipfSampler: draws ranks k in [1, n] with P(k) proportional to k^-s, in
// O(1) expected time and O(1) memory for any n (Hörmann & Derflinger,
// "Rejection-inversion to generate variates from monotone discrete
// distributions", 1996; the formulation of Apache Commons RNG). Exact: the
// rejection step makes the output follow the Zipf law, not an approximation
// of it. Expected draws per sample stay close to 1.
//
// Speed: the ranks 1..min(n, kTableRanks) (most of the mass) are found by a
// guide table over the same u axis instead of by exp/log, so a draw usually
// costs one uniform and two table reads; the decisions are the method's own
// (rank k owns u in [H(k - 1/2), H(k + 1/2)), accepted above H(k + 1/2) - h(k)).
//
// Immutable after construction; sample() may run on many threads at once,
// each with its own Rng.
#pragma once

#include <cstdint>
#include <vector>

#include "common/hash.h"

namespace troupe::data {

class ZipfSampler final {
 public:
  // n >= 1, exponent > 0; throws SetupError otherwise.
  ZipfSampler(uint64_t n, double exponent);

  uint64_t sample(Rng& rng) const;

  // Ranks served by the table (the rest by exp/log).
  static constexpr uint32_t kTableRanks = 2048;

  uint64_t n() const { return n_; }
  double exponent() const { return exponent_; }

 private:
  double h(double x) const;
  double hIntegral(double x) const;
  double hIntegralInverse(double x) const;

  uint64_t n_;
  double exponent_;
  double hIntegralX1_;
  double hIntegralN_;
  double s_;
  // Table part, small enough to stay in cache: for k = 1..tableRanks_,
  // bounds_[k - 1] = {H(k + 1/2), H(k + 1/2) - h(k)}; guide_[c] = the first
  // rank (0-based) whose upper end passes the start of cell c of
  // [hIntegralX1_, tableEnd_).
  struct Bounds {
    double upper;
    double accept;
  };
  uint32_t tableRanks_ = 0;
  double tableEnd_ = 0;
  std::vector<Bounds> bounds_;
  std::vector<uint16_t> guide_;
  double guideScale_ = 0;
};

}  // namespace troupe::data
