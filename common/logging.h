// Logging through spdlog: one named logger per folder ("common", "kernels",
// "data", "apps", ...), one line format for every role, level per logger.
//
// Lines look like
//   2026-11-22 07:47:47.123 I data    [12345] message
// and go to stderr, so stdout stays free for results.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <spdlog/spdlog.h>

namespace troupe {

struct LoggingOptions {
  // trace, debug, info, warn, error, critical, off.
  std::string level = "info";
  // Optional per-logger levels, "data=debug,kernels=warn".
  std::string perLogger;
  // Role shown on each line ("main", "worker/3", "ps/0", ...).
  std::string role = "main";
};

// Applies options to every existing and future troupe logger. Throws
// SetupError naming the bad level. Thread-safe; later calls replace earlier.
void configureLogging(const LoggingOptions& options);

// Also writes every troupe logger's lines to `path` (appending), e.g. a run
// directory's log. Throws SetupError when the file cannot be opened.
void addLogFile(const std::string& path);

// The logger of one folder, created on first use with the configured level.
std::shared_ptr<spdlog::logger> logger(std::string_view name);

// Parses "info", "warn", ...; throws SetupError on an unknown name.
spdlog::level::level_enum parseLogLevel(std::string_view name);

}  // namespace troupe
