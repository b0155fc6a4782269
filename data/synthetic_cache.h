// The synthetic Criteo data set of a configuration, generated once into
// data.cache_dir/criteo-synthetic-<hash of the settings> and reused while the
// settings stay the same (data::syntheticCriteoMatches checks them against the
// options recorded in oracle.json).
#pragma once

#include <string>

#include "common/config.h"
#include "common/status.h"
#include "data/synthetic_criteo.h"

namespace troupe::data {

struct SyntheticDataSet {
  std::string dir;
  std::string trainPath;
  std::string testPath;
  bool generated = false;  // false: reused from the cache
  SyntheticCriteoOracle oracle;  // seconds: the generation's, 0 when reused
};

// Generates (or finds) the data set of config's data.synthetic.* keys. `out`
// overrides the cache directory; force regenerates. Progress goes to stderr.
// Throws SetupError on bad settings; returns an error on an I/O failure.
Expected<SyntheticDataSet> ensureSyntheticData(const Config& config, const std::string& out, bool force,
                                               int threads);

}  // namespace troupe::data
