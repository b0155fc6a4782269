// The job's live counters, as Prometheus reads them: a registry of gauges
// and counters (a name, its help, its type, and values by label set) that
// any thread sets and any thread renders in the text exposition format
// (version 0.0.4: # HELP and # TYPE lines, then `name{label="value"} v`).
// apps/metrics_server.h serves it over HTTP (--metrics-port).
//
// Names must match [a-zA-Z_:][a-zA-Z0-9_:]* and label names
// [a-zA-Z_][a-zA-Z0-9_]* (checked: an invalid one throws
// std::invalid_argument); label values are escaped (\, " and newline).
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace troupe {

class MetricsRegistry {
 public:
  using Labels = std::vector<std::pair<std::string, std::string>>;
  enum class Type { kGauge, kCounter };

  // Declares a metric (again: keeps the first help and type).
  void declare(const std::string& name, Type type, const std::string& help);
  // Sets a value (a gauge, or a counter's total); declares it as a gauge
  // with no help if it was not declared.
  void set(const std::string& name, const Labels& labels, double value);
  void set(const std::string& name, double value) { set(name, {}, value); }
  // Adds to a value (counters).
  void add(const std::string& name, const Labels& labels, double delta);
  void add(const std::string& name, double delta) { add(name, {}, delta); }
  // The text exposition of every metric, in name order.
  std::string render() const;

  static bool validName(const std::string& name);
  static bool validLabelName(const std::string& name);

 private:
  struct Metric {
    Type type = Type::kGauge;
    std::string help;
    std::map<Labels, double> values;
  };
  Metric& metricLocked(const std::string& name);
  mutable std::mutex mutex_;
  std::map<std::string, Metric> metrics_;
};

}  // namespace troupe
