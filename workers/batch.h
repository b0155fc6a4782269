// Batch: one training or evaluation batch as it travels between the loader,
// the worker and (for its keys) the tables. Immutable once made and passed by
// shared ownership (BatchPtr), never copied.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace troupe::workers {

struct Batch {
  int64_t index = 0;     // batch number within the epoch
  int64_t firstRow = 0;  // row number of the first example within the epoch
  int64_t rows = 0;
  std::vector<float> labels;     // [rows]: click labels (binary models)
  std::vector<int32_t> classes;  // [rows]: class labels (classifiers)
  int64_t denseWidth = 0;
  std::vector<float> dense;      // [rows x denseWidth]
  int numTables = 0;
  std::vector<uint64_t> keys;    // [rows x numTables], one key per table and row
};

using BatchPtr = std::shared_ptr<const Batch>;

}  // namespace troupe::workers
