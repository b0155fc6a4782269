// PlantedCriteoModel: the synthetic Criteo world — how feature values are
// drawn and how clicks follow from them. The generator (synthetic_criteo.h)
// samples rows from it; a test or an evaluation tool can recompute the click
// probability of any generated line from its text.
//
// Features of a row
//   13 integers      column j: missing with a per-column rate (0-40%); else a
//                    rounded log-normal or Pareto value with per-column
//                    parameters; a few columns are sometimes -1..-3 (like
//                    Criteo's I2). The model sees d_j = log(1 + max(x, 0)), 0
//                    when missing (the reader's dense transform).
//   T categoricals   table t has V_t values, V_t log-spaced from minVocab
//                    (t = 0) to maxVocab (t = T - 1); missing with a per-table
//                    rate (0-20%), else rank r ~ Zipf(zipf) over 1..V_t. The
//                    token of (t, r) is 8 lowercase hex digits of a keyed
//                    32-bit permutation (a Feistel network) of r: it looks like
//                    Criteo's hashed values, and rankOfToken() inverts it
//                    exactly, so no token -> rank table is needed.
// Click model
//   logit = bias + sum_t w_t(r_t) + sum_j a_j d_j
//                + sum_{(t,u) in pairs} <f_t(r_t), f_u(r_u)>
//   p = sigmoid(logit), label ~ Bernoulli(p). A missing value adds nothing.
//   w_t(r) = weightScale * g(r) * z and f_t(r) = factorScale * k^-1/4 * g(r) * z'
//   with z, z' standard normals from an Rng seeded by hash(seed, t, r), and
//   g(r) = (1 + r / rareRank)^-rareShrink, which keeps most of the signal on
//   values frequent enough to be learned. a_j = denseScale * z / sd(d_j).
//   pairs: max(1, T / 2) distinct table pairs drawn from the seed (none when
//   factorDim is 0 or T is 1). bias is set so the mean p over a fixed
//   calibration sample of 32768 rows equals the target ctr.
//
// Everything is a function of the options alone: same options, same model.
// Immutable after construction; every const method is thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/hash.h"
#include "common/status.h"
#include "data/criteo_reader.h"
#include "data/zipf.h"

namespace troupe::data {

// Options of the synthetic data set; the first block mirrors the config keys
// data.synthetic.* (common/config_schema.cc), the second tunes the model.
struct SyntheticCriteoOptions {
  int64_t rows = 3'000'000;      // training rows
  int64_t testRows = 0;          // 0 = rows / 10
  uint64_t seed = 1;
  int tables = 26;
  int64_t minVocab = 10;
  int64_t maxVocab = 1'000'000;  // at most 2^32 - 1
  double zipf = 1.1;
  int factorDim = 4;
  double ctr = 0.25;

  double weightScale = 0.45;  // std of a frequent value's weight
  double factorScale = 0.65;  // sets the std of a frequent pair term (~factorScale^2)
  double denseScale = 0.2;    // std of a_j * d_j
  double rareRank = 20;       // ranks past this carry less signal ...
  double rareShrink = 2.0;    // ... by (1 + r / rareRank)^-rareShrink
  int64_t blockRows = 65536;  // rows per generated block (part of the output's identity)
};

// One sampled row before it is written: integers and ranks (0 = missing).
struct SyntheticRow {
  std::array<int64_t, kCriteoIntFeatures> ints{};
  std::array<bool, kCriteoIntFeatures> intPresent{};
  std::vector<uint32_t> ranks;  // [tables]
};

class PlantedCriteoModel final {
 public:
  // Validates the options (SetupError naming the bad value), derives every
  // parameter and calibrates the bias.
  explicit PlantedCriteoModel(const SyntheticCriteoOptions& options);

  const SyntheticCriteoOptions& options() const { return options_; }
  int tables() const { return options_.tables; }
  uint64_t vocab(int table) const { return tables_[size_t(table)].vocab; }
  double missingRate(int table) const { return tables_[size_t(table)].missingRate; }
  double bias() const { return bias_; }
  const std::vector<std::pair<int, int>>& pairs() const { return pairs_; }

  // Draws the features of one row (not the label).
  void sampleFeatures(Rng& rng, SyntheticRow* row) const;
  // The logit of a sampled row.
  double logit(const SyntheticRow& row) const;
  // The logit from dense terms d_j (13) and ranks (tables; 0 = missing).
  double logit(std::span<const double> denseLog, std::span<const uint32_t> ranks) const;
  static double sigmoid(double x);

  // The token of (table, rank), 8 hex digits, into out[0..8).
  void writeToken(int table, uint32_t rank, char* out) const;
  // Inverts writeToken; fails (invalidArgument) on text that is not 8 hex
  // digits or decodes to no rank of the table.
  Expected<uint32_t> rankOfToken(int table, std::string_view token) const;

  // p of a line given its raw text fields: 13 integer fields and `tables()`
  // categorical fields, each possibly empty. Fails on unparsable fields.
  Expected<double> probabilityOfFields(std::span<const std::string_view> intFields,
                                       std::span<const std::string_view> tokens) const;

  // A few lines for logs: options, vocabularies, missing rates, pairs, bias.
  std::string summary() const;

 private:
  struct Table {
    uint64_t vocab = 0;
    double missingRate = 0;
    uint64_t valueSeed = 0;
    std::array<uint64_t, 4> feistelKeys{};
    ZipfSampler zipf{1, 1.0};
    // Ranks 1..cached (index r - 1), the frequent ones, computed once and
    // kept small so they stay in cache: weight then factors, stride
    // 1 + factorDim; and the token text (8 chars in a word).
    uint32_t cached = 0;
    std::vector<double> params;
    std::vector<uint64_t> tokens;
  };
  struct IntColumn {
    double missingRate = 0;
    bool pareto = false;
    double mu = 0, sigma = 1;    // log-normal
    double alpha = 1, xm = 1;    // Pareto
    double negativeRate = 0;
    double coef = 0;
  };

  // w and f (factorDim values; skipped when factors is null) of (table, rank),
  // from the hash.
  void valueParams(int table, uint32_t rank, double* weight, double* factors) const;
  // Pointers to w and f of (table, rank), from the cache or computed into scratch.
  const double* factorsOf(int table, uint32_t rank, double* scratch) const;
  double weightOf(int table, uint32_t rank) const;
  uint32_t permute(const Table& t, uint32_t x) const;
  uint32_t unpermute(const Table& t, uint32_t x) const;
  void calibrate();

  SyntheticCriteoOptions options_;
  std::vector<Table> tables_;
  std::array<IntColumn, kCriteoIntFeatures> ints_{};
  std::vector<std::pair<int, int>> pairs_;
  std::vector<uint8_t> inPair_;  // [tables]: 1 if some pair uses the table
  double bias_ = 0;
};

}  // namespace troupe::data
