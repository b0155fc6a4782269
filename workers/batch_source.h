// BatchSource: where a loader gets its batches. Implementations read Criteo TSV
// (keeping parsed batches in memory after the first pass when asked) or
// Fashion-MNIST idx files (reshuffled each epoch by a seeded permutation).
//
// Threading: one owner (the loader actor). Blocking I/O happens in next().
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "workers/batch.h"

namespace troupe::workers {

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  BatchSource(const BatchSource&) = delete;
  BatchSource& operator=(const BatchSource&) = delete;

  // Starts epoch `epoch` (0-based) from its first batch.
  virtual Status startEpoch(int64_t epoch) = 0;
  // The next batch of the epoch; nullptr at its end. Errors name file and line.
  virtual Expected<BatchPtr> next() = 0;
  // Passes over the next batch of the epoch, as next() would return it, and
  // says whether there was one. A source may do less work than next() (a
  // text file's rows are not parsed); by default it is next(), discarded.
  virtual Expected<bool> skip();
  // Rows in one epoch.
  virtual int64_t rowsPerEpoch() const = 0;
  // Lines skipped as malformed so far (skip-bad-lines mode).
  virtual int64_t badLines() const { return 0; }
  // A share of the data (everyNthBatch): from batch `fromBatch` of epoch
  // `epoch` on, batch i is this share's when (i - fromBatch) = part (mod
  // parts); in later epochs when i = part (mod parts). A sync group that
  // formed again divides what is left among its ranks this way. Other
  // sources refuse.
  virtual Status reshare(int64_t epoch, int64_t fromBatch, int64_t part, int64_t parts);

 protected:
  BatchSource() = default;
};

struct CriteoSourceOptions {
  std::string path;
  int64_t batchSize = 256;
  int numCategorical = 26;
  bool skipBadLines = false;
  // Keep parsed batches after the first pass; later epochs replay them.
  // Read as a share (everyNthBatch), only the share's batches are kept.
  bool inMemory = true;
  int64_t maxRows = -1;  // negative: the whole file
};

struct MnistSourceOptions {
  std::string imagesPath;
  std::string labelsPath;
  int64_t batchSize = 128;
  bool shuffle = true;
  uint64_t seed = 1;
  int64_t maxRows = -1;  // the first maxRows images only (-1: all)
};

// Batch i of `inner` for every i = part (mod parts): one worker's share of a
// data set read by `parts` workers, so together they see each batch once,
// in the global order batch 0, 1, 2, ... (BatchSource::reshare moves it on
// to another division from a given batch.)
std::unique_ptr<BatchSource> everyNthBatch(std::shared_ptr<BatchSource> inner, int64_t part, int64_t parts);

Expected<std::unique_ptr<BatchSource>> openCriteoSource(const CriteoSourceOptions& options);
Expected<std::unique_ptr<BatchSource>> openMnistSource(const MnistSourceOptions& options);

}  // namespace troupe::workers
