#include "common/progress_line.h"

#include <unistd.h>

#include <cstdio>

#include "common/logging.h"

namespace troupe {

std::string formatDuration(double s) {
  if (!(s >= 0) || s > 1e7) return "?";
  const int64_t t = int64_t(s + 0.5);
  if (t >= 3600) return fmt::format("{}h{:02d}m", t / 3600, (t % 3600) / 60);
  if (t >= 60) return fmt::format("{}m{:02d}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

bool ProgressLine::stderrIsTerminal() { return isatty(STDERR_FILENO) == 1; }

ProgressLine::ProgressLine(std::string what, std::string unit)
    : what_(std::move(what)), unit_(std::move(unit)), tty_(stderrIsTerminal()),
      start_(std::chrono::steady_clock::now()) {}

void ProgressLine::update(int64_t done, int64_t total, const std::string& extra) {
  const auto now = std::chrono::steady_clock::now();
  const double secs = std::chrono::duration<double>(now - start_).count();
  const double rate = secs > 0 ? double(done) / secs : 0.0;
  const bool known = total > 0;
  const int pct = known ? int(100 * std::min(done, total) / total) : 0;
  std::string line = known ? fmt::format("{} {:3d}%  {} / {} {}", what_, pct, done, total, unit_)
                           : fmt::format("{}  {} {}", what_, done, unit_);
  line += fmt::format("  {:.0f} {}/s", rate, unit_);
  if (known && rate > 0) line += "  ETA " + formatDuration(double(total - done) / rate);
  if (!extra.empty()) line += "  " + extra;
  if (tty_) {
    if (now - lastDraw_ < std::chrono::milliseconds(200) && done < total) return;
    lastDraw_ = now;
    std::fprintf(stderr, "\r%-100s", line.c_str());
    std::fflush(stderr);
    open_ = true;
  } else if (!known || pct / 10 > lastDecile_) {
    lastDecile_ = pct / 10;
    logger("apps")->info("{}", line);
  }
}

void ProgressLine::finish() {
  if (tty_ && open_) std::fputc('\n', stderr);
  open_ = false;
}

}  // namespace troupe
