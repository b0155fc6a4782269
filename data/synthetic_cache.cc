#include "data/synthetic_cache.h"

#include <filesystem>

#include "common/progress_line.h"
#include "common/compute_pool.h"
#include "common/hash.h"
#include "common/logging.h"
#include "data/planted_criteo_model.h"
#include "data/synthetic_criteo.h"

namespace troupe::data {
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
  auto log = logger("data");
  SyntheticDataSet set;
  set.dir = dir.string();
  set.trainPath = (dir / data::kSyntheticTrainFile).string();
  set.testPath = (dir / data::kSyntheticTestFile).string();
  if (!force && data::syntheticCriteoMatches(options, set.dir)) {
    log->info("synthetic data: {} already holds this data set (same settings)", set.dir);
    auto oracle = data::readSyntheticOracle(set.dir);
    if (!oracle.hasValue()) return oracle.status();
    set.oracle = *oracle;
    return set;
  }
  const data::PlantedCriteoModel model(options);  // validates the options (SetupError)
  log->info("synthetic data: writing {} ({})", set.dir, settings);
  log->debug("{}", model.summary());
  ComputePool pool(threads);
  ProgressLine progress("gen-data", "rows");
  auto result = data::generateSyntheticCriteo(
      model, set.dir, pool, [&](int64_t done, int64_t total) { progress.update(done, total); });
  progress.finish();
  if (!result.hasValue()) return result.status();
  set.generated = true;
  set.oracle = *result;
  return set;
}

}  // namespace troupe::data
