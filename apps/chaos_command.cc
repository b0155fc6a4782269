#include "apps/chaos_command.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "actors/fault_plan.h"
#include "actors/launcher.h"
#include "apps/cli_common.h"
#include "common/check.h"
#include "common/logging.h"
#include "workers/fault_report.h"

namespace troupe::apps {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

struct ChaosFlags {
  CommonFlags common;
  int64_t runs = 10;
  int64_t seed = 1;
  std::string mix = "kill,kill-actor,stop,slow,drop,dup,delay,reorder,corrupt,partition";
  std::string modes = "bsp,ssp,asp,allreduce,hybrid";
  std::string models = "dlrm,count,mlp";
  int64_t workers = 0;  // 0: the config's cluster.workers, at least 2
  int64_t servers = 2;
  int64_t replicas = 0;  // 0: the config's ps.replicas
  int64_t maxFaults = 3;
  int64_t runTimeout = 300;
  std::string dir;
};

std::vector<std::string> splitList(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// One run of the campaign: its mode, its faults, its config changes.
struct RunPlan {
  int64_t index = 0;
  std::string mode;
  std::string model;
  std::vector<std::string> faults;
  std::vector<std::string> sets;
};

// What a run of each model sets on top of the config: "dlrm" is the
// config's own model; "count" the exact-count model on the config's data
// in batches of `countBatch` (a quarter of the config's: its steps are
// quick), cut to whole steps of every worker (`countRows`); "mlp" the MLP
// on Fashion-MNIST (its first 20480 images: a short job).
std::vector<std::string> modelSets(const std::string& model, int64_t countRows, int64_t countBatch) {
  if (model == "count") {
    // (It counts exactly in a group that never shrinks: lost ranks are replaced.)
    return {"model.kind=count", fmt::format("data.max_train_rows={}", countRows),
            fmt::format("train.batch_size={}", countBatch), "supervision.on_worker_loss=restart"};
  }
  if (model == "mlp") {
    return {"data.kind=fashion-mnist", "data.train=", "model.kind=mlp", "data.max_train_rows=20480"};
  }
  return {};
}

RunPlan drawRun(const ChaosFlags& f, const std::vector<std::string>& mix, const std::vector<std::string>& modes,
                const std::vector<std::string>& models, int64_t countRows, int64_t countBatch, int64_t workers,
                int64_t i) {
  auto draw = [&](uint64_t k) { return actors::faultRandom(uint64_t(f.seed), uint64_t(100000 + i), k); };
  auto uniform = [&](uint64_t k, double lo, double hi) {
    return lo + (hi - lo) * double(draw(k) >> 11) / double(uint64_t(1) << 53);
  };
  RunPlan p;
  p.index = i;
  p.mode = modes[draw(0) % modes.size()];
  p.model = models[draw(5) % models.size()];
  // The MLP has no tables for the shards of a hybrid job: it trains all-reduced.
  if (p.model == "mlp" && p.mode == "hybrid") p.mode = "allreduce";
  const bool psMode = p.mode == "bsp" || p.mode == "ssp" || p.mode == "asp";
  const int64_t servers = p.mode == "allreduce" ? 0 : f.servers;
  const int64_t n = 1 + int64_t(draw(1) % uint64_t(f.maxFaults));
  // With replicas a lost shard's backup takes over (no checkpoint needed);
  // they survive one lost copy at a time, so a run loses one ps process.
  const bool replicated = servers > 0 && f.replicas == 2;
  bool psFault = false;
  for (int64_t j = 0; j < n; ++j) {
    const uint64_t k = 10 + uint64_t(j) * 10;
    const std::string kind = mix[draw(k) % mix.size()];
    const bool onPs = kind != "slow" && servers > 0 && draw(k + 1) % 3 == 0 && !(replicated && psFault);
    const int64_t rank = int64_t(draw(k + 2) % uint64_t(onPs ? servers : workers));
    const int64_t step = 5 + int64_t(draw(k + 3) % 56);
    const double at = uniform(k + 4, 0.0, 1.0), duration = uniform(k + 5, 0.3, 6.0);
    std::string spec;
    if (actors::isMessageFault(kind) && kind != "partition") {
      // Messages on the links between two kinds of process, both ways.
      static const char* ends[] = {"worker", "ps", "*"};
      const char* from = ends[draw(k + 6) % (servers > 0 ? 3 : 1)];
      const char* to = ends[draw(k + 7) % (servers > 0 ? 3 : 1)];
      spec = fmt::format("kind={},from={},to={},both_ways=true,p={:.3f}", kind, from, to, uniform(k + 8, 0.005, 0.05));
      if (kind == "delay") spec += fmt::format(",delay_ms=1-{}", 2 + int64_t(draw(k + 9) % 29));
      if (kind == "corrupt") spec += fmt::format(",bits={}", 1 + int64_t(draw(k + 9) % 4));
      p.faults.push_back(spec);
      continue;
    }
    if (kind == "partition") {
      // A process cut off from all others (a shard like a lost shard), for
      // 0.5 to 6 s: a cut longer than the heartbeat timeout loses it.
      if (onPs) psFault = true;
      spec = fmt::format("kind=partition,target={}:{},at_s={:.3f},duration_s={:.3f}", onPs ? "ps" : "worker", rank,
                         0.5 + 2 * at, uniform(k + 5, 0.5, 6.0));
      p.faults.push_back(spec);
      continue;
    }
    if (kind == "slow") {
      spec = fmt::format("kind=slow,target=worker:{},factor={:.2f},at_step={},steps={}", rank,
                         uniform(k + 6, 1.5, 4.0), step - 5, 10 + int64_t(draw(k + 7) % 71));
    } else if (onPs && replicated) {
      psFault = true;
      spec = fmt::format("kind={},target=ps:{},at_s={:.3f}", kind, rank, 0.2 + at);
      if (kind == "kill-actor") spec += draw(k + 9) % 2 ? ",actor=shard" : ",actor=backup";
    } else if (onPs) {
      psFault = true;
      // After the first checkpoint: a shard lost before it has nothing to roll back to.
      spec = fmt::format("kind={},target=ps:{},after_checkpoint=1,at_s={:.3f}", kind, rank, at);
      if (kind == "kill-actor") spec += ",actor=shard";
    } else {
      spec = fmt::format("kind={},target=worker:{},at_step={}", kind, rank, step);
      if (kind == "kill-actor") {
        // (an MLP trained by all-reduce has no tables)
        static const char* actors[] = {"worker", "train-loader", "test-loader", "tables"};
        const bool tables = !(p.model == "mlp" && servers == 0);
        spec += fmt::format(",actor={}", actors[draw(k + 9) % (tables ? 4 : 3)]);
      }
    }
    if (kind == "stop") spec += fmt::format(",duration_s={:.3f}", duration);
    p.faults.push_back(spec);
  }
  const std::string name = fmt::format("run-{:03d}", i);
  p.sets = {"cluster.workers=" + std::to_string(workers),
            "cluster.servers=" + std::to_string(servers),
            std::string("train.mode=") + (psMode ? "ps" : p.mode),
            std::string("ps.consistency=") + (psMode ? p.mode : "bsp"),
            "supervision.max_restarts=1000",
            "supervision.restart_window_s=1",
            fmt::format("faults.seed={}", f.seed * 1000 + i),
            "run.dir=" + f.dir + "/runs",
            "run.name=" + name};
  if (!psMode) p.sets.push_back("collectives.backend=ring");
  p.sets.push_back("checkpoint.dir=");  // each run's own (<its run directory>/checkpoints)
  // A lost shard rolls the job back to a checkpoint: there must be one; so
  // does a sync group that lost every worker holding the model.
  if ((psFault && !replicated) || !psMode) p.sets.push_back("checkpoint.every_steps=20");
  p.sets.push_back(fmt::format("ps.replicas={}", replicated ? 2 : 1));
  for (auto& s : modelSets(p.model, countRows, countBatch)) p.sets.push_back(std::move(s));
  return p;
}

struct RunResult {
  bool ok = false;
  std::vector<std::string> problems;
  double seconds = 0;
  Json report;  // faults.json (null when there is none)
};

RunResult runOne(const ChaosFlags& f, const RunPlan& p) {
  RunResult r;
  std::vector<std::string> argv = {actors::selfExe(), "train"};
  if (!f.common.configPath.empty()) argv.insert(argv.end(), {"--config", f.common.configPath});
  for (const auto& s : f.common.overrides) argv.insert(argv.end(), {"--set", s});
  for (const auto& s : p.sets) argv.insert(argv.end(), {"--set", s});
  for (const auto& s : p.faults) argv.insert(argv.end(), {"--fault", s});
  if (!f.common.logLevel.empty()) argv.insert(argv.end(), {"--log-level", f.common.logLevel});
  if (f.common.threads >= 0) argv.insert(argv.end(), {"--threads", std::to_string(f.common.threads)});
  const std::string name = fmt::format("run-{:03d}", p.index);
  // Nothing of an earlier campaign in the same place counts for this one.
  std::error_code ec;
  fs::remove_all(f.dir + "/runs/" + name, ec);
  fs::remove(f.dir + "/" + name + ".log", ec);
  const auto start = std::chrono::steady_clock::now();
  std::optional<int> status;
  {
    actors::ChildProcess child(argv, f.dir + "/" + name + ".log");
    if (child.wait(std::chrono::seconds(f.runTimeout))) {
      status = 0;
    } else {
      status = child.poll();
      if (!status) {
        r.problems.push_back(fmt::format("hung: no end within {} s (--run-timeout)", f.runTimeout));
        // SIGTERM: it stops its processes (up to 10 s, then 2 s each) and
        // writes its report; then SIGKILL.
        child.stop(std::chrono::seconds(30 + 2 * (f.workers + f.servers)));
      }
    }
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (status && *status < 0) r.problems.push_back(fmt::format("troupe train died of signal {}", -*status));
  if (status && *status > 0) r.problems.push_back(fmt::format("troupe train exited with status {}", *status));
  const std::string path = f.dir + "/runs/" + name + "/faults.json";
  std::ifstream in(path);
  if (!in) {
    if (r.problems.empty()) r.problems.push_back("no fault report (" + path + "); see " + f.dir + "/" + name + ".log");
  } else {
    try {
      r.report = Json::parse(in);
    } catch (const Json::exception& e) {
      r.problems.push_back(fmt::format("{}: {}", path, e.what()));
    }
  }
  if (r.report.is_object()) {
    const Json& j = r.report;
    if (!j.value("finished", false)) {
      r.problems.push_back("did not finish: " + j.value("error", std::string("?")));
    } else {
      const Json& ledger = j.at("ledger");
      if (!ledger.value("exact", false)) {
        r.problems.push_back(fmt::format("ledger not exact: samples applied {} of {} expected; pushes acknowledged {}, "
                                         "in the shards' state {}",
                                         ledger.at("samples_applied").dump(), ledger.value("expected_samples", int64_t{0}),
                                         ledger.value("pushes_acknowledged", Json()).dump(),
                                         ledger.value("pushes_in_state", Json::array()).dump()));
      }
      if (j.contains("counts") && j.at("counts").value("wrong", int64_t{1}) != 0) {
        r.problems.push_back(fmt::format("ledger: counts not exact: {} of {} values wrong: {}",
                                         j.at("counts").value("wrong", int64_t{-1}),
                                         j.at("counts").value("checked", int64_t{0}),
                                         j.at("counts").value("errors", std::string())));
      }
    }
    for (const auto& c : j.value("crashes", Json::array())) r.problems.push_back("crashed: " + c.get<std::string>());
  }
  r.ok = r.problems.empty();
  return r;
}

std::string describeFaults(const std::vector<std::string>& faults) {
  std::string out;
  for (const auto& spec : faults) {
    std::map<std::string, std::string> kv;
    for (const auto& item : splitList(spec)) {
      const auto eq = item.find('=');
      if (eq != std::string::npos) kv[item.substr(0, eq)] = item.substr(eq + 1);
    }
    if (kv.count("p")) {  // a message fault on links
      std::string what = fmt::format("{} {}->{} p={}", kv["kind"], kv["from"], kv["to"], kv["p"]);
      if (kv.count("delay_ms")) what += " " + kv["delay_ms"] + " ms";
      out += fmt::format("{}{}", out.empty() ? "" : "; ", what);
      continue;
    }
    if (kv.count("actor")) kv["target"] += "/" + kv["actor"];
    std::string when = kv.count("at_step") ? "@step " + kv["at_step"]
                                           : "@" + kv["at_s"] + " s" + (kv.count("after_checkpoint") ? " after ckpt " + kv["after_checkpoint"] : "");
    if (kv.count("duration_s")) when += " for " + kv["duration_s"] + " s";
    if (kv.count("factor")) when += " x" + kv["factor"] + " for " + kv["steps"] + " steps";
    out += fmt::format("{}{} {} {}", out.empty() ? "" : "; ", kv["kind"], kv["target"], when);
  }
  return out;
}

int runChaos(const ChaosFlags& flagsIn) {
  ChaosFlags f = flagsIn;
  if (f.common.configPath.empty()) TROUPE_SETUP_ERROR("chaos: --config FILE is needed (the job each run trains)");
  if (f.runs < 1 || f.runs > 100000) TROUPE_SETUP_ERROR("chaos: --runs must be 1 to 100000, got {}", f.runs);
  if (f.maxFaults < 1 || f.maxFaults > 20) {
    TROUPE_SETUP_ERROR("chaos: --faults-per-run must be 1 to 20, got {}", f.maxFaults);
  }
  if (f.runTimeout < 10) TROUPE_SETUP_ERROR("chaos: --run-timeout must be at least 10 s, got {}", f.runTimeout);
  if (f.servers < 1) TROUPE_SETUP_ERROR("chaos: --servers must be at least 1, got {}", f.servers);
  const auto mix = splitList(f.mix);
  const auto modes = splitList(f.modes);
  const auto models = splitList(f.models);
  if (models.empty()) TROUPE_SETUP_ERROR("chaos: --models names no model");
  for (const auto& m : models) {
    if (m != "dlrm" && m != "count" && m != "mlp") {
      TROUPE_SETUP_ERROR("chaos: --models {}: not a model (dlrm: the config's own, count, mlp)", m);
    }
  }
  if (mix.empty()) TROUPE_SETUP_ERROR("chaos: --mix names no fault kind");
  if (modes.empty()) TROUPE_SETUP_ERROR("chaos: --modes names no mode");
  for (const auto& k : mix) {
    if (!actors::faultKindOf(k) && !actors::isMessageFault(k)) {
      TROUPE_SETUP_ERROR("chaos: --mix {}: not a fault kind (kill, kill-actor, stop, slow, drop, dup, delay, "
                         "reorder, corrupt, partition)",
                         k);
    }
  }
  for (const auto& m : modes) {
    static const std::set<std::string> known = {"bsp", "ssp", "asp", "allreduce", "hybrid"};
    if (!known.count(m)) TROUPE_SETUP_ERROR("chaos: --modes {}: not a mode (bsp, ssp, asp, allreduce, hybrid)", m);
  }
  // The job, as each run starts from it (its errors surface here, once).
  const Config config = loadConfig(f.common);
  int64_t workers = f.workers > 0 ? f.workers : std::max<int64_t>(2, config.getInt("cluster.workers"));
  if (workers < 2) TROUPE_SETUP_ERROR("chaos: --workers must be at least 2, got {}", workers);
  f.workers = workers;
  if (f.replicas == 0) f.replicas = config.getInt("ps.replicas");
  if (f.replicas != 1 && f.replicas != 2) TROUPE_SETUP_ERROR("chaos: --replicas must be 1 or 2, got {}", f.replicas);
  if (f.replicas == 2 && f.servers < 2) {
    TROUPE_SETUP_ERROR("chaos: --replicas 2 needs --servers >= 2 (a shard's copies live in two ps processes)");
  }
  if (config.getInt("train.max_steps") > 0) {
    TROUPE_SETUP_ERROR("chaos: train.max_steps cuts training short, and then no ledger can say that every sample was "
                       "applied once; leave it 0");
  }
  if (!config.getStringList("faults.plan").empty()) {
    TROUPE_SETUP_ERROR("chaos: the config has a fault plan of its own; chaos draws one for every run");
  }
  // The count model averages each step over the workers (BSP, sync modes):
  // its runs train whole steps of every worker, cut from the config's rows.
  int64_t countRows = 0;
  const int64_t countBatch = std::max<int64_t>(16, config.getInt("train.batch_size") / 4);
  if (std::find(models.begin(), models.end(), "count") != models.end()) {
    int64_t rows = config.getInt("data.max_train_rows");
    if (config.getString("data.kind") == "criteo-synthetic") {
      const int64_t generated = config.getInt("data.synthetic.rows");
      rows = rows < 0 ? generated : std::min(rows, generated);
    }
    const bool criteo = config.getString("data.kind").rfind("criteo", 0) == 0;
    if (!criteo || rows <= 0) {
      TROUPE_SETUP_ERROR("chaos: --models count trains the count model on the config's Criteo-format data and must "
                         "know its rows: data.kind = criteo-synthetic, or data.max_train_rows (data.kind is '{}')",
                         config.getString("data.kind"));
    }
    const int64_t step = workers * countBatch;
    countRows = rows / step * step;
    if (countRows == 0) {
      TROUPE_SETUP_ERROR("chaos: --models count: {} training rows make no whole step of {} workers x {} rows", rows,
                         workers, countBatch);
    }
  }
  if (f.dir.empty()) {
    std::time_t now = std::time(nullptr);
    char stamp[32];
    std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&now));
    f.dir = (fs::path(config.getString("run.dir")) / fmt::format("chaos-{}", stamp)).string();
  }
  std::error_code ec;
  fs::create_directories(f.dir + "/runs", ec);
  if (ec) TROUPE_SETUP_ERROR("chaos: cannot create '{}': {}", f.dir, ec.message());
  f.dir = fs::absolute(f.dir).string();
  std::printf("chaos: %lld runs, seed %lld, mix %s, modes %s, models %s, %lld workers, %lld replicas; each run's log "
              "and run directory are in %s\n",
              static_cast<long long>(f.runs), static_cast<long long>(f.seed), f.mix.c_str(), f.modes.c_str(),
              f.models.c_str(),
              static_cast<long long>(workers), static_cast<long long>(f.replicas), f.dir.c_str());
  std::fflush(stdout);

  Json runs = Json::array();
  int64_t ok = 0, unfinished = 0, inexact = 0, hung = 0, crashed = 0;
  int64_t rollbacks = 0, promotions = 0, copiesBuilt = 0;
  std::vector<double> promotedToTraining;  // seconds from a promotion to training going on
  std::map<std::string, workers::FaultReport::Row> kinds;
  std::map<std::string, int64_t> links;  // what the runs' links did, added up
  const auto campaignStart = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < f.runs; ++i) {
    const RunPlan p = drawRun(f, mix, modes, models, countRows, countBatch, workers, i);
    const RunResult r = runOne(f, p);
    int64_t injected = 0, detected = 0, recovered = 0;
    if (r.report.is_object()) {
      // A count a report leaves null (detected, for a message fault that
      // costs resends) is not counted.
      auto count = [](const Json& row, const char* name) {
        return row.contains(name) && row.at(name).is_number_integer() ? row.at(name).get<int64_t>() : int64_t{0};
      };
      for (const auto& row : r.report.value("kinds", Json::array())) {
        auto& k = kinds[row.value("kind", std::string("?"))];
        k.detects = row.contains("detected") && row.at("detected").is_number_integer();
        k.injected += count(row, "injected");
        k.skipped += count(row, "skipped");
        k.unfired += count(row, "unfired");
        k.detected += count(row, "detected");
        k.recovered += count(row, "recovered");
        injected += count(row, "injected");
        detected += count(row, "detected");
        recovered += count(row, "recovered");
      }
      for (const auto& p : r.report.value("partitions", Json::array())) {
        auto& k = kinds["partition"];
        if (p.value("detected", false) && p.at("detect_s").is_number()) {
          k.detectSeconds.push_back(p.at("detect_s").get<double>());
        }
        if (p.value("recovered", false) && p.at("recover_s").is_number()) {
          k.recoverSeconds.push_back(p.at("recover_s").get<double>());
        }
      }
      if (r.report.contains("links")) {
        for (const auto& [name, value] : r.report.at("links").items()) {
          if (value.is_number_integer()) links[name] += value.get<int64_t>();
        }
      }
      rollbacks += r.report.value("rollbacks", int64_t{0});
      for (const auto& pr : r.report.value("promotions", Json::array())) {
        ++promotions;
        if (pr.value("training_at_s", Json()).is_number() && pr.value("at_s", Json()).is_number()) {
          promotedToTraining.push_back(pr.at("training_at_s").get<double>() - pr.at("at_s").get<double>());
        }
      }
      copiesBuilt += int64_t(r.report.value("copies_built", Json::array()).size());
      for (const auto& in : r.report.value("injections", Json::array())) {
        auto& k = kinds[in.value("kind", std::string("?"))];
        if (in.value("detected", false) && in.at("detect_s").is_number()) {
          k.detectSeconds.push_back(in.at("detect_s").get<double>());
        }
        if (in.value("recovered", false) && in.at("recover_s").is_number()) {
          k.recoverSeconds.push_back(in.at("recover_s").get<double>());
        }
      }
    }
    bool isHung = false, isCrashed = false, isUnfinished = false, isInexact = false;
    for (const auto& why : r.problems) {
      isHung = isHung || why.rfind("hung", 0) == 0;
      isCrashed = isCrashed || why.rfind("crashed", 0) == 0 || why.find("died of signal") != std::string::npos;
      isUnfinished = isUnfinished || why.rfind("did not finish", 0) == 0 || why.rfind("no fault report", 0) == 0;
      isInexact = isInexact || why.rfind("ledger", 0) == 0;
    }
    ok += r.ok;
    hung += isHung;
    crashed += isCrashed;
    unfinished += isUnfinished;
    inexact += isInexact;
    const Json metric = r.report.is_object() ? r.report.value("test_auc", r.report.value("test_accuracy", Json()))
                                             : Json();
    std::string result;
    if (r.report.is_object() && r.report.contains("counts")) {
      if (r.report.at("counts").value("wrong", int64_t{1}) == 0) {
        result = fmt::format("  {} counts exact", r.report.at("counts").value("checked", int64_t{0}));
      }
    } else if (metric.is_number()) {
      result = fmt::format("  test {:.5f}", metric.get<double>());
    }
    std::printf("run-%03lld (%lld/%lld)  %-9s %-5s %-6s faults: %s  injected %lld detected %lld recovered %lld  %s%s  %.1f s\n",
                static_cast<long long>(i), static_cast<long long>(i + 1), static_cast<long long>(f.runs), p.mode.c_str(),
                p.model.c_str(),
                r.ok ? "ok" : "FAILED", describeFaults(p.faults).c_str(), static_cast<long long>(injected),
                static_cast<long long>(detected), static_cast<long long>(recovered),
                r.ok ? "ledger exact" : "", result.c_str(), r.seconds);
    for (const auto& why : r.problems) std::printf("          %s\n", why.c_str());
    std::fflush(stdout);
    runs.push_back(Json{{"run", i},
                        {"mode", p.mode},
                        {"model", p.model},
                        {"faults", p.faults},
                        {"ok", r.ok},
                        {"problems", r.problems},
                        {"seconds", r.seconds},
                        {"run_dir", f.dir + "/runs/" + fmt::format("run-{:03d}", i)},
                        {"report", r.report}});
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - campaignStart).count();
  const int64_t failed = f.runs - ok;
  std::printf("\n%lld runs in %.0f s: %lld ok, %lld failed (%lld did not finish, %lld lost or applied a sample twice, "
              "%lld hung, %lld crashed)\n",
              static_cast<long long>(f.runs), wall, static_cast<long long>(ok), static_cast<long long>(failed),
              static_cast<long long>(unfinished), static_cast<long long>(inexact), static_cast<long long>(hung),
              static_cast<long long>(crashed));
  std::printf("  rollbacks %lld", static_cast<long long>(rollbacks));
  if (f.replicas == 2) {
    const std::string wentOn =
        promotedToTraining.empty()
            ? std::string(" (no progress report after any: train.progress_every)")
            : fmt::format(" (training went on p50 {:.2f} s, max {:.2f} s after)", workers::percentile(promotedToTraining, 50),
                          workers::percentile(promotedToTraining, 100));
    std::printf(", backups promoted %lld%s, copies built again %lld", static_cast<long long>(promotions),
                wentOn.c_str(), static_cast<long long>(copiesBuilt));
  }
  std::printf("\n");
  std::vector<workers::FaultReport::Row> rows;
  Json totals = Json::object();
  for (const char* name :
       {"kill", "stop", "slow", "kill-actor", "drop", "dup", "delay", "reorder", "corrupt", "partition"}) {
    if (kinds.count(name) == 0) continue;
    auto& k = kinds[name];
    k.kind = name;
    rows.push_back(k);
    if (k.injected == 0 && k.skipped == 0 && k.unfired == 0) continue;
    totals[name] = Json{{"injected", k.injected},
                        {"skipped", k.skipped},
                        {"unfired", k.unfired},
                        {"detected", k.detects ? Json(k.detected) : Json()},
                        {"recovered", k.detects ? Json(k.recovered) : Json()},
                        {"detect_s", k.detectSeconds},
                        {"recover_s", k.recoverSeconds}};
  }
  std::printf("%s", workers::faultKindTable(rows, {50, 99, 100}).c_str());
  if (!links.empty()) {
    std::printf("  links: %lld frames sent again, %lld duplicates suppressed, %lld held for an earlier one, %lld resend "
                "requests, %lld malformed frames refused, %lld links given up\n",
                static_cast<long long>(links["sent_again"]), static_cast<long long>(links["duplicates_suppressed"]),
                static_cast<long long>(links["held_for_an_earlier_one"]), static_cast<long long>(links["resend_requests"]),
                static_cast<long long>(links["malformed_refused"]), static_cast<long long>(links["given_up"]));
  }
  Json out{{"seed", f.seed},
           {"runs", f.runs},
           {"mix", mix},
           {"modes", modes},
           {"models", models},
           {"workers", workers},
           {"ok", ok},
           {"failed", failed},
           {"did_not_finish", unfinished},
           {"ledger_not_exact", inexact},
           {"hung", hung},
           {"crashed", crashed},
           {"wall_seconds", wall},
           {"kinds", totals},
           {"replicas", f.replicas},
           {"rollbacks", rollbacks},
           {"promotions", promotions},
           {"promoted_to_training_s", promotedToTraining},
           {"copies_built", copiesBuilt},
           {"links", links},
           {"each", runs}};
  std::ofstream(f.dir + "/chaos.json") << out.dump(2) << "\n";
  std::printf("  chaos.json: %s/chaos.json\n", f.dir.c_str());
  return failed == 0 ? kExitOk : kExitFailure;
}

}  // namespace

void addChaosCommand(CLI::App* app, int* result) {
  auto flags = std::make_shared<ChaosFlags>();
  auto* cmd = app->add_subcommand(
      "chaos", "Run a campaign of short jobs, each with a random fault plan, and check that none lost or repeated an "
               "update, hung or crashed");
  addCommonFlags(cmd, &flags->common);
  cmd->add_option("--runs", flags->runs, "jobs to run (default 10)");
  cmd->add_option("--seed", flags->seed, "every run's mode and faults are drawn from this (default 1)");
  cmd->add_option("--mix", flags->mix,
                  "fault kinds to draw from: kill, kill-actor, stop, slow, drop, dup, delay, reorder, corrupt, "
                  "partition (default: all of them)");
  cmd->add_option("--modes", flags->modes, "modes to draw from (default bsp,ssp,asp,allreduce,hybrid)");
  cmd->add_option("--models", flags->models,
                  "models to draw from: dlrm (the config's own), count (the exact-count model on the config's data), "
                  "mlp (the MLP on Fashion-MNIST) (default dlrm,count,mlp)");
  cmd->add_option("--workers", flags->workers, "worker processes per job (default: cluster.workers, at least 2)");
  cmd->add_option("--servers", flags->servers, "parameter servers per job in ps and hybrid modes (default 2)");
  cmd->add_option("--replicas", flags->replicas,
                  "copies of every shard in ps and hybrid modes: 1, or 2 (backups take over; default: ps.replicas)");
  cmd->add_option("--faults-per-run", flags->maxFaults, "at most this many faults per run (default 3)");
  cmd->add_option("--run-timeout", flags->runTimeout, "a run that has not ended after this many seconds is hung "
                                                      "(default 300)");
  cmd->add_option("--dir", flags->dir, "where the runs go (default: <run.dir>/chaos-<time>)");
  cmd->callback([=] { *result = runGuarded([&] { return runChaos(*flags); }); });
}

}  // namespace troupe::apps
