// TempDir: a fresh directory from mkdtemp, removed with its contents when the
// object goes away. Tests write their files here, never to fixed paths.
#pragma once

#include <string>
#include <vector>

namespace troupe::testing {

class TempDir final {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // path() + "/" + name
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Writes `contents` to `path`, replacing it; aborts the test binary on failure.
void writeFile(const std::string& path, const std::string& contents);
// Reads the whole file; "" and a test failure when it cannot be read.
std::string readFile(const std::string& path);
// A run's metrics.csv, its rows split at commas: the header and every
// row's 9 fields are expected (a test failure each when not; a row that
// is not 9 fields is left out).
std::vector<std::vector<std::string>> readMetricsCsv(const std::string& path);

}  // namespace troupe::testing
