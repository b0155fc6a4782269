// LibsvmReader: streams a libsvm / svmlight text file into CSR batches.
//
// Line format:  label idx:val idx:val ...   [# comment]
// Fields are separated by spaces or tabs. label is an int or a float (also
// "-1" / "+1"); idx is a non-negative integer; val a float. Indices need not
// be ascending. A line with a label and no features is a row with no entries.
//
// Errors are values: a malformed line yields a corruption Status reading
// "<path>:<line>: <what>, token '<token>'". With skipBadLines such lines are
// counted (badLines()), the first few logged on the "data" logger, and dropped.
//
// Threading: one owner; not thread-safe. Batches are owned by the caller.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace troupe::data {

// Rows in compressed sparse row form: row r holds entries
// [rowOffsets[r], rowOffsets[r + 1]) of indices / values.
struct LibsvmBatch {
  std::vector<float> labels;          // [rows]
  std::vector<int64_t> rowOffsets{0};  // [rows + 1]
  std::vector<uint64_t> indices;      // [entries]
  std::vector<float> values;          // [entries]

  size_t rows() const { return labels.size(); }
  size_t entries() const { return indices.size(); }
  void clear() {
    labels.clear();
    rowOffsets.assign(1, 0);
    indices.clear();
    values.clear();
  }
};

enum class LibsvmLabels {
  kRaw,     // labels as written
  kBinary,  // 1 / +1 -> 1, 0 / -1 -> 0; any other label is a bad line
};

struct LibsvmReaderOptions {
  std::string path;
  LibsvmLabels labels = LibsvmLabels::kRaw;
  bool skipBadLines = false;
  // Stop after this many good rows; negative reads the whole file.
  int64_t maxRows = -1;
  size_t maxLineBytes = 1024 * 1024;
  size_t bufferBytes = 4 * 1024 * 1024;
  int logBadLines = 5;
};

class LibsvmReader final {
 public:
  // Opens the file; fails with notFound / ioError naming the path and strerror.
  static Expected<std::unique_ptr<LibsvmReader>> open(const LibsvmReaderOptions& options);
  ~LibsvmReader();
  LibsvmReader(const LibsvmReader&) = delete;
  LibsvmReader& operator=(const LibsvmReader&) = delete;

  // Clears *batch and fills it with up to batchRows rows; 0 means the end. Empty
  // and comment-only lines are skipped. A bad line (without skipBadLines)
  // returns its error; rows before it stay in *batch and a later call goes on
  // after it.
  Expected<size_t> next(size_t batchRows, LibsvmBatch* batch);

  Status rewind();

  int64_t rowsRead() const { return rowsRead_; }
  int64_t badLines() const { return badLines_; }
  int64_t lineNumber() const;

 private:
  struct Impl;
  LibsvmReader(std::unique_ptr<Impl> impl, const LibsvmReaderOptions& options);

  std::unique_ptr<Impl> impl_;
  LibsvmReaderOptions options_;
  int64_t rowsRead_ = 0;
  int64_t badLines_ = 0;
};

}  // namespace troupe::data
