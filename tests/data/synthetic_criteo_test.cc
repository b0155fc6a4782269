#include "data/synthetic_criteo.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/check.h"
#include "data/criteo_reader.h"
#include "data/zipf.h"
#include "tests/common/temp_dir.h"

namespace troupe::data {
namespace {

using ::testing::HasSubstr;
using troupe::testing::readFile;
using troupe::testing::TempDir;
using troupe::testing::writeFile;

SyntheticCriteoOptions smallOptions() {
  SyntheticCriteoOptions o;
  o.rows = 3000;
  o.testRows = 2000;
  o.tables = 6;
  o.minVocab = 5;
  o.maxVocab = 5000;
  o.blockRows = 700;  // several blocks, the last one partial
  return o;
}

SyntheticCriteoOracle generate(const SyntheticCriteoOptions& o, const std::string& dir, int threads) {
  ComputePool pool(threads);
  auto r = generateSyntheticCriteo(o, dir, pool);
  EXPECT_TRUE(r.hasValue()) << (r ? "" : r.status().toString());
  return r ? *r : SyntheticCriteoOracle{};
}

double numberAt(const nlohmann::json& json, const std::string& key) {
  EXPECT_TRUE(json.contains(key) && json.at(key).is_number()) << key << ": " << json.dump();
  return json.contains(key) && json.at(key).is_number() ? json.at(key).get<double>() : NAN;
}

std::vector<std::string_view> splitTabs(std::string_view line) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (;;) {
    const size_t tab = line.find('\t', start);
    out.push_back(line.substr(start, tab == std::string_view::npos ? std::string_view::npos : tab - start));
    if (tab == std::string_view::npos) return out;
    start = tab + 1;
  }
}

TEST(SyntheticCriteo, SameSeedSameBytesForAnyThreadCount) {
  TempDir a, b, c;
  const auto o = smallOptions();
  generate(o, a.path(), 1);
  generate(o, b.path(), 2);
  generate(o, c.path(), 2);
  for (const char* name : {kSyntheticTrainFile, kSyntheticTestFile, kSyntheticOracleFile}) {
    const std::string bytes = readFile(a.file(name));
    EXPECT_FALSE(bytes.empty()) << name;
    EXPECT_EQ(bytes, readFile(b.file(name))) << name;
    EXPECT_EQ(bytes, readFile(c.file(name))) << name;
  }
  // Only the three files: no temporary left behind.
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(a.path())) {
    ++files;
    EXPECT_EQ(entry.path().string().find(".tmp"), std::string::npos) << entry.path();
  }
  EXPECT_EQ(files, 3);
}

TEST(SyntheticCriteo, DifferentSeedDifferentBytes) {
  TempDir a, b;
  auto o = smallOptions();
  generate(o, a.path(), 2);
  o.seed = 2;
  generate(o, b.path(), 2);
  EXPECT_NE(readFile(a.file(kSyntheticTrainFile)), readFile(b.file(kSyntheticTrainFile)));
  EXPECT_NE(readFile(a.file(kSyntheticTestFile)), readFile(b.file(kSyntheticTestFile)));
}

TEST(SyntheticCriteo, FilesReadCleanlyWithMissingAndNegativeValues) {
  TempDir dir;
  const auto o = smallOptions();
  generate(o, dir.path(), 2);
  for (const auto& [name, rows] : {std::pair{kSyntheticTrainFile, o.rows}, std::pair{kSyntheticTestFile, o.testRows}}) {
    CriteoReaderOptions ro;
    ro.path = dir.file(name);
    ro.numCategorical = o.tables;
    auto reader = CriteoReader::open(ro);
    ASSERT_TRUE(reader.hasValue());
    CriteoBatch batch;
    int64_t total = 0;
    for (;;) {
      auto n = (*reader)->next(1024, &batch);
      ASSERT_TRUE(n.hasValue()) << n.status().toString();
      if (*n == 0) break;
      total += int64_t(*n);
    }
    EXPECT_EQ(total, rows) << name;
    EXPECT_EQ((*reader)->badLines(), 0);
    EXPECT_EQ(countTextRows(dir.file(name)).value(), rows);
  }
  // The data looks like Criteo: some empty fields of both kinds, some -1s.
  const std::string text = readFile(dir.file(kSyntheticTrainFile));
  int emptyInts = 0, emptyCats = 0, negatives = 0;
  size_t start = 0;
  while (start < text.size()) {
    const size_t nl = text.find('\n', start);
    const auto fields = splitTabs(std::string_view(text).substr(start, nl - start));
    start = nl + 1;
    ASSERT_EQ(fields.size(), size_t(1 + kCriteoIntFeatures + o.tables));
    for (int j = 0; j < kCriteoIntFeatures; ++j) {
      emptyInts += fields[size_t(1 + j)].empty();
      negatives += !fields[size_t(1 + j)].empty() && fields[size_t(1 + j)][0] == '-';
    }
    for (int t = 0; t < o.tables; ++t) {
      const auto f = fields[size_t(1 + kCriteoIntFeatures + t)];
      emptyCats += f.empty();
      if (!f.empty()) {
        ASSERT_EQ(f.size(), 8u);
      }
    }
  }
  EXPECT_GT(emptyInts, 0);
  EXPECT_GT(emptyCats, 0);
  EXPECT_GT(negatives, 0);
}

TEST(SyntheticCriteo, OracleMatchesTheTestFile) {
  TempDir dir;
  const auto o = smallOptions();
  const auto result = generate(o, dir.path(), 2);
  const auto json = nlohmann::json::parse(readFile(dir.file(kSyntheticOracleFile)));
  const PlantedCriteoModel model(o);

  // Recompute p of every test line from its text alone.
  const std::string text = readFile(dir.file(kSyntheticTestFile));
  std::vector<double> p;
  std::vector<int> y;
  size_t start = 0;
  while (start < text.size()) {
    const size_t nl = text.find('\n', start);
    ASSERT_NE(nl, std::string::npos);
    const auto fields = splitTabs(std::string_view(text).substr(start, nl - start));
    start = nl + 1;
    ASSERT_EQ(fields.size(), size_t(1 + kCriteoIntFeatures + o.tables));
    y.push_back(fields[0] == "1");
    auto prob = model.probabilityOfFields(
        std::span(fields).subspan(1, kCriteoIntFeatures),
        std::span(fields).subspan(1 + kCriteoIntFeatures));
    ASSERT_TRUE(prob.hasValue()) << prob.status().toString();
    p.push_back(*prob);
  }
  ASSERT_EQ(int64_t(p.size()), o.testRows);

  // AUC by its definition (all pairs, ties count one half), log-loss directly.
  double wins = 0, pairs = 0, loss = 0, clicks = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    loss -= y[i] ? std::log(p[i]) : std::log(1 - p[i]);
    clicks += y[i];
    if (!y[i]) continue;
    for (size_t j = 0; j < p.size(); ++j) {
      if (y[j]) continue;
      pairs += 1;
      wins += p[i] > p[j] ? 1.0 : p[i] == p[j] ? 0.5 : 0.0;
    }
  }
  const double auc = wins / pairs;
  loss /= double(p.size());
  EXPECT_NEAR(numberAt(json, "auc"), auc, 1e-9);
  EXPECT_NEAR(numberAt(json, "logloss"), loss, 1e-9);
  EXPECT_NEAR(result.auc, auc, 1e-9);
  EXPECT_NEAR(numberAt(json, "ctr_test"), clicks / double(p.size()), 1e-12);
  EXPECT_EQ(numberAt(json, "test_rows"), double(o.testRows));
  EXPECT_EQ(numberAt(json, "train_rows"), double(o.rows));
  EXPECT_EQ(numberAt(json, "seed"), double(o.seed));
  EXPECT_EQ(numberAt(json, "tables"), double(o.tables));
  EXPECT_EQ(numberAt(json, "bias"), model.bias());
  // A planted model with real signal, not a coin.
  EXPECT_GT(auc, 0.65);
  EXPECT_LT(auc, 0.95);
}

TEST(SyntheticCriteo, CacheCheckAndOracleReadBack) {
  TempDir dir;
  auto o = smallOptions();
  EXPECT_FALSE(syntheticCriteoMatches(o, dir.path()));
  EXPECT_EQ(readSyntheticOracle(dir.path()).status().code(), Status::Code::kNotFound);
  const auto r = generate(o, dir.path(), 2);
  EXPECT_TRUE(syntheticCriteoMatches(o, dir.path()));
  auto back = readSyntheticOracle(dir.path());
  ASSERT_TRUE(back.hasValue()) << back.status().toString();
  EXPECT_EQ(back->auc, r.auc);  // 17 digits round-trip exactly
  EXPECT_EQ(back->logloss, r.logloss);
  EXPECT_EQ(back->ctrTrain, r.ctrTrain);
  EXPECT_EQ(back->testRows, o.testRows);
  auto other = o;
  other.seed = 3;
  EXPECT_FALSE(syntheticCriteoMatches(other, dir.path()));
  other = o;
  other.zipf = 1.2;
  EXPECT_FALSE(syntheticCriteoMatches(other, dir.path()));
  other = o;
  other.testRows = 0;  // rows / 10 = 300, not 2000
  EXPECT_FALSE(syntheticCriteoMatches(other, dir.path()));
  std::filesystem::remove(dir.file(kSyntheticTestFile));
  EXPECT_FALSE(syntheticCriteoMatches(o, dir.path()));
}

// An oracle.json that is not JSON, lacks a key or holds one of another type
// is an error that names the file (and the key), and no match: never a crash.
TEST(SyntheticCriteo, ABrokenOracleIsAnErrorNamingTheKey) {
  TempDir dir;
  const auto o = smallOptions();
  generate(o, dir.path(), 2);
  const std::string path = dir.file(kSyntheticOracleFile);
  const auto good = nlohmann::json::parse(readFile(path));
  auto expectBroken = [&](const std::string& text, const std::string& says) {
    writeFile(path, text);
    const auto back = readSyntheticOracle(dir.path());
    ASSERT_FALSE(back.hasValue()) << text;
    EXPECT_EQ(back.status().code(), Status::Code::kCorruption) << back.status().toString();
    EXPECT_THAT(back.status().message(), HasSubstr(path));
    EXPECT_THAT(back.status().message(), HasSubstr(says));
    EXPECT_FALSE(syntheticCriteoMatches(o, dir.path())) << text;
  };
  expectBroken("{\"auc\": 0.7,", "not JSON");
  expectBroken("[1, 2]", "not a JSON object");
  auto missing = good;
  missing.erase("logloss");
  expectBroken(missing.dump(), "\"logloss\"");
  auto text = good;
  text["auc"] = "0.7";
  expectBroken(text.dump(), "\"auc\" is a string");
  auto fraction = good;
  fraction["test_rows"] = 2000.5;
  expectBroken(fraction.dump(), "\"test_rows\" is a number, not a whole number");
  auto seed = good;
  seed["seed"] = "1";  // the options' key: no match, but the oracle itself reads
  writeFile(path, seed.dump());
  EXPECT_FALSE(syntheticCriteoMatches(o, dir.path()));
  EXPECT_TRUE(readSyntheticOracle(dir.path()).hasValue());
  // Written back as it was, it matches again.
  writeFile(path, good.dump(2));
  EXPECT_TRUE(syntheticCriteoMatches(o, dir.path()));
}

TEST(SyntheticCriteo, RealisedCtrNearTarget) {
  for (double ctr : {0.25, 0.05}) {
    TempDir dir;
    auto o = smallOptions();
    o.rows = 20000;
    o.ctr = ctr;
    const auto r = generate(o, dir.path(), 2);
    // Binomial sd at 20000 rows is 0.003 for 0.25; the bias is calibrated on
    // another sample, so allow a few sd of both.
    EXPECT_NEAR(r.ctrTrain, ctr, 0.2 * ctr + 0.005) << ctr;
    EXPECT_NEAR(r.meanPTest, ctr, 0.2 * ctr + 0.005) << ctr;
  }
}

TEST(SyntheticCriteo, DefaultModelIsCalibratedAndTokensInvert) {
  const SyntheticCriteoOptions o;  // the full default world: 26 tables up to 1e6 values
  const PlantedCriteoModel model(o);
  EXPECT_EQ(model.tables(), 26);
  EXPECT_EQ(model.vocab(0), 10u);
  EXPECT_EQ(model.vocab(25), 1'000'000u);
  EXPECT_EQ(model.pairs().size(), 13u);
  for (int t = 0; t < 26; ++t) {
    EXPECT_LE(model.missingRate(t), 0.2);
    if (t > 0) {
      EXPECT_GT(model.vocab(t), model.vocab(t - 1));
    }
  }
  Rng rng(99);
  SyntheticRow row;
  double sumP = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    model.sampleFeatures(rng, &row);
    sumP += PlantedCriteoModel::sigmoid(model.logit(row));
  }
  EXPECT_NEAR(sumP / n, o.ctr, 0.015);

  // Tokens: 8 hex digits, distinct per rank, inverted exactly.
  for (int t : {0, 12, 25}) {
    std::set<std::string> seen;
    for (uint32_t r : {1u, 2u, 3u, 1000u, 1024u, 1025u, 4096u, 999999u, 1000000u}) {
      if (r > model.vocab(t)) continue;
      char token[8];
      model.writeToken(t, r, token);
      const std::string s(token, 8);
      EXPECT_TRUE(seen.insert(s).second);
      auto back = model.rankOfToken(t, s);
      ASSERT_TRUE(back.hasValue()) << back.status().toString();
      EXPECT_EQ(*back, r);
    }
  }
  EXPECT_FALSE(model.rankOfToken(0, "68fd1e6").hasValue());
  EXPECT_FALSE(model.rankOfToken(0, "68FD1E64").hasValue());
  // Almost every random token decodes to a rank outside a 10-value table.
  EXPECT_THAT(model.rankOfToken(0, "68fd1e64").status().message(), HasSubstr("no value of this table"));
  EXPECT_THAT(model.summary(), HasSubstr("26 tables"));
  EXPECT_THAT(describeSyntheticCriteo(smallOptions()), HasSubstr("C6="));
}

TEST(SyntheticCriteo, BadOptionsThrowSetupError) {
  auto o = smallOptions();
  o.maxVocab = 2;
  EXPECT_THROW(PlantedCriteoModel{o}, SetupError);
  o = smallOptions();
  o.ctr = 1.0;
  EXPECT_THROW(PlantedCriteoModel{o}, SetupError);
  o = smallOptions();
  o.tables = 0;
  EXPECT_THROW(PlantedCriteoModel{o}, SetupError);
}

TEST(SyntheticCriteo, ProgressAndUnwritableDirectory) {
  TempDir dir;
  auto o = smallOptions();
  ComputePool pool(2);
  std::vector<int64_t> seen;
  auto r = generateSyntheticCriteo(o, dir.path(), pool, [&](int64_t done, int64_t total) {
    EXPECT_EQ(total, o.rows + o.testRows);
    seen.push_back(done);
  });
  ASSERT_TRUE(r.hasValue());
  ASSERT_FALSE(seen.empty());
  EXPECT_TRUE(std::is_sorted(seen.begin(), seen.end()));
  EXPECT_EQ(seen.back(), o.rows + o.testRows);

  troupe::testing::writeFile(dir.file("plain"), "x");
  auto bad = generateSyntheticCriteo(o, dir.file("plain") + "/sub", pool);
  ASSERT_FALSE(bad.hasValue());
  EXPECT_THAT(bad.status().message(), HasSubstr(dir.file("plain")));
}

// Chi-square of bucketed Zipf draws against the exact law. Buckets: single
// ranks first, then doubling ranges (so the guide table, the exp/log tail and
// the boundary between them are all covered).
double zipfChiSquare(uint64_t n, double s, int draws, int* dof) {
  const ZipfSampler zipf(n, s);
  std::vector<std::pair<uint64_t, uint64_t>> buckets;  // [lo, hi]
  for (uint64_t lo = 1; lo <= n;) {
    const uint64_t hi = std::min(n, lo < 16 ? lo : 2 * lo - 1);
    buckets.emplace_back(lo, hi);
    lo = hi + 1;
  }
  double norm = 0;
  for (uint64_t k = 1; k <= n; ++k) norm += std::pow(double(k), -s);
  std::vector<double> expected;
  for (auto [lo, hi] : buckets) {
    double m = 0;
    for (uint64_t k = lo; k <= hi; ++k) m += std::pow(double(k), -s);
    expected.push_back(m / norm * draws);
  }
  std::vector<int64_t> observed(buckets.size());
  Rng rng(7);
  for (int i = 0; i < draws; ++i) {
    const uint64_t k = zipf.sample(rng);
    EXPECT_GE(k, 1u);
    EXPECT_LE(k, n);
    size_t b = 0;
    while (buckets[b].second < k) ++b;
    ++observed[b];
  }
  double chi2 = 0;
  for (size_t b = 0; b < buckets.size(); ++b) {
    const double d = double(observed[b]) - expected[b];
    chi2 += d * d / expected[b];
  }
  *dof = int(buckets.size()) - 1;
  return chi2;
}

class ZipfLaw : public ::testing::TestWithParam<std::pair<uint64_t, double>> {};

TEST_P(ZipfLaw, FrequenciesMatchTheory) {
  const auto [n, s] = GetParam();
  int dof = 0;
  const double chi2 = zipfChiSquare(n, s, 300000, &dof);
  // Mean dof, sd sqrt(2 dof); the bound is beyond 6 sd (false alarm < 1e-6),
  // far below what an off-by-one or a wrong exponent produces.
  EXPECT_LT(chi2, dof + 6 * std::sqrt(2.0 * dof) + 10) << "n " << n << " s " << s << " dof " << dof;
}

INSTANTIATE_TEST_SUITE_P(Shapes, ZipfLaw,
                         ::testing::Values(std::pair<uint64_t, double>{1, 1.1},
                                           std::pair<uint64_t, double>{20, 1.1},
                                           std::pair<uint64_t, double>{20, 0.7},
                                           std::pair<uint64_t, double>{50, 1.0},
                                           std::pair<uint64_t, double>{5000, 1.1},
                                           std::pair<uint64_t, double>{200000, 1.3}));

TEST(ZipfLaw, AWrongExponentFailsTheTest) {
  // The test above has teeth: draws with s = 1.15 judged against s = 1.1.
  const ZipfSampler wrong(20, 1.15);
  const int draws = 300000;
  double norm = 0;
  for (int k = 1; k <= 20; ++k) norm += std::pow(double(k), -1.1);
  std::vector<int> observed(21);
  Rng rng(7);
  for (int i = 0; i < draws; ++i) ++observed[wrong.sample(rng)];
  double chi2 = 0;
  for (int k = 1; k <= 20; ++k) {
    const double e = std::pow(double(k), -1.1) / norm * draws;
    chi2 += (observed[size_t(k)] - e) * (observed[size_t(k)] - e) / e;
  }
  EXPECT_GT(chi2, 19 + 6 * std::sqrt(38.0) + 10);
}

}  // namespace
}  // namespace troupe::data
