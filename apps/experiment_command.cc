#include "apps/experiment_command.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "actors/launcher.h"
#include "apps/cli_common.h"
#include "common/check.h"
#include "common/logging.h"

namespace troupe::apps {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

struct ExperimentFlags {
  CommonFlags common;
  std::vector<std::string> sweeps;
  int64_t repeats = 1;
  std::string out;
  std::string target;  // metric=value, e.g. auc=0.82
  int64_t runTimeout = 1800;
};

struct Sweep {
  std::string key;
  std::vector<std::string> values;
};

// The values of a sweep: split at commas outside brackets and quotes (a
// value may be a list: model.hidden=[128,64]).
std::vector<std::string> splitValues(const std::string& text) {
  std::vector<std::string> out;
  std::string item;
  int depth = 0;
  bool quoted = false;
  for (char c : text) {
    if (c == '"') quoted = !quoted;
    if (!quoted && (c == '[' || c == '{')) ++depth;
    if (!quoted && (c == ']' || c == '}')) --depth;
    if (depth < 0) break;
    if (c == ',' && depth == 0 && !quoted) {
      out.push_back(item);
      item.clear();
    } else {
      item += c;
    }
  }
  out.push_back(item);
  if (depth != 0 || quoted) TROUPE_SETUP_ERROR("--sweep values '{}': unbalanced brackets or quotes", text);
  for (auto& v : out) {
    while (!v.empty() && v.front() == ' ') v.erase(v.begin());
    while (!v.empty() && v.back() == ' ') v.pop_back();
  }
  return out;
}

std::string trimmed(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
}

// Parts of K1|K2 (or A1|A2), each trimmed.
std::vector<std::string> splitBar(const std::string& text) {
  std::vector<std::string> out;
  size_t from = 0;
  for (size_t bar; (bar = text.find('|', from)) != std::string::npos; from = bar + 1) {
    out.push_back(trimmed(text.substr(from, bar - from)));
  }
  out.push_back(trimmed(text.substr(from)));
  return out;
}

// The config assignments of one value of a sweep: KEY=VALUE, or for keys
// swept together (K1|K2=V1|V2,...) one a key.
std::vector<std::string> assignments(const Sweep& s, const std::string& value) {
  const auto keys = splitBar(s.key);
  if (keys.size() == 1) return {s.key + "=" + value};
  const auto values = splitBar(value);
  std::vector<std::string> out;
  for (size_t i = 0; i < keys.size() && i < values.size(); ++i) out.push_back(keys[i] + "=" + values[i]);
  return out;
}

std::vector<Sweep> parseSweeps(const std::vector<std::string>& specs) {
  std::vector<Sweep> out;
  for (const auto& spec : specs) {
    const size_t eq = spec.find('=');
    if (eq == std::string::npos || eq == 0) {
      TROUPE_SETUP_ERROR("--sweep '{}': give KEY=V1,V2,... (a config key and its values)", spec);
    }
    Sweep s{spec.substr(0, eq), splitValues(spec.substr(eq + 1))};
    const auto keys = splitBar(s.key);
    for (size_t i = 0; i < keys.size(); ++i) {
      if (keys[i].empty()) TROUPE_SETUP_ERROR("--sweep '{}': an empty key", spec);
      for (size_t j = 0; j < i; ++j) {
        if (keys[j] == keys[i]) TROUPE_SETUP_ERROR("--sweep: {} is swept twice", keys[i]);
      }
    }
    for (const auto& v : s.values) {
      if (v.empty()) TROUPE_SETUP_ERROR("--sweep '{}': an empty value", spec);
      if (keys.size() > 1) {
        const auto parts = splitBar(v);
        if (parts.size() != keys.size()) {
          TROUPE_SETUP_ERROR("--sweep '{}': the value '{}' has {} parts for the {} keys swept together "
                             "(K1|K2=A1|A2,...)",
                             spec, v, parts.size(), keys.size());
        }
        for (const auto& part : parts) {
          if (part.empty()) TROUPE_SETUP_ERROR("--sweep '{}': the value '{}' has an empty part", spec, v);
        }
      }
    }
    for (const auto& o : out) {
      for (const auto& k : splitBar(o.key)) {
        if (std::find(keys.begin(), keys.end(), k) != keys.end()) TROUPE_SETUP_ERROR("--sweep: {} is swept twice", k);
      }
    }
    out.push_back(std::move(s));
  }
  if (out.empty()) TROUPE_SETUP_ERROR("experiment: give at least one --sweep KEY=V1,V2,...");
  return out;
}

// What one run gave (or why it gave nothing).
struct RunRow {
  int64_t index = 0;
  std::vector<std::string> values;  // one a sweep
  int64_t repeat = 0;
  int64_t seed = 0;                 // its run.seed
  std::string status = "ok";        // or why it failed
  std::string metric;               // auc or accuracy
  std::optional<double> final, best, loss, samplesPerSec, trainSeconds, wallSeconds, stalenessMean,
      timeToTarget, pullWait, collectiveWait;
  std::optional<int64_t> steps, samples, stalenessP50, stalenessP99, stalenessMax, wireBytes, stepsToTarget;
  std::vector<int64_t> staleness;           // its histogram (ps modes)
  std::vector<std::pair<double, double>> curve;  // (elapsed s, metric) of its evaluations during training
  std::vector<std::pair<double, double>> curveBySamples;  // (samples trained, metric), where metrics.csv has them
  std::string label;
  std::string shortLabel;  // the plots' (keys swept together: their values only)
};

// A markdown table cell: no '|' or line breaks of its own.
std::string mdCell(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '|') {
      out += "\\|";
    } else {
      out += (c == '\n' || c == '\r') ? ' ' : c;
    }
  }
  return out;
}

// A label for gnuplot's data file, whose quoted fields have no escape: no
// double quotes or control characters.
std::string plotLabel(const std::string& v) {
  std::string out;
  for (char c : v) out += c == '"' ? '\'' : (static_cast<unsigned char>(c) < 0x20 ? ' ' : c);
  return out;
}

std::string csvField(const std::string& v) {
  if (v.find_first_of(",\"\n") == std::string::npos) return v;
  std::string out = "\"";
  for (char c : v) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

template <class T>
std::string opt(const std::optional<T>& v) {
  if (!v) return "";
  if constexpr (std::is_floating_point_v<T>) return fmt::format("{:.6g}", *v);
  return std::to_string(*v);
}

// Reads a run's summary (and its metrics.csv: evaluations during training).
void readRun(const std::string& summaryPath, const std::string& runDir, const std::string& targetMetric,
             std::optional<double> targetValue, RunRow* r) {
  std::ifstream in(summaryPath);
  if (!in) {
    if (r->status == "ok") r->status = "no summary (" + summaryPath + ")";
    return;
  }
  Json j;
  try {
    j = Json::parse(in);
  } catch (const Json::exception& e) {
    r->status = fmt::format("{}: {}", summaryPath, e.what());
    return;
  }
  const bool binary = j.contains("test_auc");
  r->metric = binary ? "auc" : "accuracy";
  auto num = [&](const char* k) -> std::optional<double> {
    return j.contains(k) && j.at(k).is_number() ? std::optional<double>(j.at(k).get<double>()) : std::nullopt;
  };
  auto whole = [&](const char* k) -> std::optional<int64_t> {
    return j.contains(k) && j.at(k).is_number() ? std::optional<int64_t>(j.at(k).get<int64_t>()) : std::nullopt;
  };
  r->final = num(binary ? "test_auc" : "test_accuracy");
  r->loss = num(binary ? "test_logloss" : "test_loss");
  r->samplesPerSec = num("samples_per_sec");
  r->trainSeconds = num("train_seconds");
  r->wallSeconds = num("wall_seconds");
  r->steps = whole("steps");
  r->samples = whole("samples");
  if (j.contains("push_staleness") && j.at("push_staleness").is_object()) {
    const Json& s = j.at("push_staleness");
    if (s.value("pushes", int64_t{0}) > 0) {
      r->stalenessMean = s.value("mean", 0.0);
      r->stalenessP50 = s.value("p50", int64_t{-1});
      r->stalenessP99 = s.value("p99", int64_t{-1});
      r->stalenessMax = s.value("max", int64_t{-1});
      r->staleness = s.value("histogram", std::vector<int64_t>{});
    }
  }
  if (j.contains("wait_fractions") && j.at("wait_fractions").is_object()) {
    const Json& w = j.at("wait_fractions");
    if (w.contains("pull") && w.at("pull").is_number()) r->pullWait = w.at("pull").get<double>();
    if (w.contains("collective") && w.at("collective").is_number()) r->collectiveWait = w.at("collective").get<double>();
  }
  if (j.contains("wire") && j.at("wire").is_array()) {
    int64_t bytes = 0;
    for (const auto& w : j.at("wire")) bytes += w.value("wire_bytes", int64_t{0});
    r->wireBytes = bytes;
  }
  r->best = r->final;
  // Evaluations during training (metrics.csv: epoch,step,elapsed_s,rows,loss,auc,accuracy).
  std::ifstream metrics(runDir + "/metrics.csv");
  std::string line;
  std::getline(metrics, line);  // header
  while (std::getline(metrics, line)) {
    std::vector<std::string> f;
    std::stringstream ss(line);
    std::string cell;
    while (std::getline(ss, cell, ',')) f.push_back(cell);
    if (f.size() < 7) continue;
    char* endElapsed = nullptr;
    char* endValue = nullptr;
    const std::string& cellValue = binary ? f[5] : f[6];
    const double elapsed = std::strtod(f[2].c_str(), &endElapsed);
    const double value = std::strtod(cellValue.c_str(), &endValue);
    if (endElapsed == f[2].c_str() || endValue == cellValue.c_str() || !std::isfinite(value)) continue;
    r->curve.emplace_back(elapsed, value);
    if (f.size() >= 9) {
      char* endSamples = nullptr;
      const double samples = std::strtod(f[7].c_str(), &endSamples);
      if (endSamples != f[7].c_str()) r->curveBySamples.emplace_back(samples, value);
    }
    r->best = r->best ? std::max(*r->best, value) : value;
    if (targetValue && targetMetric == r->metric && value >= *targetValue && !r->timeToTarget) {
      r->timeToTarget = elapsed;
      r->stepsToTarget = std::strtoll(f[1].c_str(), nullptr, 10);
    }
  }
}

std::string machine() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  return fmt::format("{} ({} cores)", host, std::max(1u, std::thread::hardware_concurrency()));
}

// The plots: gnuplot draws each from a data file; false (and why) when it
// cannot.
bool drawPlots(const std::string& dir, const std::vector<RunRow>& rows, const std::string& keyTitle,
               std::vector<std::string>* pictures, std::string* why) {
  const std::string plots = dir + "/plots";
  std::error_code ec;
  fs::create_directories(plots, ec);
  if (ec) {
    *why = fmt::format("cannot make {}: {}", plots, ec.message());
    return false;
  }
  // (nothing of an earlier experiment in the same place: its pictures, data, log)
  for (const char* old : {"metric.png", "rate.png", "target.png", "staleness.png", "curves.png", "curves-samples.png"}) {
    fs::remove(dir + "/" + old, ec);
  }
  for (const auto& e : fs::directory_iterator(plots, ec)) fs::remove(e.path(), ec);
  std::string gp =
      "set terminal pngcairo size 1100,620 font 'Sans,10' noenhanced\nset grid ytics\nset key outside right\n";
  auto quoted = [](const std::string& s) {
    std::string out;
    for (char c : s) out += c == '\'' ? std::string("''") : std::string(1, c);
    return "'" + out + "'";
  };
  // Bars: one a run, the final metric and the rate.
  {
    std::ofstream d(plots + "/runs.dat");
    for (const auto& r : rows) {
      d << fmt::format("\"{}\" {} {} {}\n", plotLabel(r.shortLabel), r.final ? fmt::format("{:.6g}", *r.final) : "NaN",
                       r.samplesPerSec ? fmt::format("{:.6g}", *r.samplesPerSec) : "NaN",
                       r.timeToTarget ? fmt::format("{:.6g}", *r.timeToTarget) : "NaN");
    }
  }
  const bool anyFinal = std::any_of(rows.begin(), rows.end(), [](const RunRow& r) { return r.final.has_value(); });
  std::string metric = "metric";
  for (const auto& r : rows) {
    if (r.final && !r.metric.empty()) {
      metric = "test " + r.metric;
      break;
    }
  }
  std::vector<std::string> drawn;  // the pictures the script draws
  if (anyFinal) {
    gp += "set style data histograms\nset style fill solid 0.8 border -1\nset boxwidth 0.8\nset xtics rotate by -30\n";
    gp += fmt::format("set output {}\nset title {}\nset ylabel {}\nset xlabel 'run'\nset yrange [*:*]\n"
                      "plot {} using 2:xtic(1) title {} lc rgb '#3465a4'\n",
                      quoted(dir + "/metric.png"), quoted("Final " + metric + " by run"), quoted(metric),
                      quoted(plots + "/runs.dat"), quoted(metric));
    gp += fmt::format("set output {}\nset title 'Training rate by run'\nset ylabel 'samples/s'\n"
                      "plot {} using 3:xtic(1) title 'samples/s' lc rgb '#73d216'\n",
                      quoted(dir + "/rate.png"), quoted(plots + "/runs.dat"));
    drawn.push_back("metric.png");
    drawn.push_back("rate.png");
  }
  if (std::any_of(rows.begin(), rows.end(), [](const RunRow& r) { return r.timeToTarget.has_value(); })) {
    gp += fmt::format("set output {}\nset title 'Time to the target (runs that reached it)'\n"
                      "set ylabel 'worker 0''s seconds of training'\nset yrange [0:*]\n"
                      "plot {} using 4:xtic(1) title 'seconds to the target' lc rgb '#cc0000'\n",
                      quoted(dir + "/target.png"), quoted(plots + "/runs.dat"));
    drawn.push_back("target.png");
  }
  gp += "set style data linespoints\nset xtics norotate\nset key outside right\n";
  if (!keyTitle.empty()) gp += fmt::format("set key title {}\n", quoted(keyTitle));
  // Staleness histograms (ps modes), one line a run.
  std::vector<std::string> lines;
  for (const auto& r : rows) {
    if (r.staleness.empty()) continue;
    const std::string file = plots + fmt::format("/staleness-{:03d}.dat", r.index);
    std::ofstream d(file);
    int64_t total = 0;
    for (int64_t c : r.staleness) total += c;
    for (size_t k = 0; k < r.staleness.size(); ++k) d << k << " " << double(r.staleness[k]) / double(total) << "\n";
    lines.push_back(fmt::format("{} using 1:2 title {}", quoted(file), quoted(plotLabel(r.shortLabel))));
  }
  if (!lines.empty()) {
    gp += fmt::format("set output {}\nset title 'Staleness: updates a push missed'\nset xlabel 'updates missed'\n"
                      "set ylabel 'share of pushes'\nset yrange [0:*]\nplot {}\n",
                      quoted(dir + "/staleness.png"), fmt::join(lines, ", "));
    drawn.push_back("staleness.png");
  }
  // The metric against worker 0's training seconds and against the samples
  // trained, from the evaluations in metrics.csv: a line a run.
  auto curves = [&](const std::string& png, const char* data, const char* against, const std::string& xlabel,
                    const std::string& xformat, auto series) {
    std::vector<std::string> runs;
    for (const auto& r : rows) {
      const std::vector<std::pair<double, double>>& points = series(r);
      if (points.size() < 2) continue;
      const std::string file = plots + fmt::format("/{}-{:03d}.dat", data, r.index);
      std::ofstream d(file);
      for (const auto& [x, v] : points) d << x << " " << v << "\n";
      runs.push_back(fmt::format("{} using 1:2 title {}", quoted(file), quoted(plotLabel(r.shortLabel))));
    }
    if (runs.empty()) return;
    gp += fmt::format("set output {}\nset title {}\nset xlabel {}\nset ylabel {}\nset format x {}\n"
                      "set yrange [*:*]\nplot {}\nset format x '%g'\n",
                      quoted(dir + "/" + png), quoted(metric + " against " + against), quoted(xlabel),
                      quoted(metric), quoted(xformat), fmt::join(runs, ", "));
    drawn.push_back(png);
  };
  curves("curves.png", "curve", "time", "worker 0's seconds of training", "%g",
         [](const RunRow& r) -> const auto& { return r.curve; });
  curves("curves-samples.png", "samples", "samples", "samples trained", "%.0s%c",
         [](const RunRow& r) -> const auto& { return r.curveBySamples; });
  {
    std::ofstream s(plots + "/plots.gp");
    s << gp;
  }
  if (drawn.empty()) {
    *why = "no run gave anything to draw";
    return false;
  }
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) {
    *why = "gnuplot is not installed (Debian: gnuplot-nox; scripts/setup.sh installs it)";
    return false;
  }
  actors::ChildProcess child({"gnuplot", plots + "/plots.gp"}, plots + "/gnuplot.log");
  const bool ok = child.wait(std::chrono::seconds(120));
  if (!ok && !child.poll()) child.kill();
  for (const auto& p : drawn) {
    if (fs::exists(dir + "/" + p)) pictures->push_back(p);
  }
  if (!ok) {
    *why = fmt::format("gnuplot failed (see {}/gnuplot.log){}", plots,
                       pictures->empty() ? "" : fmt::format("; it drew {} of {}", pictures->size(), drawn.size()));
    return false;
  }
  return true;
}

int runExperiment(const ExperimentFlags& f) {
  if (f.common.configPath.empty()) TROUPE_SETUP_ERROR("experiment: give the runs' config (--config FILE)");
  if (f.repeats < 1 || f.repeats > 100) TROUPE_SETUP_ERROR("experiment: --repeats must be 1 to 100, got {}", f.repeats);
  if (f.runTimeout < 1 || f.runTimeout > 10000000) {
    TROUPE_SETUP_ERROR("experiment: --run-timeout must be 1 to 10000000 s, got {}", f.runTimeout);
  }
  const std::vector<Sweep> sweeps = parseSweeps(f.sweeps);
  for (const auto& sw : sweeps) {
    for (const auto& key : splitBar(sw.key)) {
      if (key == "run.dir" || key == "run.name") {
        TROUPE_SETUP_ERROR("--sweep {}: the experiment names each run's directory itself (--out)", key);
      }
      if (key == "run.seed" && sw.key != "run.seed") {
        TROUPE_SETUP_ERROR("--sweep {}: sweep run.seed on its own (--sweep run.seed=...) or use --repeats", sw.key);
      }
    }
    if (sw.key == "run.seed" && f.repeats > 1) {
      TROUPE_SETUP_ERROR("--sweep run.seed with --repeats {}: the repeats take seeds of their own (run.seed + "
                         "repeat); sweep the seed or repeat, not both", f.repeats);
    }
  }
  std::string targetMetric;
  std::optional<double> targetValue;
  if (!f.target.empty()) {
    const size_t eq = f.target.find('=');
    char* end = nullptr;
    const std::string metric = eq == std::string::npos ? "" : f.target.substr(0, eq);
    const double v = eq == std::string::npos ? 0 : std::strtod(f.target.c_str() + eq + 1, &end);
    if ((metric != "auc" && metric != "accuracy") || !end || *end != '\0' || end == f.target.c_str() + eq + 1) {
      TROUPE_SETUP_ERROR("experiment: --target must be auc=VALUE or accuracy=VALUE, got '{}'", f.target);
    }
    targetMetric = metric;
    targetValue = v;
  }
  // The config, and every value of every sweep on it, checked before any
  // run (an unknown key or a value of the wrong type stops here).
  Config config = loadConfig(f.common);
  for (const auto& sw : sweeps) {
    for (const auto& v : sw.values) {
      Config probe = config;
      for (const auto& a : assignments(sw, v)) probe.set(a);
    }
  }
  const int64_t baseSeed = config.getInt("run.seed");
  std::string dir = f.out;
  if (dir.empty()) {
    const std::time_t now = std::time(nullptr);
    char stamp[32];
    std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&now));
    dir = config.getString("run.dir") + "/experiment-" + stamp;
  }
  {
    std::error_code ec;
    fs::create_directories(dir + "/runs", ec);
    if (ec) TROUPE_SETUP_ERROR("experiment: cannot make {}/runs: {}", dir, ec.message());
  }
  // The grid, the first sweep varying slowest.
  size_t total = size_t(f.repeats);
  for (const auto& s : sweeps) total *= s.values.size();
  if (total > 10000) TROUPE_SETUP_ERROR("experiment: {} runs; at most 10000", total);
  std::vector<RunRow> rows;
  for (size_t i = 0; i < total; ++i) {
    RunRow r;
    r.index = int64_t(i);
    size_t rest = i;
    r.repeat = int64_t(rest % size_t(f.repeats));
    r.seed = baseSeed + r.repeat;
    rest /= size_t(f.repeats);
    r.values.resize(sweeps.size());
    for (size_t k = sweeps.size(); k-- > 0;) {
      r.values[k] = sweeps[k].values[rest % sweeps[k].values.size()];
      rest /= sweeps[k].values.size();
    }
    std::vector<std::string> parts, shortParts;
    for (size_t k = 0; k < sweeps.size(); ++k) {
      for (const auto& a : assignments(sweeps[k], r.values[k])) parts.push_back(a);
      shortParts.push_back(sweeps[k].key.find('|') == std::string::npos ? sweeps[k].key + "=" + r.values[k]
                                                                         : fmt::format("{}", fmt::join(splitBar(r.values[k]), " ")));
      if (sweeps[k].key == "run.seed") r.seed = std::strtoll(r.values[k].c_str(), nullptr, 10);
    }
    const std::string repeat = f.repeats > 1 ? fmt::format(" #{}", r.repeat + 1) : "";
    r.label = fmt::format("{}", fmt::join(parts, " ")) + repeat;
    r.shortLabel = fmt::format("{}", fmt::join(shortParts, " ")) + repeat;
    rows.push_back(std::move(r));
  }
  std::printf("experiment: %zu runs in %s\n", rows.size(), dir.c_str());
  std::fflush(stdout);
  int failed = 0;
  for (auto& r : rows) {
    const std::string name = fmt::format("run-{:03d}", r.index);
    std::vector<std::string> argv = {actors::selfExe(), "train", "--config", f.common.configPath};
    for (const auto& s : f.common.overrides) argv.insert(argv.end(), {"--set", s});
    for (size_t k = 0; k < sweeps.size(); ++k) {
      for (const auto& a : assignments(sweeps[k], r.values[k])) argv.insert(argv.end(), {"--set", a});
    }
    for (const auto& s : f.common.faults) argv.insert(argv.end(), {"--fault", s});
    if (!f.common.logLevel.empty()) argv.insert(argv.end(), {"--log-level", f.common.logLevel});
    if (f.common.threads >= 0) argv.insert(argv.end(), {"--threads", std::to_string(f.common.threads)});
    // A repeat draws its own data order and initialisation (run.seed + repeat).
    if (f.repeats > 1) argv.insert(argv.end(), {"--set", fmt::format("run.seed={}", r.seed)});
    argv.insert(argv.end(), {"--set", "run.dir=" + dir + "/runs", "--set", "run.name=" + name, "--summary-json",
                             dir + "/runs/" + name + ".json"});
    std::error_code ec;
    fs::remove_all(dir + "/runs/" + name, ec);
    fs::remove(dir + "/runs/" + name + ".json", ec);
    const std::string log = dir + "/runs/" + name + ".log";
    fs::remove(log, ec);
    std::optional<int> status;
    {
      actors::ChildProcess child(argv, log);
      if (child.wait(std::chrono::seconds(f.runTimeout))) {
        status = 0;
      } else {
        status = child.poll();
        if (!status) {
          r.status = fmt::format("no end within {} s (--run-timeout)", f.runTimeout);
          child.stop(std::chrono::seconds(60));
        }
      }
    }
    if (status && *status != 0) {
      // The run's own one-line error, if it printed one.
      std::ifstream in(log);
      std::string line, last;
      while (std::getline(in, line)) {
        for (const std::string prefix : {"troupe: error: ", "troupe: internal error: "}) {
          if (line.rfind(prefix, 0) == 0) last = line.substr(prefix == "troupe: error: " ? prefix.size() : 8);
        }
      }
      if (!last.empty()) {
        r.status = last;
      } else if (*status < 0) {
        r.status = fmt::format("troupe train was killed by signal {} ({}) (see {})", -*status, strsignal(-*status), log);
      } else {
        r.status = fmt::format("troupe train exited with status {} (see {})", *status, log);
      }
    }
    if (r.status == "ok") readRun(dir + "/runs/" + name + ".json", dir + "/runs/" + name, targetMetric, targetValue, &r);
    if (r.status != "ok") ++failed;
    std::printf("  %s  %s: %s\n", name.c_str(), r.label.c_str(),
                r.status == "ok" ? fmt::format("test {} {}", r.metric, opt(r.final)).c_str() : r.status.c_str());
    std::fflush(stdout);
  }
  // The table.
  std::vector<std::string> header = {"run"};
  for (const auto& s : sweeps) header.push_back(s.key);
  for (const char* c : {"repeat", "seed", "status", "metric", "final", "best", "loss", "time_to_target_s", "steps_to_target",
                        "samples_per_sec", "train_seconds", "wall_seconds", "steps", "samples", "staleness_mean",
                        "staleness_p50", "staleness_p99", "staleness_max", "pull_wait_fraction",
                        "collective_fraction", "wire_bytes"}) {
    header.push_back(c);
  }
  std::string csv;
  for (size_t i = 0; i < header.size(); ++i) csv += (i ? "," : "") + csvField(header[i]);
  csv += "\n";
  for (const auto& r : rows) {
    std::vector<std::string> cells = {std::to_string(r.index)};
    for (const auto& v : r.values) cells.push_back(v);
    for (const std::string& c :
         {std::to_string(r.repeat), std::to_string(r.seed), r.status, r.metric, opt(r.final), opt(r.best), opt(r.loss), opt(r.timeToTarget),
          opt(r.stepsToTarget), opt(r.samplesPerSec), opt(r.trainSeconds), opt(r.wallSeconds), opt(r.steps),
          opt(r.samples), opt(r.stalenessMean), opt(r.stalenessP50), opt(r.stalenessP99), opt(r.stalenessMax),
          opt(r.pullWait), opt(r.collectiveWait), opt(r.wireBytes)}) {
      cells.push_back(c);
    }
    for (size_t i = 0; i < cells.size(); ++i) csv += (i ? "," : "") + csvField(cells[i]);
    csv += "\n";
  }
  {
    std::ofstream out(dir + "/experiment.csv");
    out << csv;
    if (!out) std::fprintf(stderr, "troupe: experiment: cannot write %s/experiment.csv\n", dir.c_str());
  }
  std::vector<std::string> pictures;
  std::string noPlots;
  // Keys swept together appear by their values in the plots' legends, under these names.
  std::vector<std::string> together;
  for (const auto& sw : sweeps) {
    if (sw.key.find('|') != std::string::npos) together.push_back(fmt::format("{}", fmt::join(splitBar(sw.key), " ")));
  }
  const bool plotted = drawPlots(dir, rows, fmt::format("{}", fmt::join(together, "; ")), &pictures, &noPlots);
  // The report.
  std::string md = "# troupe experiment\n\n";
  const std::time_t now = std::time(nullptr);
  char when[64];
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&now));
  md += fmt::format("- when: {}\n- machine: {}\n- config: `{}`", when, machine(), f.common.configPath);
  for (const auto& s : f.common.overrides) md += fmt::format(" `--set {}`", s);
  for (const auto& s : f.common.faults) md += fmt::format(" `--fault {}`", s);
  md += "\n";
  for (const auto& s : sweeps) md += fmt::format("- sweep: `{}` over {}\n", s.key, fmt::join(s.values, ", "));
  md += fmt::format("- runs: {} ({} failed), {} repeat(s) each; each run's directory is under `runs/`\n", rows.size(),
                    failed, f.repeats);
  if (targetValue) md += fmt::format("- target: test {} >= {}\n", targetMetric, *targetValue);
  md += "\n| run | setting | status | test metric | best | samples/s | train s | staleness p50 / p99 / max | wire bytes |\n";
  md += "|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& r : rows) {
    md += fmt::format("| {} | {} | {} | {} {} | {} | {} | {} | {} | {} |\n", r.index, mdCell(r.label), mdCell(r.status),
                      r.metric,
                      opt(r.final), opt(r.best), opt(r.samplesPerSec), opt(r.trainSeconds),
                      r.stalenessP50 ? fmt::format("{} / {} / {}", *r.stalenessP50, *r.stalenessP99, *r.stalenessMax)
                                     : std::string("-"),
                      opt(r.wireBytes));
  }
  md += "\nThe whole table: `experiment.csv`.";
  if (targetValue) {
    md += " Time and steps to the target come from each run's evaluations in metrics.csv (its worker 0's "
          "training seconds and steps at the first evaluation that reached it: train.eval_every_steps or "
          "train.eval_every_seconds set how often; without them a job of processes evaluates only at the end).";
  }
  md += "\n\n";
  if (plotted) {
    for (const auto& p : pictures) md += fmt::format("![{}]({})\n\n", p, p);
  } else {
    md += fmt::format("No plots: {}.\n", noPlots);
  }
  {
    std::ofstream out(dir + "/report.md");
    out << md;
  }
  std::printf("experiment: %zu runs, %d failed; %s/experiment.csv, %s/report.md%s\n", rows.size(), failed, dir.c_str(),
              dir.c_str(), plotted ? fmt::format(", {} plots", pictures.size()).c_str() : (", no plots: " + noPlots).c_str());
  return failed > 0 ? kExitFailure : kExitOk;
}

}  // namespace

void addExperimentCommand(CLI::App* app, int* result) {
  auto flags = std::make_shared<ExperimentFlags>();
  auto* cmd = app->add_subcommand("experiment",
                                  "Run a grid of training runs (--sweep KEY=V1,V2,...), one after another, and write "
                                  "experiment.csv, plots and report.md");
  addCommonFlags(cmd, &flags->common);
  addFaultFlag(cmd, &flags->common);
  cmd->add_option("--sweep", flags->sweeps,
                  "a config key and its values, KEY=V1,V2,... (repeat for a grid); keys swept together: "
                  "K1|K2=A1|A2,B1|B2");
  cmd->add_option("--repeats", flags->repeats, "runs of every setting, each with its own run.seed (default 1)");
  cmd->add_option("--out", flags->out, "where the runs, the table and the report go (default: <run.dir>/experiment-<time>)");
  cmd->add_option("--target", flags->target, "a test metric to reach, auc=VALUE or accuracy=VALUE: time and steps to it");
  cmd->add_option("--run-timeout", flags->runTimeout, "a run not ended after this many seconds is stopped and "
                                                      "counted failed (default 1800)");
  cmd->callback([=] { *result = runGuarded([&] { return runExperiment(*flags); }); });
}

}  // namespace troupe::apps
