#include "data/zipf.h"

#include <algorithm>
#include <cmath>

#include "common/check.h"

namespace troupe::data {
namespace {

// log(1 + x) / x, accurate near 0.
double helper1(double x) {
  return std::abs(x) > 1e-8 ? std::log1p(x) / x : 1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x));
}

// (exp(x) - 1) / x, accurate near 0.
double helper2(double x) {
  return std::abs(x) > 1e-8 ? std::expm1(x) / x : 1.0 + x * 0.5 * (1.0 + x / 3.0 * (1.0 + 0.25 * x));
}

}  // namespace

ZipfSampler::ZipfSampler(uint64_t n, double exponent) : n_(n), exponent_(exponent) {
  if (n < 1) TROUPE_SETUP_ERROR("ZipfSampler: n must be >= 1, got {}", n);
  if (!(exponent > 0.0) || !std::isfinite(exponent)) {
    TROUPE_SETUP_ERROR("ZipfSampler: exponent must be > 0, got {}", exponent);
  }
  hIntegralX1_ = hIntegral(1.5) - 1.0;
  hIntegralN_ = hIntegral(double(n) + 0.5);
  s_ = 2.0 - hIntegralInverse(hIntegral(2.5) - h(2.0));

  tableRanks_ = uint32_t(std::min<uint64_t>(n, kTableRanks));
  static_assert(kTableRanks <= 65536, "guide_ holds 16-bit ranks");
  bounds_.resize(tableRanks_);
  for (uint32_t k = 1; k <= tableRanks_; ++k) {
    const double upper = hIntegral(double(k) + 0.5);
    bounds_[k - 1] = {upper, upper - h(double(k))};
  }
  tableEnd_ = bounds_.back().upper;
  const size_t cells = size_t(tableRanks_) * 4;
  guide_.resize(cells + 1);
  guideScale_ = double(cells) / (tableEnd_ - hIntegralX1_);
  uint32_t k = 0;  // 0-based
  for (size_t c = 0; c <= cells; ++c) {
    const double start = hIntegralX1_ + double(c) / guideScale_;
    while (k + 1 < tableRanks_ && bounds_[k].upper <= start) ++k;
    guide_[c] = uint16_t(k);
  }
}

// h(x) = x^-s, the continuous hat.
double ZipfSampler::h(double x) const { return std::exp(-exponent_ * std::log(x)); }

// An antiderivative of h: (x^(1-s) - 1) / (1 - s), or log(x) for s = 1.
double ZipfSampler::hIntegral(double x) const {
  const double logX = std::log(x);
  return helper2((1.0 - exponent_) * logX) * logX;
}

double ZipfSampler::hIntegralInverse(double x) const {
  double t = x * (1.0 - exponent_);
  if (t < -1.0) t = -1.0;  // guards rounding at the upper end
  return std::exp(helper1(t) * x);
}

uint64_t ZipfSampler::sample(Rng& rng) const {
  for (;;) {
    const double u = hIntegralN_ + rng.uniform() * (hIntegralX1_ - hIntegralN_);
    if (u < tableEnd_) {
      // One cell back guards against rounding in the cell index.
      size_t cell = std::min<size_t>(size_t(std::max((u - hIntegralX1_) * guideScale_, 0.0)),
                                     guide_.size() - 1);
      if (cell > 0) --cell;
      uint32_t k = guide_[cell];
      while (k + 1 < tableRanks_ && bounds_[k].upper <= u) ++k;
      if (u >= bounds_[k].accept) return k + 1;
      continue;
    }
    const double x = hIntegralInverse(u);
    double kd = std::floor(x + 0.5);
    if (kd < 1.0) kd = 1.0;
    if (kd > double(n_)) kd = double(n_);
    const uint64_t k = uint64_t(kd);
    // Accept at once inside the squeeze, else by the exact test.
    if (kd - x <= s_ || u >= hIntegral(kd + 0.5) - h(kd)) return k;
  }
}

}  // namespace troupe::data
