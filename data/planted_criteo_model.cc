#include "data/planted_criteo_model.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "common/check.h"

namespace troupe::data {
namespace {

constexpr uint64_t kTableSalt = 0x7461626c65ULL;  // "table"
constexpr uint64_t kIntSalt = 0x696e74636f6cULL;  // "intcol"
constexpr uint64_t kPairSalt = 0x7061697273ULL;   // "pairs"
constexpr uint64_t kCalibrationSalt = 0x63616c6962ULL;  // "calib"
// Rarer ranks are recomputed from the hash: about as fast as a cache miss.
constexpr uint32_t kCachedRanks = 1024;
constexpr int kCalibrationRows = 32768;
constexpr int64_t kMaxInt = int64_t(1) << 40;  // caps the heavy tails

double denseTerm(int64_t x) { return std::log1p(double(std::max<int64_t>(x, 0))); }

int hexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

void validate(const SyntheticCriteoOptions& o) {
  if (o.rows < 1) TROUPE_SETUP_ERROR("synthetic criteo: rows must be >= 1, got {}", o.rows);
  if (o.testRows < 0) TROUPE_SETUP_ERROR("synthetic criteo: test_rows must be >= 0, got {}", o.testRows);
  if (o.tables < 1 || o.tables > 4096) {
    TROUPE_SETUP_ERROR("synthetic criteo: tables must be in 1..4096, got {}", o.tables);
  }
  if (o.minVocab < 1 || o.maxVocab < o.minVocab || o.maxVocab > int64_t(UINT32_MAX)) {
    TROUPE_SETUP_ERROR(
        "synthetic criteo: need 1 <= min_vocab <= max_vocab <= 4294967295, got min_vocab {} "
        "max_vocab {}",
        o.minVocab, o.maxVocab);
  }
  if (!(o.zipf > 0.0) || !std::isfinite(o.zipf)) {
    TROUPE_SETUP_ERROR("synthetic criteo: zipf exponent must be > 0, got {}", o.zipf);
  }
  if (o.factorDim < 0 || o.factorDim > 64) {
    TROUPE_SETUP_ERROR("synthetic criteo: factor_dim must be in 0..64, got {}", o.factorDim);
  }
  if (!(o.ctr > 0.0 && o.ctr < 1.0)) {
    TROUPE_SETUP_ERROR("synthetic criteo: ctr must be in (0, 1), got {}", o.ctr);
  }
  if (!(o.weightScale >= 0 && o.factorScale >= 0 && o.denseScale >= 0 && o.rareRank > 0 &&
        o.rareShrink >= 0)) {
    TROUPE_SETUP_ERROR(
        "synthetic criteo: bad model scales (weight {}, factor {}, dense {}, rare rank {}, "
        "rare shrink {})",
        o.weightScale, o.factorScale, o.denseScale, o.rareRank, o.rareShrink);
  }
  if (o.blockRows < 1) TROUPE_SETUP_ERROR("synthetic criteo: blockRows must be >= 1, got {}", o.blockRows);
}

}  // namespace

PlantedCriteoModel::PlantedCriteoModel(const SyntheticCriteoOptions& options) : options_(options) {
  validate(options_);
  const int T = options_.tables;
  const double logMin = std::log(double(options_.minVocab));
  const double logMax = std::log(double(options_.maxVocab));
  tables_.resize(size_t(T));
  for (int t = 0; t < T; ++t) {
    Table& table = tables_[size_t(t)];
    const double frac = T == 1 ? 1.0 : double(t) / double(T - 1);
    table.vocab = uint64_t(std::clamp<double>(std::llround(std::exp(logMin + (logMax - logMin) * frac)),
                                              double(options_.minVocab), double(options_.maxVocab)));
    Rng rng(hashCombine(options_.seed, kTableSalt, uint64_t(t)));
    const double u = rng.uniform();
    table.missingRate = 0.2 * u * u;
    table.valueSeed = rng.next();
    for (auto& k : table.feistelKeys) k = rng.next();
    table.zipf = ZipfSampler(table.vocab, options_.zipf);
  }

  std::vector<double> coefDraws(kCriteoIntFeatures);
  for (int j = 0; j < kCriteoIntFeatures; ++j) {
    IntColumn& c = ints_[size_t(j)];
    Rng rng(hashCombine(options_.seed, kIntSalt, uint64_t(j)));
    const double u = rng.uniform();
    c.missingRate = 0.4 * u * u;
    c.pareto = j % 3 == 2;
    c.mu = -0.5 + 4.5 * rng.uniform();
    c.sigma = 0.5 + 1.5 * rng.uniform();
    c.alpha = 1.0 + 1.5 * rng.uniform();
    c.xm = 1.0 + 4.0 * rng.uniform();
    c.negativeRate = j % 5 == 1 ? 0.02 + 0.03 * rng.uniform() : 0.0;
    coefDraws[size_t(j)] = rng.normal();
  }

  inPair_.assign(size_t(T), 0);
  if (options_.factorDim > 0 && T >= 2) {
    const size_t want = std::min<size_t>(std::max(1, T / 2), size_t(T) * size_t(T - 1) / 2);
    Rng rng(hashCombine(options_.seed, kPairSalt));
    while (pairs_.size() < want) {
      int a = int(rng.below(uint64_t(T)));
      int b = int(rng.below(uint64_t(T)));
      if (a == b) continue;
      if (a > b) std::swap(a, b);
      if (std::find(pairs_.begin(), pairs_.end(), std::pair(a, b)) != pairs_.end()) continue;
      pairs_.emplace_back(a, b);
      inPair_[size_t(a)] = inPair_[size_t(b)] = 1;
    }
  }

  const size_t k = size_t(options_.factorDim);
  for (int t = 0; t < T; ++t) {
    Table& table = tables_[size_t(t)];
    const uint32_t cached = uint32_t(std::min<uint64_t>(table.vocab, kCachedRanks));
    table.params.resize(size_t(cached) * (1 + k));
    table.tokens.resize(cached);
    for (uint32_t r = 1; r <= cached; ++r) {
      double* p = table.params.data() + size_t(r - 1) * (1 + k);
      valueParams(t, r, p, p + 1);
      char text[8];
      writeToken(t, r, text);
      std::memcpy(&table.tokens[r - 1], text, 8);
    }
    table.cached = cached;  // from here on writeToken and the lookups use the cache
  }

  // Dense coefficients: a_j = denseScale * z_j / sd(d_j), sd from the
  // calibration sample; then the bias that hits the target CTR on it.
  Rng rng(hashCombine(options_.seed, kCalibrationSalt));
  SyntheticRow row;
  std::vector<double> dense(size_t(kCalibrationRows) * kCriteoIntFeatures);
  std::vector<double> sparseLogit(kCalibrationRows);
  std::array<double, kCriteoIntFeatures> zeros{};
  for (int i = 0; i < kCalibrationRows; ++i) {
    sampleFeatures(rng, &row);
    for (int j = 0; j < kCriteoIntFeatures; ++j) {
      dense[size_t(i) * kCriteoIntFeatures + size_t(j)] = row.intPresent[j] ? denseTerm(row.ints[j]) : 0.0;
    }
    sparseLogit[size_t(i)] = logit(zeros, row.ranks);  // bias and a_j are still 0
  }
  for (int j = 0; j < kCriteoIntFeatures; ++j) {
    double sum = 0, sum2 = 0;
    for (int i = 0; i < kCalibrationRows; ++i) {
      const double d = dense[size_t(i) * kCriteoIntFeatures + size_t(j)];
      sum += d;
      sum2 += d * d;
    }
    const double mean = sum / kCalibrationRows;
    const double sd = std::sqrt(std::max(sum2 / kCalibrationRows - mean * mean, 0.0));
    ints_[size_t(j)].coef = options_.denseScale * coefDraws[size_t(j)] / std::max(sd, 1e-3);
  }
  std::vector<double> logits(kCalibrationRows);
  for (int i = 0; i < kCalibrationRows; ++i) {
    double l = sparseLogit[size_t(i)];
    for (int j = 0; j < kCriteoIntFeatures; ++j) {
      l += ints_[size_t(j)].coef * dense[size_t(i) * kCriteoIntFeatures + size_t(j)];
    }
    logits[size_t(i)] = l;
  }
  double lo = -40, hi = 40;
  for (int iter = 0; iter < 100; ++iter) {
    const double mid = 0.5 * (lo + hi);
    double mean = 0;
    for (double l : logits) mean += sigmoid(l + mid);
    mean /= kCalibrationRows;
    (mean < options_.ctr ? lo : hi) = mid;
  }
  bias_ = 0.5 * (lo + hi);
}

double PlantedCriteoModel::sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

void PlantedCriteoModel::valueParams(int table, uint32_t rank, double* weight,
                                     double* factors) const {
  Rng rng(hashCombine(tables_[size_t(table)].valueSeed, uint64_t(rank)));
  const double base = 1.0 + double(rank) / options_.rareRank;
  const double g = options_.rareShrink == 1.0 ? 1.0 / base : std::pow(base, -options_.rareShrink);
  *weight = options_.weightScale * g * rng.normal();
  if (!factors) return;  // the factors come after the weight in the stream
  const int k = options_.factorDim;
  const double fs = k > 0 ? options_.factorScale * g / std::sqrt(std::sqrt(double(k))) : 0.0;
  for (int i = 0; i < k; ++i) factors[i] = fs * rng.normal();
}

double PlantedCriteoModel::weightOf(int table, uint32_t rank) const {
  const Table& t = tables_[size_t(table)];
  if (rank <= t.cached) return t.params[size_t(rank - 1) * size_t(1 + options_.factorDim)];
  double w = 0;
  valueParams(table, rank, &w, nullptr);
  return w;
}

const double* PlantedCriteoModel::factorsOf(int table, uint32_t rank, double* scratch) const {
  const Table& t = tables_[size_t(table)];
  if (rank <= t.cached) return t.params.data() + size_t(rank - 1) * size_t(1 + options_.factorDim) + 1;
  double w = 0;
  valueParams(table, rank, &w, scratch);
  return scratch;
}

void PlantedCriteoModel::sampleFeatures(Rng& rng, SyntheticRow* row) const {
  for (int j = 0; j < kCriteoIntFeatures; ++j) {
    const IntColumn& c = ints_[size_t(j)];
    row->intPresent[j] = rng.uniform() >= c.missingRate;
    if (!row->intPresent[j]) {
      row->ints[j] = 0;
      continue;
    }
    if (c.negativeRate > 0 && rng.uniform() < c.negativeRate) {
      row->ints[j] = -1 - int64_t(rng.below(3));
      continue;
    }
    double x;
    if (c.pareto) {
      x = c.xm * (std::pow(1.0 - rng.uniform(), -1.0 / c.alpha) - 1.0);
    } else {
      x = std::exp(c.mu + c.sigma * rng.normal());
    }
    row->ints[j] = x >= double(kMaxInt) ? kMaxInt : int64_t(x);
  }
  row->ranks.resize(tables_.size());
  for (size_t t = 0; t < tables_.size(); ++t) {
    const Table& table = tables_[t];
    row->ranks[t] = rng.uniform() < table.missingRate ? 0 : uint32_t(table.zipf.sample(rng));
  }
}

double PlantedCriteoModel::logit(const SyntheticRow& row) const {
  std::array<double, kCriteoIntFeatures> d;
  for (int j = 0; j < kCriteoIntFeatures; ++j) d[j] = row.intPresent[j] ? denseTerm(row.ints[j]) : 0.0;
  return logit(d, row.ranks);
}

double PlantedCriteoModel::logit(std::span<const double> denseLog,
                                 std::span<const uint32_t> ranks) const {
  TROUPE_CHECK(denseLog.size() == kCriteoIntFeatures && ranks.size() == tables_.size(),
               "logit: {} dense terms and {} ranks for {} tables", denseLog.size(), ranks.size(),
               tables_.size());
  double l = bias_;
  for (int j = 0; j < kCriteoIntFeatures; ++j) l += ints_[size_t(j)].coef * denseLog[size_t(j)];
  for (size_t t = 0; t < tables_.size(); ++t) {
    if (ranks[t] != 0) l += weightOf(int(t), ranks[t]);
  }
  const int k = options_.factorDim;
  double scratchA[64], scratchB[64];
  for (const auto& [a, b] : pairs_) {
    const uint32_t ra = ranks[size_t(a)], rb = ranks[size_t(b)];
    if (ra == 0 || rb == 0) continue;
    const double* fa = factorsOf(a, ra, scratchA);
    const double* fb = factorsOf(b, rb, scratchB);
    double dot = 0;
    for (int i = 0; i < k; ++i) dot += fa[i] * fb[i];
    l += dot;
  }
  return l;
}

uint32_t PlantedCriteoModel::permute(const Table& t, uint32_t x) const {
  uint32_t left = x >> 16, right = x & 0xffff;
  for (uint64_t key : t.feistelKeys) {
    const uint32_t f = uint32_t(mix64(key ^ right)) & 0xffff;
    const uint32_t next = left ^ f;
    left = right;
    right = next;
  }
  return (left << 16) | right;
}

uint32_t PlantedCriteoModel::unpermute(const Table& t, uint32_t x) const {
  uint32_t left = x >> 16, right = x & 0xffff;
  for (int i = 3; i >= 0; --i) {
    const uint32_t prevRight = left;
    const uint32_t prevLeft = right ^ (uint32_t(mix64(t.feistelKeys[size_t(i)] ^ prevRight)) & 0xffff);
    left = prevLeft;
    right = prevRight;
  }
  return (left << 16) | right;
}

void PlantedCriteoModel::writeToken(int table, uint32_t rank, char* out) const {
  static constexpr char kHex[] = "0123456789abcdef";
  const Table& t = tables_[size_t(table)];
  if (rank <= t.cached) {
    std::memcpy(out, &t.tokens[rank - 1], 8);
    return;
  }
  const uint32_t v = permute(t, rank);
  for (int i = 0; i < 8; ++i) out[i] = kHex[(v >> (28 - 4 * i)) & 0xf];
}

Expected<uint32_t> PlantedCriteoModel::rankOfToken(int table, std::string_view token) const {
  if (table < 0 || table >= tables()) {
    return Status::invalidArgument(fmt::format("table {} out of range 0..{}", table, tables() - 1));
  }
  uint32_t v = 0;
  bool ok = token.size() == 8;
  for (size_t i = 0; ok && i < 8; ++i) {
    const int h = hexValue(token[i]);
    ok = h >= 0;
    v = (v << 4) | uint32_t(std::max(h, 0));
  }
  if (!ok) {
    return Status::invalidArgument(
        fmt::format("table {}: token '{}' is not 8 lowercase hex digits", table, token));
  }
  const uint32_t rank = unpermute(tables_[size_t(table)], v);
  if (rank < 1 || rank > vocab(table)) {
    return Status::invalidArgument(fmt::format("table {}: token '{}' is no value of this table (rank {}, vocabulary {})",
                                               table, token, rank, vocab(table)));
  }
  return rank;
}

Expected<double> PlantedCriteoModel::probabilityOfFields(std::span<const std::string_view> intFields,
                                                         std::span<const std::string_view> tokens) const {
  if (intFields.size() != kCriteoIntFeatures || tokens.size() != tables_.size()) {
    return Status::invalidArgument(fmt::format("expected {} integer and {} categorical fields, got {} and {}",
                                               kCriteoIntFeatures, tables_.size(), intFields.size(),
                                               tokens.size()));
  }
  std::array<double, kCriteoIntFeatures> d{};
  for (int j = 0; j < kCriteoIntFeatures; ++j) {
    const std::string_view f = intFields[size_t(j)];
    if (f.empty()) continue;
    int64_t x = 0;
    const auto [ptr, ec] = std::from_chars(f.data(), f.data() + f.size(), x);
    if (ec != std::errc() || ptr != f.data() + f.size()) {
      return Status::invalidArgument(fmt::format("integer field I{}: '{}' is not an integer", j + 1, f));
    }
    d[size_t(j)] = denseTerm(x);
  }
  std::vector<uint32_t> ranks(tables_.size(), 0);
  for (size_t t = 0; t < tables_.size(); ++t) {
    if (tokens[t].empty()) continue;
    auto rank = rankOfToken(int(t), tokens[t]);
    if (!rank) return rank.status();
    ranks[t] = *rank;
  }
  return sigmoid(logit(d, ranks));
}

std::string PlantedCriteoModel::summary() const {
  const auto& o = options_;
  std::string s = fmt::format(
      "synthetic criteo: seed {}, {} train rows, {} test rows, {} tables, vocab {}..{}, zipf {}, "
      "factor dim {}, {} pairs, target ctr {}, bias {:.4f}; scales weight {} factor {} dense {}, "
      "rare rank {} shrink {}\n  tables (vocab, missing%):",
      o.seed, o.rows, o.testRows > 0 ? o.testRows : std::max<int64_t>(o.rows / 10, 1), o.tables,
      o.minVocab, o.maxVocab, o.zipf, o.factorDim, pairs_.size(), o.ctr, bias_, o.weightScale,
      o.factorScale, o.denseScale, o.rareRank, o.rareShrink);
  for (size_t t = 0; t < tables_.size(); ++t) {
    s += fmt::format(" C{}={}/{:.1f}", t + 1, tables_[t].vocab, 100 * tables_[t].missingRate);
  }
  s += "\n  pairs:";
  for (const auto& [a, b] : pairs_) s += fmt::format(" C{}xC{}", a + 1, b + 1);
  return s;
}

}  // namespace troupe::data
