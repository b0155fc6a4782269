// ProgressLine: progress of long work on stderr. On a terminal one line is
// rewritten in place ("gen-data  42%  840000 / 2000000 rows  310000 rows/s
// ETA 4 s"); otherwise a log line is written at every 10%.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace troupe {

class ProgressLine final {
 public:
  ProgressLine(std::string what, std::string unit);
  // done of total units so far; total <= 0 when unknown. `extra` is appended.
  void update(int64_t done, int64_t total, const std::string& extra = "");
  // Ends the rewritten line (a newline on a terminal).
  void finish();
  static bool stderrIsTerminal();

 private:
  std::string what_, unit_;
  bool tty_;
  bool open_ = false;
  int lastDecile_ = -1;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point lastDraw_{};
};

// "1h02m", "3m05s", "12s".
std::string formatDuration(double seconds);

}  // namespace troupe
