#include "apps/synthetic_cache.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "apps/progress_line.h"
#include "common/compute_pool.h"
#include "common/hash.h"
#include "common/logging.h"
#include "data/synthetic_criteo.h"

namespace troupe::apps {
namespace {

namespace fs = std::filesystem;

data::SyntheticCriteoOptions optionsFrom(const Config& c) {
  data::SyntheticCriteoOptions o;
  o.rows = c.getInt("data.synthetic.rows");
  o.testRows = c.getInt("data.synthetic.test_rows");
  o.seed = uint64_t(c.getInt("data.synthetic.seed"));
  o.tables = int(c.getInt("data.synthetic.tables"));
  o.minVocab = c.getInt("data.synthetic.min_vocab");
  o.maxVocab = c.getInt("data.synthetic.max_vocab");
  o.zipf = c.getFloat("data.synthetic.zipf");
  o.factorDim = int(c.getInt("data.synthetic.factor_dim"));
  o.ctr = c.getFloat("data.synthetic.ctr");
  o.weightScale = c.getFloat("data.synthetic.weight_scale");
  o.factorScale = c.getFloat("data.synthetic.factor_scale");
  o.denseScale = c.getFloat("data.synthetic.dense_scale");
  o.rareRank = c.getFloat("data.synthetic.rare_rank");
  o.rareShrink = c.getFloat("data.synthetic.rare_shrink");
  return o;
}

// Every option that changes the bytes, in one line.
std::string settingsLine(const data::SyntheticCriteoOptions& o) {
  return fmt::format(
      "criteo-synthetic v1 rows={} test_rows={} seed={} tables={} min_vocab={} max_vocab={} zipf={} "
      "factor_dim={} ctr={} weight_scale={} factor_scale={} dense_scale={} rare_rank={} rare_shrink={} "
      "block_rows={}",
      o.rows, data::syntheticTestRows(o), o.seed, o.tables, o.minVocab, o.maxVocab, o.zipf, o.factorDim, o.ctr,
      o.weightScale, o.factorScale, o.denseScale, o.rareRank, o.rareShrink, o.blockRows);
}

std::string readSmallFile(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return "";
  std::stringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

double jsonNumber(const std::string& json, const std::string& key) {
  auto pos = json.find("\"" + key + "\"");
  if (pos == std::string::npos) return std::nan("");
  pos = json.find(':', pos);
  if (pos == std::string::npos) return std::nan("");
  return std::strtod(json.c_str() + pos + 1, nullptr);
}

}  // namespace

Expected<SyntheticDataSet> ensureSyntheticData(const Config& config, const std::string& out, bool force,
                                               int threads) {
  const data::SyntheticCriteoOptions options = optionsFrom(config);
  const std::string settings = settingsLine(options);
  fs::path dir = out;
  if (dir.empty()) {
    dir = fs::path(config.getString("data.cache_dir")) /
          fmt::format("criteo-synthetic-{:016x}", hashBytes(settings));
  }
  auto log = logger("apps");
  SyntheticDataSet set;
  set.dir = dir.string();
  set.trainPath = (dir / data::kSyntheticTrainFile).string();
  set.testPath = (dir / data::kSyntheticTestFile).string();
  const fs::path oraclePath = dir / data::kSyntheticOracleFile;
  const fs::path settingsPath = dir / "settings.txt";
  if (!force && fs::exists(oraclePath) && readSmallFile(settingsPath) == settings + "\n") {
    log->info("synthetic data: {} already holds this data set (same settings)", set.dir);
  } else {
    // Describing builds the planted model, which validates the options first.
    const std::string description = data::describeSyntheticCriteo(options);
    log->info("synthetic data: writing {} ({})", set.dir, settings);
    log->debug("{}", description);
    ComputePool pool(threads);
    ProgressLine progress("gen-data", "rows");
    auto result = data::generateSyntheticCriteo(
        options, set.dir, pool, [&](int64_t done, int64_t total) { progress.update(done, total); });
    progress.finish();
    if (!result.hasValue()) return result.status();
    std::ofstream settingsFile(settingsPath, std::ios::trunc);
    settingsFile << settings << "\n";
    if (!settingsFile) return Status::ioError(fmt::format("cannot write {}", settingsPath.string()));
    set.generated = true;
    set.seconds = result->seconds;
  }
  const std::string json = readSmallFile(oraclePath);
  set.trainRows = int64_t(jsonNumber(json, "train_rows"));
  set.testRows = int64_t(jsonNumber(json, "test_rows"));
  set.oracleAuc = jsonNumber(json, "auc");
  set.oracleLogloss = jsonNumber(json, "logloss");
  set.ctrTrain = jsonNumber(json, "ctr_train");
  set.ctrTest = jsonNumber(json, "ctr_test");
  if (std::isnan(set.oracleAuc)) {
    return Status::corruption(fmt::format("{}: no \"auc\" in the oracle file", oraclePath.string()));
  }
  return set;
}

}  // namespace troupe::apps
