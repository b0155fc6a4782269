// The synthetic Criteo data set of a configuration, generated once into
// data.cache_dir/criteo-synthetic-<hash of the settings> and reused while the
// settings stay the same (settings.txt beside the data records them).
#pragma once

#include <string>

#include "common/config.h"
#include "common/status.h"

namespace troupe::apps {

struct SyntheticDataSet {
  std::string dir;
  std::string trainPath;
  std::string testPath;
  bool generated = false;  // false: reused from the cache
  double seconds = 0;      // generation time
  int64_t trainRows = 0;
  int64_t testRows = 0;
  double oracleAuc = 0;
  double oracleLogloss = 0;
  double ctrTrain = 0;
  double ctrTest = 0;
};

// Generates (or finds) the data set of config's data.synthetic.* keys. `out`
// overrides the cache directory; force regenerates. Progress goes to stderr.
// Throws SetupError on bad settings; returns an error on an I/O failure.
Expected<SyntheticDataSet> ensureSyntheticData(const Config& config, const std::string& out, bool force,
                                               int threads);

}  // namespace troupe::apps
