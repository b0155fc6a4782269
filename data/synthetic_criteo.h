// The synthetic Criteo generator: writes a Criteo-format data set sampled
// from a PlantedCriteoModel (planted_criteo_model.h), with the oracle metrics
// of the planted model on its test split.
//
// Output in DIR:
//   train.tsv    options.rows lines, Criteo TSV (readable by CriteoReader)
//   test.tsv     syntheticTestRows(options) lines
//   oracle.json  {"auc", "logloss": the planted p on the test labels — the
//                best any learner can reach; "train_rows", "test_rows",
//                "ctr_train", "ctr_test", "mean_p_test", "bias", "seed", the
//                options and the vocabulary sizes}, written and read with
//                nlohmann::json; each number reads back exactly (a figure
//                that is not finite is null).
// Each file is written under a temporary name and renamed when complete;
// oracle.json is removed first and written last, so a directory with an
// oracle.json holds a complete data set. Files are not fsynced: the data set
// is a cache that syntheticCriteoMatches() tells to regenerate.
//
// Determinism: rows are made in blocks of options.blockRows; block b of split
// s draws from Rng(hash(seed, s, b)). The bytes depend on the options only,
// not on the number of threads. Blocks are generated in parallel on the pool
// and written in order.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "common/compute_pool.h"
#include "common/status.h"
#include "data/planted_criteo_model.h"

namespace troupe::data {

inline constexpr const char* kSyntheticTrainFile = "train.tsv";
inline constexpr const char* kSyntheticTestFile = "test.tsv";
inline constexpr const char* kSyntheticOracleFile = "oracle.json";

// What generateSyntheticCriteo measured.
struct SyntheticCriteoOracle {
  double auc = 0;       // planted p vs test labels
  double logloss = 0;
  int64_t trainRows = 0;
  int64_t testRows = 0;
  double ctrTrain = 0;  // realised click rates
  double ctrTest = 0;
  double meanPTest = 0;
  double bias = 0;
  double seconds = 0;   // wall time of the generation
};

// Called on the calling thread after each group of blocks is written.
using SyntheticProgress = std::function<void(int64_t rowsDone, int64_t rowsTotal)>;

// test rows: options.testRows, or rows / 10 (at least 1) when it is 0.
int64_t syntheticTestRows(const SyntheticCriteoOptions& options);

// Generates the data set into dir (created if missing). Throws SetupError on
// bad options; returns an ioError naming the path on a file failure.
Expected<SyntheticCriteoOracle> generateSyntheticCriteo(const SyntheticCriteoOptions& options,
                                                        const std::string& dir, ComputePool& pool,
                                                        const SyntheticProgress& progress = {});

// The same with a model built beforehand (e.g. to log its summary first).
Expected<SyntheticCriteoOracle> generateSyntheticCriteo(const PlantedCriteoModel& model,
                                                        const std::string& dir, ComputePool& pool,
                                                        const SyntheticProgress& progress = {});

// The oracle.json of a generated data set (seconds is 0). Fails (notFound /
// corruption naming the file) when there is none, it is not JSON, or a key
// is missing or of another type (naming the key).
Expected<SyntheticCriteoOracle> readSyntheticOracle(const std::string& dir);

// Whether dir holds a complete data set generated with exactly these options
// (oracle.json present, readable by readSyntheticOracle and every option in
// it equal, train.tsv and test.tsv present), so a cache can be reused
// instead of regenerated.
bool syntheticCriteoMatches(const SyntheticCriteoOptions& options, const std::string& dir);

// One line per part for logs: options, vocabularies, missing rates, pairs.
// (Builds the model, which takes a few tens of milliseconds.)
std::string describeSyntheticCriteo(const SyntheticCriteoOptions& options);

// The oracle.json text for a result (exposed for tests and tools).
std::string syntheticOracleJson(const PlantedCriteoModel& model, const SyntheticCriteoOracle& oracle);

}  // namespace troupe::data
