#include "common/metrics_registry.h"

#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

namespace troupe {
namespace {

// The text format's escapes: backslash and newline (HELP), and in label
// values the double quote too.
std::string escaped(const std::string& v, bool quotes) {
  std::string out;
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && quotes) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

std::string number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", v);  // (the shortest text that reads back as v)
}

}  // namespace

bool MetricsRegistry::validName(const std::string& name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
                    (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

bool MetricsRegistry::validLabelName(const std::string& name) {
  return validName(name) && name.find(':') == std::string::npos && name.rfind("__", 0) != 0;
}

MetricsRegistry::Metric& MetricsRegistry::metricLocked(const std::string& name) {
  if (!validName(name)) throw std::invalid_argument("metrics: '" + name + "' is not a metric name");
  return metrics_[name];
}

void MetricsRegistry::declare(const std::string& name, Type type, const std::string& help) {
  std::lock_guard<std::mutex> lock(mutex_);
  const bool fresh = metrics_.count(name) == 0;
  Metric& m = metricLocked(name);
  if (fresh) {
    m.type = type;
    m.help = help;
  }
}

void MetricsRegistry::set(const std::string& name, const Labels& labels, double value) {
  for (const auto& [k, v] : labels) {
    if (!validLabelName(k)) throw std::invalid_argument("metrics: '" + k + "' is not a label name");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  metricLocked(name).values[labels] = value;
}

void MetricsRegistry::add(const std::string& name, const Labels& labels, double delta) {
  for (const auto& [k, v] : labels) {
    if (!validLabelName(k)) throw std::invalid_argument("metrics: '" + k + "' is not a label name");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  metricLocked(name).values[labels] += delta;
}

std::string MetricsRegistry::render() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string out;
  for (const auto& [name, m] : metrics_) {
    if (m.values.empty()) continue;
    out += fmt::format("# HELP {} {}\n", name, escaped(m.help.empty() ? name : m.help, false));
    out += fmt::format("# TYPE {} {}\n", name, m.type == Type::kCounter ? "counter" : "gauge");
    for (const auto& [labels, value] : m.values) {
      out += name;
      if (!labels.empty()) {
        out += '{';
        for (size_t i = 0; i < labels.size(); ++i) {
          out += fmt::format("{}{}=\"{}\"", i ? "," : "", labels[i].first, escaped(labels[i].second, true));
        }
        out += '}';
      }
      out += ' ';
      out += number(value);
      out += '\n';
    }
  }
  return out;
}

}  // namespace troupe
