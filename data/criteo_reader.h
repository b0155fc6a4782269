// CriteoReader: streams a Criteo-format TSV file batch by batch.
//
// Line format (the Criteo display-advertising challenge):
//   label \t I1 .. I13 \t C1 .. C<numCategorical> \n
// label is 0 or 1; I1..I13 are integers (may be negative); C* are tokens such
// as "68fd1e64". Any feature field may be empty (missing). "\r\n" endings and a
// last line without a newline are accepted.
//
// Each row becomes
//   label            0.0f or 1.0f
//   dense[13]        float(log(1 + max(x, 0))); a missing integer gives 0
//   keys[C]          criteoKey(table, token): hashBytes(token) with a seed per
//                    table, so one token in two tables gives two keys and one
//                    token in one table always the same key. An empty token
//                    maps to criteoMissingKey(table), a fixed key per table
//                    (it may collide with a real token's key with probability
//                    about 2^-64, like any two keys).
//
// Errors are values: a malformed line yields a corruption Status whose
// message reads "<path>:<line>: <what is wrong>" (field count, label, which
// integer column and its text, over-long line). With skipBadLines the reader
// drops such lines instead, counts them (badLines()) and logs the first few
// on the "data" logger.
//
// Threading: one owner; not thread-safe. Batches are owned by the caller.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace troupe::data {

inline constexpr int kCriteoIntFeatures = 13;
inline constexpr int kCriteoDefaultCategorical = 26;

// Key of a categorical token in table `table` (0-based).
uint64_t criteoKey(int table, std::string_view token);
// Key standing for an empty (missing) field of table `table`.
uint64_t criteoMissingKey(int table);
// float(log(1 + max(x, 0))), the dense transform.
float criteoDenseTransform(int64_t x);

// One batch, struct of arrays, row-major.
struct CriteoBatch {
  int numCategorical = kCriteoDefaultCategorical;
  std::vector<float> labels;     // [rows]
  std::vector<float> dense;      // [rows x kCriteoIntFeatures]
  std::vector<uint64_t> keys;    // [rows x numCategorical]

  size_t rows() const { return labels.size(); }
  void clear() {
    labels.clear();
    dense.clear();
    keys.clear();
  }
};

struct CriteoReaderOptions {
  std::string path;
  int numCategorical = kCriteoDefaultCategorical;
  // Count, log and drop malformed lines instead of failing.
  bool skipBadLines = false;
  // Stop after this many good rows; negative reads the whole file.
  int64_t maxRows = -1;
  // A longer line (without its line ending) is malformed.
  size_t maxLineBytes = 64 * 1024;
  // Size of each read(2).
  size_t bufferBytes = 4 * 1024 * 1024;
  // How many bad lines to log (with skipBadLines) before going quiet.
  int logBadLines = 5;
};

class CriteoReader final {
 public:
  // Opens the file. Fails with notFound / ioError naming the path and strerror;
  // throws SetupError on nonsense options (numCategorical < 1).
  static Expected<std::unique_ptr<CriteoReader>> open(const CriteoReaderOptions& options);
  ~CriteoReader();
  CriteoReader(const CriteoReader&) = delete;
  CriteoReader& operator=(const CriteoReader&) = delete;

  // Clears *batch and fills it with up to batchRows rows. Returns the number of
  // rows read: 0 means the end of the data (or options.maxRows reached). On a bad line
  // (without skipBadLines) returns the error; the rows read before it stay in
  // *batch and a later call continues after the bad line.
  Expected<size_t> next(size_t batchRows, CriteoBatch* batch);

  // Passes over the rows next(batchRows, ...) would read, without parsing
  // them: returns how many (0 at the end). Failing on bad lines, each line is
  // a row and none is checked (the reader that parses it fails on it);
  // skipping bad lines, each line is checked (not hashed) and the bad ones
  // are counted and dropped as next() drops them, so the batches that follow
  // are the same either way.
  Expected<size_t> skip(size_t batchRows);

  // Back to the first line; counters restart (a bad line already logged is
  // not logged again).
  Status rewind();

  const CriteoReaderOptions& options() const { return options_; }
  int64_t rowsRead() const { return rowsRead_; }
  // Lines dropped under skipBadLines.
  int64_t badLines() const { return badLines_; }
  // 1-based number of the last line consumed.
  int64_t lineNumber() const;

 private:
  struct Impl;
  explicit CriteoReader(std::unique_ptr<Impl> impl, const CriteoReaderOptions& options);
  // Rows the next batch may take: batchRows, bounded by options.maxRows.
  size_t rowsAllowed(size_t batchRows) const;
  // A malformed line: the error (failing on bad lines) or counted and logged.
  Status badLine(const std::string& why);

  std::unique_ptr<Impl> impl_;
  CriteoReaderOptions options_;
  int64_t rowsRead_ = 0;
  int64_t badLines_ = 0;
  int64_t loggedBadLines_ = 0;  // kept across rewinds
};

// Lines in a text file that are not empty (a last line without '\n' counts),
// by a fast scan; used to size splits and progress bars. Fails like open().
Expected<int64_t> countTextRows(const std::string& path);

// How many lines of a Criteo TSV file a reader would skip as malformed (a
// pass over the whole file, nothing logged): for a run's summary.
// maxRows bounds the good rows read, as CriteoReaderOptions::maxRows.
Expected<int64_t> countBadCriteoLines(const std::string& path, int numCategorical, int64_t maxRows = -1);

}  // namespace troupe::data
