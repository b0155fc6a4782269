#include "common/logging.h"

#include <map>
#include <vector>
#include <mutex>

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>

#include "common/check.h"

namespace troupe {
namespace {

// Logger settings live in spdlog's own registry (the one process-wide logging
// facility); this only remembers the per-logger overrides to apply to loggers
// made later.
struct LevelTable {
  std::mutex mu;
  spdlog::level::level_enum fallback = spdlog::level::info;
  std::map<std::string, spdlog::level::level_enum, std::less<>> perLogger;
  std::string pattern = "%Y-%m-%d %H:%M:%S.%e %L %-7n [%P main] %v";
  std::vector<spdlog::sink_ptr> extraSinks;
};

LevelTable& levels() {
  static LevelTable table;
  return table;
}

spdlog::level::level_enum levelFor(LevelTable& t, std::string_view name) {
  auto it = t.perLogger.find(name);
  return it == t.perLogger.end() ? t.fallback : it->second;
}

}  // namespace

spdlog::level::level_enum parseLogLevel(std::string_view name) {
  static const std::pair<const char*, spdlog::level::level_enum> kLevels[] = {
      {"trace", spdlog::level::trace}, {"debug", spdlog::level::debug},
      {"info", spdlog::level::info},   {"warn", spdlog::level::warn},
      {"warning", spdlog::level::warn}, {"error", spdlog::level::err},
      {"critical", spdlog::level::critical}, {"off", spdlog::level::off}};
  for (const auto& [text, level] : kLevels) {
    if (name == text) return level;
  }
  TROUPE_SETUP_ERROR("unknown log level '{}' (expected trace, debug, info, warn, error, critical or off)",
                     name);
}

void configureLogging(const LoggingOptions& options) {
  auto& t = levels();
  std::lock_guard lock(t.mu);
  t.fallback = parseLogLevel(options.level);
  t.perLogger.clear();
  std::string_view rest = options.perLogger;
  while (!rest.empty()) {
    auto comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    if (item.empty()) continue;
    auto eq = item.find('=');
    if (eq == std::string_view::npos || eq == 0) {
      TROUPE_SETUP_ERROR("bad per-logger level '{}' (expected name=level)", item);
    }
    t.perLogger.emplace(std::string(item.substr(0, eq)), parseLogLevel(item.substr(eq + 1)));
  }
  t.pattern = fmt::format("%Y-%m-%d %H:%M:%S.%e %L %-7n [%P {}] %v", options.role);
  spdlog::apply_all([&](const std::shared_ptr<spdlog::logger>& l) {
    l->set_level(levelFor(t, l->name()));
    l->set_pattern(t.pattern);
  });
  for (auto& sink : t.extraSinks) sink->set_pattern(t.pattern);
}

void addLogFile(const std::string& path) {
  spdlog::sink_ptr sink;
  try {
    sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(path);
  } catch (const spdlog::spdlog_ex& e) {
    TROUPE_SETUP_ERROR("cannot open log file '{}': {}", path, e.what());
  }
  auto& t = levels();
  std::lock_guard lock(t.mu);
  sink->set_pattern(t.pattern);
  t.extraSinks.push_back(sink);
  spdlog::apply_all([&](const std::shared_ptr<spdlog::logger>& l) { l->sinks().push_back(sink); });
}

std::shared_ptr<spdlog::logger> logger(std::string_view name) {
  auto& t = levels();
  std::lock_guard lock(t.mu);
  std::string key(name);
  if (auto existing = spdlog::get(key)) return existing;
  std::vector<spdlog::sink_ptr> sinks{std::make_shared<spdlog::sinks::stderr_sink_mt>()};
  sinks.insert(sinks.end(), t.extraSinks.begin(), t.extraSinks.end());
  auto l = std::make_shared<spdlog::logger>(key, sinks.begin(), sinks.end());
  l->set_level(levelFor(t, name));
  l->set_pattern(t.pattern);
  l->flush_on(spdlog::level::warn);
  spdlog::register_logger(l);
  return l;
}

}  // namespace troupe
