// The model of a sync-mode job at a checkpoint's cut, as its file holds it
// (workers/checkpoint.h): every rank of an all-reduce group holds the same
// dense weights with their optimizer state (and, in allreduce mode, the same
// replica of the tables), so the lowest live rank writes one file for all:
// the step the group stopped at, the place in the data every rank goes on
// from (the epoch and the batches of it taken), the ledger, the dense state
// and the tables. Written with common/checksum_file.h (temporary name, XXH3,
// fsync, rename); read whole and refused, naming the file and what is wrong,
// when it is truncated, corrupt or not of this model.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "ps/embedding_table.h"

namespace troupe::workers {

inline constexpr const char* kModelImageMagic = "TRPMODL1";
inline constexpr const char* kModelImageFile = "model.ckpt";

struct ModelImage {
  int64_t workers = 1;
  int64_t step = 0;            // steps every rank has taken
  int64_t epoch = 0;           // the epoch under way
  int64_t epochBatch = 0;      // batches of it the steps took (the ranks divide the rest on resume)
  int64_t samplesApplied = 0;  // every rank's samples in the steps taken (the ledger)
  int64_t denseParameters = 0;
  std::vector<float> dense;    // [weights | optimizer state]
  // allreduce mode: the replica (shared with the table holder that made
  // it, read only); hybrid: none (on the shards).
  std::shared_ptr<const std::vector<ps::TableImage>> tables;
  size_t tableCount() const { return tables ? tables->size() : 0; }
};

// Writes the image to `path` (whole or not at all); its checksum and size
// when asked for.
Status writeModelImage(const ModelImage& image, const std::string& path, uint64_t* checksum = nullptr,
                       uint64_t* bytes = nullptr);
// Reads and verifies it (checksum, every length, the sizes that must agree).
Expected<ModelImage> readModelImage(const std::string& path);
// Whether it fits a model of `denseStateFloats` floats of dense state (of
// which `denseParameters` weights), `tables` tables and `workers` ranks;
// the first difference, named with the file.
Status checkModelImage(const ModelImage& image, const std::string& path, int64_t workers, int64_t denseParameters,
                       int64_t denseStateFloats, int64_t tables);

}  // namespace troupe::workers
