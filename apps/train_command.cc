#include "apps/train_command.h"

#include <signal.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>

#include <nlohmann/json.hpp>

#include "actors/coordinator_process.h"
#include "actors/fault_plan.h"
#include "actors/launcher.h"
#include "apps/cli_common.h"
#include "apps/metrics_server.h"
#include "common/check.h"
#include "common/compute_pool.h"
#include "common/hash.h"
#include "common/logging.h"
#include "common/metrics_registry.h"
#include "common/progress_line.h"
#include "data/criteo_reader.h"
#include "kernels/cpu/blas_core.h"
#include "transport/node_config.h"
#include "workers/checkpoint.h"
#include "workers/fault_report.h"
#include "workers/job_setup.h"
#include "workers/ps_role.h"
#include "workers/trainer.h"
#include "workers/training_job.h"
#include "workers/worker_role.h"

namespace troupe::apps {
namespace {

namespace fs = std::filesystem;
using namespace workers;

// A metric in metrics.csv: "null" when it is not finite (not evaluated).
std::string csvNumber(double v) { return std::isfinite(v) ? fmt::format("{:.17g}", v) : "null"; }

}  // namespace

struct TrainFlags {
  CommonFlags common;
  std::string summaryJson;
  std::string predictions;
  // `troupe launch --role coordinator`: listen here and start no processes.
  std::string coordinatorAddress;
  // --resume: a run directory or checkpoint to go on from.
  std::string resume;
  // --baseline: with a fault plan, also run the job without it (its AUC or
  // accuracy goes beside the faulty run's in the fault report).
  bool baseline = false;
  // --metrics-port: the coordinator serves the job's metrics here (0: no).
  int metricsPort = 0;
};

// What --resume found: the checkpoint and its manifest.
struct Resumed {
  std::string dir;
  workers::CheckpointManifest manifest;
};

namespace {

std::string makeRunDir(const Config& c) {
  std::string name = c.getString("run.name");
  if (name.empty()) {
    std::time_t now = std::time(nullptr);
    char stamp[32];
    std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&now));
    name = fmt::format("{}-{}", stamp, c.getString("model.kind"));
  }
  fs::path dir = fs::path(c.getString("run.dir")) / name;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) TROUPE_SETUP_ERROR("cannot create run directory '{}': {}", dir.string(), ec.message());
  return dir.string();
}

std::atomic<bool> interrupted{false};

void onInterrupt(int) { interrupted = true; }

// The outcome of a multi-process job as the single-process report, so both
// print and summarise alike.
Expected<workers::TrainReport> reportOf(const JobOutcome& o) {
  if (!o.ok) return Status::internal(o.error);
  workers::TrainReport r;
  r.steps = o.steps;
  r.samples = o.samples;
  r.pulledRows = o.pulledRows;
  r.trainSeconds = o.trainSeconds;
  r.evalSeconds = o.evalSeconds;
  for (const auto& w : o.workers) r.pushesAcked += w.pushesAcked;
  workers::EvalResult e;
  e.rows = o.rows;
  e.auc = o.auc;
  e.loss = o.loss;
  e.accuracy = o.accuracy;
  e.labels = o.labels;
  e.predictions = o.predictions;
  e.countChecked = o.countChecked;
  e.countWrong = o.countWrong;
  e.countErrors = o.countErrors;
  r.evals.push_back(std::move(e));
  return r;
}

// The metrics a job serves (--metrics-port), with their help.
void declareJobMetrics(MetricsRegistry& m) {
  using T = MetricsRegistry::Type;
  m.declare("troupe_worker_step", T::kGauge, "steps the worker has taken (its last progress report)");
  m.declare("troupe_worker_epoch", T::kGauge, "the epoch the worker is in (0-based)");
  m.declare("troupe_worker_loss", T::kGauge, "the worker's mean training loss since its previous report");
  m.declare("troupe_worker_wire_ratio", T::kGauge,
           "the worker's bytes sent compressed over their float32 size (1: uncompressed)");
  m.declare("troupe_samples_per_second", T::kGauge, "training samples a second, all workers together");
  m.declare("troupe_progress_reports_total", T::kCounter, "progress reports the coordinator received");
  m.declare("troupe_eval_step", T::kGauge, "worker 0's step at the latest evaluation during training");
  m.declare("troupe_eval_auc", T::kGauge, "test AUC of the latest evaluation during training (DLRM)");
  m.declare("troupe_eval_accuracy", T::kGauge, "test accuracy of the latest evaluation during training");
  m.declare("troupe_eval_loss", T::kGauge, "test loss of the latest evaluation during training");
  m.declare("troupe_evaluations_total", T::kCounter, "evaluations during training the coordinator received");
  m.declare("troupe_job_workers", T::kGauge, "worker processes of the job (cluster.workers)");
  m.declare("troupe_job_servers", T::kGauge, "parameter-server processes of the job");
  m.declare("troupe_shard_rows", T::kGauge, "embedding rows the shard holds");
  // (Gauges: a rollback, an undone step or a promoted backup takes them back.)
  m.declare("troupe_shard_pushes_applied", T::kGauge, "pushes in the shard's state (a rollback takes it back)");
  m.declare("troupe_shard_pulls_served", T::kGauge, "pulls the serving copy of the shard has served");
  m.declare("troupe_shard_pulls_delayed", T::kGauge, "training pulls the serving copy's consistency gate held");
  m.declare("troupe_shard_parked_pulls", T::kGauge, "training pulls waiting at the shard's consistency gate now");
  m.declare("troupe_shard_pending_steps", T::kGauge, "BSP steps waiting at the shard for a worker's push now");
  m.declare("troupe_shard_awaiting_backup", T::kGauge, "changes waiting at the shard for its backup's answer now");
  m.declare("troupe_actor_mailbox_depth", T::kGauge,
            "messages waiting in an actor's mailbox (the worker's at its last progress report, the others' at the "
            "last poll)");
  m.declare("troupe_push_staleness_mean", T::kGauge, "updates a push's gradient missed, over every shard: the mean");
  m.declare("troupe_push_staleness_p50", T::kGauge, "updates a push's gradient missed: the median");
  m.declare("troupe_push_staleness_p99", T::kGauge, "updates a push's gradient missed: the 99th percentile");
  m.declare("troupe_push_staleness_max", T::kGauge, "updates a push's gradient missed: the most");
  m.declare("troupe_process_sent_bytes_total", T::kCounter, "bytes the process's node sent (its current process)");
  m.declare("troupe_process_received_bytes_total", T::kCounter, "bytes the process's node received");
  m.declare("troupe_process_sent_frames_total", T::kCounter, "frames the process's node sent");
  m.declare("troupe_process_received_frames_total", T::kCounter, "frames the process's node received");
  m.declare("troupe_processes_replaced_total", T::kCounter,
            "processes that took a rank after its first (a lost one's, a rank moved into a live process, every rank "
            "after a rollback)");
  m.declare("troupe_rollbacks_total", T::kCounter, "times the job rolled back to a checkpoint");
  m.declare("troupe_backups_promoted_total", T::kCounter, "shard backups that took over from a lost primary");
  m.set("troupe_progress_reports_total", 0);
  m.set("troupe_processes_replaced_total", 0);
  m.set("troupe_rollbacks_total", 0);
  m.set("troupe_backups_promoted_total", 0);
}

// `troupe train` with cluster.workers > 0: this process coordinates; S ps
// and W worker processes start from this binary on loopback, each logging to
// the run directory, and are stopped (by PID) when the job ends.
// `troupe launch --role coordinator` comes here too and starts none.
// `metrics` (--metrics-port; null: none) gets the job's live figures.
workers::JobOutcome runLocalJob(const Config& config, const TrainFlags& flags, const std::string& runDir,
                                ProgressLine& progress, const std::optional<Resumed>& resumed,
                                std::function<void(const workers::EvalPoint&, double)> onEval,
                                const std::shared_ptr<MetricsRegistry>& metrics) {
  const CommonFlags& common = flags.common;
  auto log = logger("apps");
  const int64_t workers = config.getInt("cluster.workers");
  const workers::TrainMode mode = workers::trainMode(config);
  const int64_t servers = workers::serverCount(config);
  if (mode != workers::TrainMode::kAllReduce && servers < 1) {
    TROUPE_SETUP_ERROR("config: cluster.servers must be >= 1 in {} mode, got {}", workers::trainModeName(mode),
                       servers);
  }
  if (workers > 256 || servers > 256) TROUPE_SETUP_ERROR("config: at most 256 workers and 256 servers on one machine");
  if (config.getString("transport.listen_host") == "0.0.0.0") {
    TROUPE_SETUP_ERROR("config: transport.listen_host must be a concrete address");
  }
  const bool launchHere = flags.coordinatorAddress.empty();
  std::string token;
  if (launchHere) {
    // The processes this command starts read the token the way it does: from
    // transport.token_file when set (given to them below; the secret stays
    // out of their environment), else from the variable set here.
    if (config.getString("transport.token_file").empty()) {
      token = transport::newJobToken();
      ::setenv(transport::kJobTokenVariable, token.c_str(), 1);
    } else {
      token = transport::jobToken(config);
    }
  } else {
    token = transport::jobToken(config);
  }
  const int64_t epochs = config.getInt("train.epochs");
  workers::TrainingJobOptions jo;
  const bool compressing = workers::compressionOf(config).any();
  // (A pipeline's: the last stage of its first replica, which has the loss.)
  const workers::PipelineConfig pipe = workers::pipelineOf(config);
  const int64_t reporter = pipe.any() ? pipe.stages - 1 : 0;
  if (metrics) {
    metrics->set("troupe_job_workers", double(workers));
    metrics->set("troupe_job_servers", double(servers));
  }
  jo.onProgress = [&, compressing, reporter](const workers::JobProgress& p) {
    if (metrics) {
      const MetricsRegistry::Labels w = {{"worker", std::to_string(p.worker)}};
      metrics->set("troupe_worker_step", w, double(p.step));
      metrics->set("troupe_worker_epoch", w, double(p.epoch));
      if (std::isfinite(p.loss)) metrics->set("troupe_worker_loss", w, p.loss);
      metrics->set("troupe_worker_wire_ratio", w, p.wireRatio);
      metrics->set("troupe_actor_mailbox_depth", {{"actor", "worker"}, {"rank", std::to_string(p.worker)}},
                   double(p.mailbox));
      metrics->set("troupe_samples_per_second", p.samplesPerSec);
      metrics->add("troupe_progress_reports_total", 1);
    }
    if (p.worker != reporter) return;
    const int64_t total = p.rowsPerEpoch * epochs;
    const int64_t done = p.rowsPerEpoch * p.epoch + p.epochRows;
    progress.update(done, total,
                    fmt::format("worker {}: epoch {}/{}  step {}  loss {:.4f}  all workers {:.0f} samples/s{}",
                                p.worker, p.epoch + 1, epochs, p.step, p.loss, p.samplesPerSec,
                                compressing ? fmt::format("  wire x{:.3f}", p.wireRatio) : std::string()));
  };
  if (metrics) {
    // The shards' counters and staleness and the recoveries, every second.
    jo.liveEvery = std::chrono::seconds(1);
    jo.onLive = [metrics](const workers::LiveFigures& f) {
      for (const auto& s : f.shards) {
        const MetricsRegistry::Labels l = {{"shard", std::to_string(s.rank)}};
        metrics->set("troupe_shard_rows", l, double(s.rows));
        metrics->set("troupe_shard_pushes_applied", l, double(s.pushesApplied));
        metrics->set("troupe_shard_pulls_served", l, double(s.pullsServed));
        metrics->set("troupe_shard_pulls_delayed", l, double(s.pullsDelayed));
        metrics->set("troupe_shard_parked_pulls", l, double(s.parkedPulls));
        metrics->set("troupe_shard_pending_steps", l, double(s.pendingSteps));
        metrics->set("troupe_shard_awaiting_backup", l, double(s.awaitingBackup));
        metrics->set("troupe_actor_mailbox_depth", {{"actor", "shard"}, {"rank", std::to_string(s.rank)}},
                     double(s.mailbox));
      }
      metrics->set("troupe_actor_mailbox_depth", {{"actor", "coordinator"}, {"rank", "0"}},
                   double(f.coordinatorMailbox));
      if (const auto st = workers::summarizeStaleness(f.shards); st.pushes > 0) {
        metrics->set("troupe_push_staleness_mean", st.mean);
        metrics->set("troupe_push_staleness_p50", double(st.p50));
        metrics->set("troupe_push_staleness_p99", double(st.p99));
        metrics->set("troupe_push_staleness_max", double(st.max));
      }
      for (const auto& p : f.processes) {
        // (A replacement's counters start again: `incarnation` tells its series apart.)
        const MetricsRegistry::Labels l = {
            {"role", p.role}, {"rank", std::to_string(p.rank)}, {"incarnation", std::to_string(p.incarnation)}};
        metrics->set("troupe_process_sent_bytes_total", l, double(p.bytesSent));
        metrics->set("troupe_process_received_bytes_total", l, double(p.bytesReceived));
        metrics->set("troupe_process_sent_frames_total", l, double(p.framesSent));
        metrics->set("troupe_process_received_frames_total", l, double(p.framesReceived));
        metrics->set("troupe_actor_mailbox_depth", {{"actor", p.role + "_agent"}, {"rank", std::to_string(p.rank)}},
                     double(p.mailbox));
      }
      metrics->set("troupe_processes_replaced_total", double(f.processesReplaced));
      metrics->set("troupe_rollbacks_total", double(f.rollbacks));
      metrics->set("troupe_backups_promoted_total", double(f.backupsPromoted));
    };
  }
  const bool binary = workers::modelOptions(config, 1).kind == workers::ModelKind::kDlrm;
  jo.onEval = [&, binary, onEval = std::move(onEval)](const workers::EvalPoint& p, double wall) {
    if (metrics) {
      metrics->set("troupe_eval_step", double(p.step));
      metrics->set(binary ? "troupe_eval_auc" : "troupe_eval_accuracy", binary ? p.auc : p.accuracy);
      metrics->set("troupe_eval_loss", p.loss);
      metrics->add("troupe_evaluations_total", 1);
    }
    if (onEval) onEval(p, wall);
  };
  const bool checkpoints = config.getInt("checkpoint.every_steps") > 0 || config.getInt("checkpoint.every_seconds") > 0;
  // (A pipeline across processes sums over the ring whatever the backend says.)
  const bool pipelineProcesses = pipe.any() && config.getInt("cluster.workers") > 0;
  if (checkpoints && mode != workers::TrainMode::kPs && !pipelineProcesses &&
      workers::collectivesBackend(config) != "ring") {
    TROUPE_SETUP_ERROR("config: checkpoints of a {} job are written with collectives.backend = ring; this job asks "
                       "for {}",
                       workers::trainModeName(mode), workers::collectivesBackend(config));
  }
  if (checkpoints) {
    jo.checkpointDir = config.getString("checkpoint.dir").empty() ? runDir + "/checkpoints"
                                                                  : config.getString("checkpoint.dir");
  }
  if (resumed) jo.resumedFrom = &resumed->manifest;
  auto job = std::make_shared<workers::TrainingJob>(config, std::move(jo));
  actors::CoordinatorProcessOptions co;
  co.coordinator = workers::coordinatorOptions(config);
  co.node = transport::nodeOptionsFromConfig(config);
  co.node.token = token;
  co.node.listenPort = 0;
  co.types = workers::trainingWireTypes();
  co.configure = workers::addTrainingTypes;
  if (!launchHere) {
    auto hp = transport::parseHostPort(flags.coordinatorAddress);
    if (!hp.hasValue()) TROUPE_SETUP_ERROR("--coordinator: {}", hp.status().message());
    co.node.listenHost = hp->first == "localhost" ? "127.0.0.1" : hp->first;
    co.node.listenPort = hp->second;
  }
  actors::LocalJobOptions lo;
  lo.launchArgv = {actors::selfExe(), "launch"};
  if (!common.configPath.empty()) lo.extraArgs.insert(lo.extraArgs.end(), {"--config", common.configPath});
  for (const auto& o : common.overrides) lo.extraArgs.insert(lo.extraArgs.end(), {"--set", o});
  lo.extraArgs.insert(lo.extraArgs.end(), {"--log-level", config.getString("log.level")});
  if (config.getBool("transport.reliable_links")) {
    lo.extraArgs.insert(lo.extraArgs.end(), {"--set", "transport.reliable_links=true"});
  }
  if (!config.getString("transport.token_file").empty()) {
    lo.extraArgs.insert(lo.extraArgs.end(), {"--set", "transport.token_file=" + config.getString("transport.token_file")});
  }
  // Every process of a job on this machine connects from this host: room
  // for all of them in their handshakes at once, in every process.
  const int64_t everyone = workers + servers + 1;
  const int64_t perHost = config.getInt("transport.handshake_slots_per_host"),
                slots = config.getInt("transport.handshake_slots");
  if (launchHere && (everyone > perHost || everyone > slots)) {
    log->info("transport.handshake_slots{{,_per_host}} raised to {} in every process: the job's {} processes all "
              "connect from this host",
              everyone, everyone);
    co.node.maxHandshakingPerHost = size_t(std::max(everyone, perHost));
    co.node.maxHandshaking = size_t(std::max(everyone, slots));
    lo.extraArgs.insert(lo.extraArgs.end(),
                        {"--set", fmt::format("transport.handshake_slots_per_host={}", co.node.maxHandshakingPerHost),
                         "--set", fmt::format("transport.handshake_slots={}", co.node.maxHandshaking)});
  }
  lo.logDir = runDir;
  actors::LocalJob processes(lo);
  co.onListening = [&](const std::string& address) {
    if (!launchHere) {
      log->info("coordinator of {} ps and {} worker processes at {}: start them with "
                "'troupe launch --role ps|worker --coordinator {}' and the same job token (TROUPE_JOB_TOKEN or "
                "transport.token_file)",
                servers, workers, address, address);
      return;
    }
    processes.setCoordinator(address);
    for (int64_t i = 0; i < servers; ++i) processes.start("ps", i);
    for (int64_t i = 0; i < workers; ++i) processes.start("worker", i);
    log->info("started {} ps and {} worker processes (compute threads: {} per worker, {} per ps, on {} cores; "
              "cluster.worker_threads, cluster.server_threads); their logs are {}/{{ps,worker}}-N.log; dense "
              "kernels: OpenBLAS {}",
              servers, workers, workers::workerThreads(config, 0), workers::serverThreads(config, 0),
              ComputePool::hardwareThreads(), runDir, kernels::describeBlasCore());
  };
  if (launchHere) {
    // A lost process is killed by PID (a stopped one must not come back)
    // and a new one takes its rank.
    co.coordinator.terminate = [&](const actors::Member& m) { processes.kill(m.role, m.rank); };
    co.coordinator.replace = [&](const actors::Member& m) { processes.start(m.role, m.rank); };
  }
  co.checkAbort = [&]() -> std::string {
    if (interrupted) return "interrupted (Ctrl-C)";
    return launchHere ? processes.failure(job->started()) : "";
  };
  transport::NodeStats node;
  co.onNodeStats = [&](const transport::NodeStats& s) {
    node = s;
    if (!metrics) return;
    metrics->set("troupe_handshakes_refused", double(s.handshakesRefused));
    metrics->set("troupe_handshakes_timed_out", double(s.handshakesTimedOut));
    metrics->set("troupe_idle_connections_closed", double(s.idleClosed));
    metrics->set("troupe_handshakes_abandoned", double(s.handshakesAbandoned));
    metrics->set("troupe_frames_dropped_unauthenticated", double(s.unauthenticatedDropped));
    metrics->set("troupe_frames_dropped_malformed", double(s.malformedDropped));
    metrics->set("troupe_frames_seals_refused", double(s.sealsRefused));
    metrics->set("troupe_frames_unsealed_refused", double(s.unsealedRefused));
  };
  struct sigaction sa {}, oldInt {}, oldTerm {};
  sa.sa_handler = onInterrupt;
  sigaction(SIGINT, &sa, &oldInt);
  sigaction(SIGTERM, &sa, &oldTerm);
  const actors::JobResult result = actors::runCoordinator(std::move(co), job);
  // Every process got its Shutdown; give them a moment, then stop them by PID.
  processes.stopAll(std::chrono::seconds(10));
  sigaction(SIGINT, &oldInt, nullptr);
  sigaction(SIGTERM, &oldTerm, nullptr);
  workers::JobOutcome outcome = job->takeOutcome(result);
  outcome.coordinatorNode = node;
  for (const auto& e : outcome.events) log->warn("{} ({})", e.what, e.action);
  if (launchHere) outcome.crashes = processes.crashes();
  for (const auto& c : outcome.crashes) log->error("crashed: {}", c);
  return outcome;
}

}  // namespace

// --resume PATH: the checkpoint (whole, and of this job's shape), its
// config with the command line's --set overrides on top, and where it goes on.
Config resumeConfig(const TrainFlags& flags, std::optional<Resumed>* resumed) {
  if (!flags.common.configPath.empty()) {
    TROUPE_SETUP_ERROR("--resume takes the checkpoint's own config; give changes with --set, not --config");
  }
  auto dir = workers::findCheckpoint(flags.resume);
  if (!dir.hasValue()) TROUPE_SETUP_ERROR("--resume: {}", dir.status().message());
  auto manifest = workers::readManifest(*dir);
  if (!manifest.hasValue()) TROUPE_SETUP_ERROR("--resume: {}", manifest.status().message());
  Status whole = workers::verifyCheckpoint(*dir, *manifest);
  if (!whole.isOk()) TROUPE_SETUP_ERROR("--resume: {}", whole.message());
  CommonFlags common = flags.common;
  common.configPath = *dir + "/config.toml";
  Config config = loadConfig(common);
  // A fault plan belongs to a run: the resumed one has only the faults its
  // own command line gives (--fault), none of the checkpoint's.
  config.setValue("faults.plan", flags.common.faults);
  Status fits = workers::checkShape(manifest->shape, workers::jobShapeOf(config));
  if (!fits.isOk()) TROUPE_SETUP_ERROR("--resume: {}: {}", *dir, fits.message());
  config.setValue("checkpoint.resume", *dir);
  *resumed = Resumed{*dir, std::move(*manifest)};
  return config;
}

int runTrain(const TrainFlags& flags) {
  const auto wallStart = std::chrono::steady_clock::now();
  std::optional<Resumed> resumed;
  Config config = flags.resume.empty() ? loadConfig(flags.common) : resumeConfig(flags, &resumed);
  if (resumed && config.getInt("cluster.workers") <= 0) {
    TROUPE_SETUP_ERROR("--resume: checkpoints are of multi-process jobs (cluster.workers > 0)");
  }
  // --metrics-port: bound now, before any data is read or process started
  // (a port in use is a setup error at once), and served while the job
  // runs (not its --baseline).
  std::shared_ptr<MetricsRegistry> liveMetrics;
  std::unique_ptr<MetricsServer> metricsServer;
  if (flags.metricsPort != 0) {
    if (config.getInt("cluster.workers") <= 0) {
      TROUPE_SETUP_ERROR("--metrics-port serves a job of processes' metrics (cluster.workers >= 1); a run in one "
                         "process reports in its log and metrics.csv");
    }
    // The coordinator's own host when it was named (launch --role coordinator), else the transport's.
    std::string host = config.getString("transport.listen_host");
    if (!flags.coordinatorAddress.empty()) {
      auto hp = transport::parseHostPort(flags.coordinatorAddress);
      if (!hp.hasValue()) TROUPE_SETUP_ERROR("--coordinator: {}", hp.status().message());
      host = hp->first == "localhost" ? "127.0.0.1" : hp->first;
    }
    liveMetrics = std::make_shared<MetricsRegistry>();
    auto server = MetricsServer::start(host, flags.metricsPort, liveMetrics);
    if (!server.hasValue()) TROUPE_SETUP_ERROR("{}", server.status().message());
    metricsServer = std::move(*server);
    logger("apps")->info("metrics: http://{}:{}/metrics", host, flags.metricsPort);
    declareJobMetrics(*liveMetrics);
  }
  if (config.getInt("cluster.slow_worker") >= 0) {
    TROUPE_SETUP_ERROR("config: cluster.slow_worker is gone: make worker {} slow with a fault instead, --fault "
                       "kind=slow,target=worker:{},delay_ms={} (README, Fault plans)",
                       config.getInt("cluster.slow_worker"), config.getInt("cluster.slow_worker"),
                       std::max<int64_t>(1, config.getInt("cluster.slow_ms")));
  }
  if (!config.getStringList("faults.plan").empty()) {
    // A bad plan is refused here, before any process starts.
    if (config.getInt("cluster.workers") <= 0) {
      TROUPE_SETUP_ERROR("faults: a fault plan needs a multi-process job (--set cluster.workers=W, W >= 1)");
    }
    const auto plan = actors::parseFaultPlan(config, config.getInt("cluster.workers"), workers::serverCount(config));
    const bool checkpoints =
        config.getInt("checkpoint.every_steps") > 0 || config.getInt("checkpoint.every_seconds") > 0;
    bool killsOrStops = false;
    for (const auto& f : plan.faults) {
      killsOrStops = killsOrStops || f.kind == actors::FaultKind::kKill || f.kind == actors::FaultKind::kStop;
    }
    for (const auto& m : plan.messages) {
      // A partitioned process is lost, and a lost process is killed by PID.
      killsOrStops = killsOrStops || m.rule.kind == transport::LinkFaultKind::kPartition;
    }
    if (!plan.messages.empty() && config.getInt("faults.start_unix_ms") == 0) {
      // One clock for every process's message-fault windows, replacements too.
      config.setValue("faults.start_unix_ms", int64_t(std::chrono::duration_cast<std::chrono::milliseconds>(
                                                          std::chrono::system_clock::now().time_since_epoch())
                                                          .count()));
    }
    if (!plan.messages.empty()) {
      // Message faults ride below reliable links, in every process.
      if (config.isSet("transport.reliable_links") && !config.getBool("transport.reliable_links")) {
        TROUPE_SETUP_ERROR("fault {} ({}): message faults need transport.reliable_links = true (every message still "
                           "arrives once and in order; the faults cost resends)",
                           plan.messages[0].id, plan.messages[0].spec);
      }
      config.setValue("transport.reliable_links", true);
      for (const auto& m : plan.messages) {
        if (m.rule.kind == transport::LinkFaultKind::kCorrupt && config.getString("transport.integrity") == "off") {
          TROUPE_SETUP_ERROR("fault {} ({}): corrupt faults need transport.integrity = crc32c or hmac (with off, "
                             "nothing would notice the flipped bits)", m.id, m.spec);
        }
      }
    }
    if (killsOrStops && transport::avoidSharedMemoryFifo()) {
      logger("apps")->info("the fault plan kills or stops processes: they talk over TCP and cma, not UCX's "
                           "shared-memory FIFOs (a process killed mid-write wedges its peer's; UCX_TLS=^sysv,posix)");
    }
    for (const auto& f : plan.faults) {
      if (f.afterCheckpoint > 0 && !checkpoints) {
        TROUPE_SETUP_ERROR("fault {} ({}): after_checkpoint: the job writes no checkpoints (checkpoint.every_steps, "
                           "checkpoint.every_seconds)",
                           f.id, f.spec);
      }
    }
  }
  if (flags.baseline && config.getStringList("faults.plan").empty()) {
    TROUPE_SETUP_ERROR("--baseline goes with a fault plan (--fault SPEC or [[faults]] in the config)");
  }
  const int threads = resolveThreads(config);
  workers::WorkerOptions worker;
  worker.core = modelOptions(config, threads);
  worker.epochs = positive(config, "train.epochs");
  worker.maxSteps = config.getInt("train.max_steps");
  worker.progressEverySteps = positive(config, "train.progress_every");
  worker.evaluateEachEpoch = config.getBool("train.eval_each_epoch");
  const workers::EvalSchedule evalSchedule = workers::evalScheduleOf(config, worker.core.kind);
  if (const workers::StaleAware sa = workers::staleAwareOf(config); sa.any()) {
    const bool shards = config.getInt("cluster.workers") > 0 && trainMode(config) != TrainMode::kAllReduce;
    const bool stale = config.getString("ps.consistency") != "bsp" && trainMode(config) == TrainMode::kPs;
    if (!shards || !stale) {
      logger("apps")->info("ps.stale_lr / ps.delay_compensation change only the ASP and SSP pushes of train.mode = "
                           "ps; this job has none, so they change nothing");
    }
  }
  worker.lrDecayPerEpoch = config.getFloat("train.lr_decay");  // in (0, 1]: the schema's range
  (void)optimizerKind(config.getString("train.embedding_optimizer"), "train.embedding_optimizer");

  // A resumed job goes on in the run directory its checkpoint is in.
  std::string runDir;
  if (resumed && fs::path(resumed->dir).parent_path().filename() == "checkpoints") {
    runDir = fs::path(resumed->dir).parent_path().parent_path().string();
  } else {
    runDir = makeRunDir(config);
  }
  { std::ofstream(runDir + "/config.toml") << config.toToml(); }
  addLogFile(runDir + "/train.log");
  auto log = logger("apps");
  DataSources data = openData(config, threads);
  if (worker.core.kind == workers::ModelKind::kCount) {
    worker.core.countScale = countScale(config, data.train->rowsPerEpoch());
    worker.lrDecayPerEpoch = 1;  // every update adds its count, in every epoch
  }
  log->info("train: {} on {}, {} threads, run directory {}; dense kernels: OpenBLAS {}",
            config.getString("model.kind"), data.description, threads, runDir, kernels::describeBlasCore());

  workers::InProcessJob job;
  job.train = data.train;
  job.test = data.test;
  job.prefetch = int(positive(config, "data.prefetch"));
  job.profile = config.getBool("train.profile");
  if (job.profile && (config.getInt("cluster.workers") > 0 || workers::pipelineOf(config).any())) {
    TROUPE_SETUP_ERROR("config: train.profile times the kernels of one process's worker (cluster.workers = 0, no "
                       "pipeline stages)");
  }
  job.tables.tables = tableOptions(config, worker.core);
  job.tables.threads = threads;

  // metrics.csv: a row an evaluation (the epochs' in one process, those
  // during training, the final one), written as they come (from the
  // worker's, the evaluator's or the coordinator's thread: one at a time).
  std::ofstream metrics(runDir + "/metrics.csv");
  metrics << "epoch,step,elapsed_s,rows,loss,auc,accuracy,samples,wall_s\n";
  std::recursive_mutex outputMutex;  // the progress line, the log and metrics.csv
  ProgressLine progress("train", "rows");
  auto metricsRow = [&](int64_t epoch, int64_t step, double elapsed, int64_t rows, double loss, double auc,
                        double accuracy, int64_t samples) {
    std::lock_guard<std::recursive_mutex> lock(outputMutex);
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wallStart).count();
    metrics << fmt::format("{},{},{:.3f},{},{},{},{},{},{:.3f}\n", epoch, step, elapsed, rows, csvNumber(loss),
                           csvNumber(auc), csvNumber(accuracy), samples, wall);
    metrics.flush();
  };
  // An evaluation during training (train.eval_every_*), logged as it comes.
  int64_t evalPoints = 0, snapshotsReplaced = 0;
  auto evalPoint = [&, kind = worker.core.kind](const workers::EvalPoint& p) {
    std::lock_guard<std::recursive_mutex> lock(outputMutex);
    ++evalPoints;
    snapshotsReplaced = p.skipped;
    progress.finish();
    if (kind == workers::ModelKind::kDlrm) {
      log->info("eval at step {} (worker {}, {:.1f} s of training): test AUC {:.5f}  log-loss {:.5f}", p.step, p.rank,
                p.trainSeconds, p.auc, p.loss);
    } else {
      log->info("eval at step {} (worker {}, {:.1f} s of training): test accuracy {:.4f}  loss {:.4f}", p.step,
                p.rank, p.trainSeconds, p.accuracy, p.loss);
    }
    metricsRow(p.epoch + 1, p.step, p.trainSeconds, p.rows, p.loss, p.auc, p.accuracy, p.samples);
  };
  const int64_t epochs = worker.epochs;
  worker.onEvent = [&](const workers::WorkerEvent& e) {
    std::lock_guard<std::recursive_mutex> lock(outputMutex);
    if (e.kind == workers::WorkerEvent::Kind::kProgress) {
      const int64_t total = e.rowsPerEpoch * epochs;
      const int64_t done = e.rowsPerEpoch * e.epoch + e.epochRows;
      progress.update(done, total,
                      fmt::format("epoch {}/{}  step {}  loss {:.4f}  {:.0f} samples/s", e.epoch + 1, epochs, e.step,
                                  e.meanLoss, e.samplesPerSec));
      return;
    }
    progress.finish();
    const auto& r = *e.eval;
    if (worker.core.kind == workers::ModelKind::kCount) {
      log->info("eval after epoch {} (step {}): {} of {} values equal the counts of the data", e.epoch + 1, e.step,
                r.countChecked - r.countWrong, r.countChecked);
    } else if (worker.core.kind == workers::ModelKind::kDlrm) {
      log->info("eval after epoch {} (step {}): test AUC {:.5f}  log-loss {:.5f}{}", e.epoch + 1, e.step, r.auc,
                r.loss,
                data.synthetic ? fmt::format("  (oracle AUC {:.5f}, log-loss {:.5f})", data.oracleAuc,
                                             data.oracleLogloss)
                               : "");
    } else {
      log->info("eval after epoch {} (step {}): test accuracy {:.4f}  loss {:.4f}", e.epoch + 1, e.step, r.accuracy,
                r.loss);
    }
    metricsRow(e.epoch + 1, e.step, e.elapsedSec, r.rows, r.loss, r.auc, r.accuracy, e.samples);
  };

  job.worker = worker;
  const int64_t clusterWorkers = config.getInt("cluster.workers");
  JobOutcome outcome;
  Expected<workers::TrainReport> report = Status::internal("no report");
  if (clusterWorkers <= 0 && !flags.coordinatorAddress.empty()) {
    TROUPE_SETUP_ERROR("launch --role coordinator needs cluster.workers >= 1 (--set cluster.workers=W)");
  }
  if (clusterWorkers <= 0 && trainMode(config) != TrainMode::kPs) {
    TROUPE_SETUP_ERROR("config: train.mode = {} needs worker processes (--set cluster.workers=W, W >= 1)",
                       trainModeName(trainMode(config)));
  }
  collectivesBackend(config);  // a bad value fails here, before any process starts
  const workers::PipelineConfig pipeline = workers::pipelineOf(config);
  if (pipeline.any()) {
    const std::string what = fmt::format("pipeline.stages = {}, pipeline.replicas = {}", pipeline.stages,
                                         pipeline.replicas);
    const bool dlrm = worker.core.kind == workers::ModelKind::kDlrm;
    if (worker.core.kind != workers::ModelKind::kMlp && !dlrm) {
      TROUPE_SETUP_ERROR("config: {} cuts the MLP or the DLRM into stages; the {} model is not cut", what,
                         config.getString("model.kind"));
    }
    if (dlrm && (pipeline.stages != 2 || !pipeline.cut.empty())) {
      TROUPE_SETUP_ERROR("config: {}: the DLRM is cut into 2 stages (its bottom MLP; the interaction and the top "
                         "MLP), with no pipeline.cut", what);
    }
    if (dlrm && clusterWorkers > 0) {
      TROUPE_SETUP_ERROR("config: {}: the DLRM's stages run in one process today (leave cluster.workers at 0); "
                         "across processes only the MLP's", what);
    }
    if (clusterWorkers > 0) {
      // A stage a process: rank r runs stage r % p of replica r / p.
      if (clusterWorkers != int64_t(pipeline.stages) * pipeline.replicas) {
        TROUPE_SETUP_ERROR("config: {} across processes needs cluster.workers = {} (a stage a process), not {}", what,
                           pipeline.stages * pipeline.replicas, clusterWorkers);
      }
      if (trainMode(config) != TrainMode::kAllReduce) {
        TROUPE_SETUP_ERROR("config: {} across processes sums each stage's gradients over its replicas: train.mode = "
                           "allreduce, not {}", what, trainModeName(trainMode(config)));
      }
      if (collectivesBackend(config) == "nccl") {
        TROUPE_SETUP_ERROR("config: {} across processes sums over the ring (collectives.backend = ring or auto)", what);
      }
      if (config.getString("supervision.on_worker_loss") == "shrink") {
        TROUPE_SETUP_ERROR("config: {} across processes cannot go on without a stage (supervision.on_worker_loss = "
                           "shrink): restart (every stage starts again from the latest checkpoint) or fail", what);
      }
      if (workers::compressionOf(config).any()) {
        TROUPE_SETUP_ERROR("config: {} across processes sends its gradients uncompressed (compression.*)", what);
      }
    }
    if (config.getInt("train.batch_size") < int64_t(pipeline.microBatches) * pipeline.replicas) {
      TROUPE_SETUP_ERROR("config: pipeline.micro_batches = {} a replica of {} cuts each batch of train.batch_size = "
                         "{}: at most one micro-batch a row", pipeline.microBatches, pipeline.replicas,
                         config.getInt("train.batch_size"));
    }
    if (pipeline.stages * pipeline.replicas > 256) {
      TROUPE_SETUP_ERROR("config: pipeline.stages x pipeline.replicas = {} stage threads; at most 256",
                         pipeline.stages * pipeline.replicas);
    }
    job.pipeline = pipeline;
    job.pipelineCut = dlrm ? std::vector<int>{0, 1, 2} : workers::pipelineCut(pipeline, worker.core.mlpWidths);
    job.pipelineStepTimeout = std::chrono::seconds(positive(config, "supervision.stall_timeout_s"));
    std::vector<std::string> stages;
    for (int st = 0; st < pipeline.stages; ++st) {
      stages.push_back(fmt::format("layers {}-{}", job.pipelineCut[size_t(st)], job.pipelineCut[size_t(st) + 1] - 1));
    }
    if (dlrm) stages = {"the embeddings and the bottom MLP", "the interaction and the top MLP"};
    log->info("train: the {} in {} pipeline stages ({}), {} micro-batches a batch, schedule {}{}{}",
              dlrm ? "DLRM" : "MLP", pipeline.stages,
              fmt::join(stages, ", "), pipeline.microBatches, workers::pipelineScheduleName(pipeline.schedule),
              pipeline.replicas > 1 ? fmt::format(", {} replicas (data parallel)", pipeline.replicas) : "",
              clusterWorkers > 0 ? ", a process a stage" : "");
  }
  {
    const workers::CompressionConfig c = workers::compressionOf(config);
    if (c.any() && clusterWorkers <= 0) {
      TROUPE_SETUP_ERROR("config: compression.* compresses what crosses between processes; a run in one process "
                         "sends nothing (--set cluster.workers=W, W >= 1)");
    }
    // A codec on a path this mode does not have would be silently idle.
    const TrainMode m = trainMode(config);
    if (m == TrainMode::kAllReduce && (c.push.kind != kernels::CodecKind::kNone || c.pull.kind != kernels::CodecKind::kNone)) {
      TROUPE_SETUP_ERROR("config: compression.push and compression.pull are paths to parameter servers; train.mode = "
                         "allreduce has none (use compression.allreduce)");
    }
    if (m == TrainMode::kPs && c.allreduce.kind != kernels::CodecKind::kNone) {
      TROUPE_SETUP_ERROR("config: compression.allreduce compresses the workers' all-reduce; train.mode = ps has none "
                         "(use compression.push and compression.pull)");
    }
  }
  if (trainMode(config) == TrainMode::kHybrid && worker.core.kind == workers::ModelKind::kMlp) {
    TROUPE_SETUP_ERROR("config: train.mode = hybrid keeps the embedding tables on the parameter servers and the "
                       "dense parameters in the workers' all-reduce; model.kind = mlp has no tables (use "
                       "train.mode = allreduce)");
  }
  if (clusterWorkers > 0) {
    outcome = runLocalJob(config, flags, runDir, progress, resumed,
                          [&evalPoint](const workers::EvalPoint& p, double) { evalPoint(p); }, liveMetrics);
    report = reportOf(outcome);
    if (report.hasValue() && !report->evals.empty() && worker.core.kind != workers::ModelKind::kCount) {
      // The final evaluation, after the last step (in one process the last
      // epoch's row is that).
      // Its step and seconds are worker 0's, as the points' are.
      const workers::EvalResult& r = report->evals.back();
      int64_t step = report->steps;
      double seconds = report->trainSeconds;
      for (const auto& w : outcome.workers) {
        if (w.rank == 0) step = w.steps, seconds = w.trainSeconds;
      }
      metricsRow(epochs, step, seconds, r.rows, r.loss, r.auc, r.accuracy, report->samples);
    }
    if (!outcome.faultPlan.empty()) {
      // The fault report, whether the job finished or not (written before a
      // baseline runs, and again with its figure once it has).
      progress.finish();
      const bool binary = worker.core.kind == workers::ModelKind::kDlrm;
      std::ofstream(runDir + "/faults.json") << workers::faultReportJson(workers::faultReport(outcome, binary));
      std::optional<workers::JobOutcome> baseline;
      if (flags.baseline && !interrupted) {
        // The same job, seed and data without the faults, in baseline/ of the run directory.
        Config free = config;
        free.setValue("faults.plan", std::vector<std::string>{});
        // Its checkpoints apart from the faulty run's.
        if (!config.getString("checkpoint.dir").empty()) {
          free.setValue("checkpoint.dir", config.getString("checkpoint.dir") + "/baseline");
        }
        const std::string dir = runDir + "/baseline";
        std::error_code ec;
        fs::create_directories(dir, ec);
        if (ec) TROUPE_SETUP_ERROR("cannot create '{}': {}", dir, ec.message());
        logger("apps")->info("--baseline: the same job without its faults, in {}", dir);
        baseline = runLocalJob(free, flags, dir, progress, resumed, nullptr, nullptr);
        progress.finish();
      }
      const workers::FaultReport faults = workers::faultReport(outcome, binary, baseline ? &*baseline : nullptr);
      if (baseline) std::ofstream(runDir + "/faults.json") << workers::faultReportJson(faults);
      std::printf("%s", workers::faultReportTable(faults).c_str());
      std::fflush(stdout);
    }
  } else {
    job.evalSchedule = evalSchedule;
    job.onEvalPoint = evalPoint;
    report = workers::runInProcess(job);
  }
  progress.finish();
  if (!report.hasValue()) {
    std::fprintf(stderr, "troupe: error: train: %s\n", report.status().message().c_str());
    return kExitFailure;
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wallStart).count();
  const workers::EvalResult last = report->evals.empty() ? workers::EvalResult{} : report->evals.back();
  const double samplesPerSec = report->trainSeconds > 0 ? double(report->samples) / report->trainSeconds : 0;
  const bool binary = worker.core.kind == workers::ModelKind::kDlrm;
  double kernelSeconds = 0;  // train.profile: the time inside every kernel call, summed
  for (const auto& e : report->kernelProfile) kernelSeconds += e.seconds;

  // summary.json: every string escaped, a number that is not finite (a
  // metric never evaluated) written as null.
  using Json = nlohmann::ordered_json;
  Json summary = Json::object();
  summary["model"] = config.getString("model.kind");
  if (binary) {
    summary["test_auc"] = last.auc;
    summary["test_logloss"] = last.loss;
    if (data.synthetic) {
      summary["oracle_auc"] = data.oracleAuc;
      summary["oracle_logloss"] = data.oracleLogloss;
    }
  } else {
    summary["test_accuracy"] = last.accuracy;
    summary["test_loss"] = last.loss;
  }
  if (!report->denseWeights.empty()) {
    // (a job of processes gives each worker's, in worker_reports)
    const auto& w = report->denseWeights;
    summary["dense_hash"] = fmt::format(
        "{:016x}", hashBytes(std::string_view(reinterpret_cast<const char*>(w.data()), w.size() * 4), 0));
  }
  summary["test_rows"] = last.rows;
  const bool counting = worker.core.kind == workers::ModelKind::kCount;
  if (counting) {
    summary["counts"] = {{"checked", last.countChecked},
                         {"wrong", last.countWrong},
                         {"errors", last.countErrors},
                         {"exact", last.countChecked > 0 && last.countWrong == 0}};
  }
  summary["samples_per_sec"] = samplesPerSec;
  summary["train_seconds"] = report->trainSeconds;
  summary["eval_seconds"] = report->evalSeconds;
  summary["wall_seconds"] = wall;
  if (evalSchedule.any()) {
    // Snapshots handed to the evaluator: evaluated (a row of metrics.csv
    // each), or replaced by a later one while a pass was under way.
    summary["evaluations_during_training"] = {{"points", evalPoints}, {"snapshots_replaced", snapshotsReplaced}};
  }
  summary["steps"] = report->steps;
  summary["samples"] = report->samples;
  summary["epochs"] = epochs;
  summary["batch_size"] = config.getInt("train.batch_size");
  summary["threads"] = threads;
  if (job.profile) {
    // Every kernel call of training (not of the evaluations), largest first.
    Json rows = Json::array();
    for (const auto& e : report->kernelProfile) {
      rows.push_back({{"kernel", e.kernel}, {"calls", e.calls}, {"seconds", e.seconds}, {"wall_seconds", e.wallSeconds}});
    }
    summary["kernel_profile"] = std::move(rows);
    summary["kernel_seconds"] = kernelSeconds;
    // Wall time with any kernel (or forEachIndependent) in flight: on many
    // threads the summed seconds count calls side by side once each.
    summary["kernel_wall_seconds"] = report->kernelWall.kernelSeconds;
    summary["side_by_side"] = {{"calls", report->kernelWall.sideBySideCalls},
                               {"wall_seconds", report->kernelWall.sideBySideSeconds}};
  }
  summary["blas_core"] = kernels::blasCoreName();
  summary["dense_parameters"] = report->denseWeights.size();
  summary["dense_macs_per_sample"] = report->macsPerSample;
  if (binary) {
    summary["embedding_rows_per_sample"] =
        report->samples ? double(report->pulledRows) / double(report->samples) : 0.0;
    summary["embedding_dim"] = worker.core.dlrm.embeddingDim;
    summary["embedding_optimizer"] = config.getString("train.embedding_optimizer");
  }
  if (clusterWorkers > 0) {
    summary["workers"] = clusterWorkers;
    summary["mode"] = trainModeName(trainMode(config));
    if (!outcome.collectivesBackend.empty()) summary["collectives_backend"] = outcome.collectivesBackend;
    summary["servers"] = serverCount(config);
    if (outcome.coordinatorNode) {  // (the coordinator's listener: where strangers knock)
      const transport::NodeStats& n = *outcome.coordinatorNode;
      summary["coordinator_transport"] = {{"handshakes_refused", n.handshakesRefused},
                                          {"handshakes_timed_out", n.handshakesTimedOut},
                                          {"idle_connections_closed", n.idleClosed},
                                          {"handshakes_abandoned", n.handshakesAbandoned},
                                          {"frames_dropped_unauthenticated", n.unauthenticatedDropped},
                                          {"frames_dropped_malformed", n.malformedDropped},
                                          {"seals_refused", n.sealsRefused},
                                          {"unsealed_refused", n.unsealedRefused},
                                          {"integrity", config.getString("transport.integrity")}};
    }
    summary["consistency"] = config.getString("ps.consistency");
    if (config.getString("ps.consistency") == "ssp") summary["staleness"] = config.getInt("ps.staleness");
    Json shards = Json::array();
    for (const auto& sh : outcome.shards) {
      shards.push_back({{"rank", sh.rank},
                        {"rows", sh.rows},
                        {"pushes_applied", sh.pushesApplied},
                        {"duplicate_pushes", sh.duplicatePushes},
                        {"pulls_served", sh.pullsServed},
                        {"pulls_delayed", sh.pullsDelayed},
                        {"max_lead", sh.maxLead},
                        {"samples_applied", sh.samplesApplied}});
    }
    Json perWorker = Json::array();
    for (const auto& w : outcome.workers) {
      perWorker.push_back({{"rank", w.rank},
                           {"steps", w.steps},
                           {"samples", w.samples},
                           {"train_seconds", w.trainSeconds},
                           {"pull_wait_seconds", w.pullWaitSeconds},
                           {"collective_seconds", w.collectiveSeconds},
                           {"dense_hash", fmt::format("{:016x}", w.denseHash)},
                           {"restarts", w.restarts},
                           {"resumed_at", w.resumedAt},
                           {"steps_redone", w.stepsRedone}});
    }
    Json lost = Json::array(), recovery = Json::array();
    for (const auto& e : outcome.events) {
      const bool recovered = e.recoveredAtSeconds >= 0;
      lost.push_back(e.what);
      recovery.push_back({{"what", e.what},
                          {"detected_by", e.detectedBy},
                          {"lost_at_s", e.lostAtSeconds},
                          {"lost_at_unix", std::round(e.lostAtUnix * 1000) / 1000},  // to the millisecond
                          {"action", e.action},
                          {"recovered_at_s", recovered ? Json(e.recoveredAtSeconds) : Json(nullptr)},
                          {"seconds_to_recover",
                           recovered ? Json(e.recoveredAtSeconds - e.lostAtSeconds) : Json(nullptr)}});
    }
    // Each path's bytes: as the transport counted them, and the ratio of
    // the tensors the path sent to their float32 size (the bytes the path
    // would have sent uncompressed: wire / ratio). Counts are written as
    // whole numbers.
    const workers::CompressionConfig compression = workers::compressionOf(config);
    auto whole = [](double v) { return int64_t(std::llround(v)); };
    Json wire = Json::array();
    for (const auto& t : outcome.traffic) {
      const double ratio = t.rawBytes > 0 ? t.encodedBytes / t.rawBytes : 1.0;
      const kernels::CodecOptions& c = t.path == "push" ? compression.push
                                       : t.path == "pull" ? compression.pull
                                                          : compression.allreduce;
      wire.push_back({{"path", t.path},
                      {"codec", kernels::codecName(c.kind)},
                      {"frames", whole(t.frames)},
                      {"wire_bytes", whole(t.wireBytes)},
                      {"wire_bytes_per_step", outcome.steps > 0 ? t.wireBytes / double(outcome.steps) : 0.0},
                      {"tensor_bytes", whole(t.encodedBytes)},
                      {"float32_tensor_bytes", whole(t.rawBytes)},
                      {"ratio", ratio},
                      {"uncompressed_wire_bytes", whole(ratio > 0 ? t.wireBytes / ratio : 0.0)},
                      {"messages", whole(t.messages)},
                      {"compressed", whole(t.compressed)}});
    }
    summary["compression_warmup_steps"] = compression.warmupSteps;
    summary["wire"] = std::move(wire);
    summary["shards"] = std::move(shards);
    {
      // Of the workers' training time, the share spent waiting: for
      // training pulls (the consistency gate, the network, the shards) and
      // in collectives.
      double train = 0, pull = 0, collective = 0;
      for (const auto& w : outcome.workers) {
        train += w.trainSeconds;
        pull += w.pullWaitSeconds;
        collective += w.collectiveSeconds;
      }
      // (null: no worker reported training time)
      summary["wait_fractions"] = {{"pull", train > 0 ? Json(pull / train) : Json(nullptr)},
                                   {"collective", train > 0 ? Json(collective / train) : Json(nullptr)}};
    }
    if (!outcome.shards.empty()) {
      // How many updates each push's gradient missed, over every shard
      // (ps::ShardStats::staleness; histogram[k]: pushes that missed k).
      const workers::StalenessSummary st = workers::summarizeStaleness(outcome.shards);
      summary["push_staleness"] = {{"pushes", st.pushes}, {"unknown", st.unknown}, {"mean", st.mean},
                                   {"p50", st.p50},       {"p99", st.p99},         {"max", st.max},
                                   {"histogram", st.histogram}};
    }
    summary["worker_reports"] = std::move(perWorker);
    summary["lost"] = std::move(lost);
    summary["recovery"] = std::move(recovery);
    Json ckpts = Json::array();
    for (const auto& c : outcome.checkpoints) {
      ckpts.push_back({{"id", c.id},
                       {"dir", c.dir},
                       {"step", c.step},
                       {"bytes", c.bytes},
                       {"paused_s", c.pausedSeconds},
                       {"written_s", c.writtenSeconds}});
    }
    summary["checkpoints"] = std::move(ckpts);
    Json rollbacks = Json::array();
    for (const auto& r : outcome.rollbacks) {
      rollbacks.push_back(
          {{"checkpoint", r.checkpoint}, {"dir", r.dir}, {"at_s", r.atSeconds}, {"steps_redone", r.stepsRedone}});
    }
    summary["rollbacks"] = std::move(rollbacks);
    if (outcome.replicas > 1) {
      summary["replicas"] = outcome.replicas;
      summary["promotions"] = workers::promotionsJson(outcome.promotions);
      summary["copies_built"] = workers::copiesBuiltJson(outcome.replicasBuilt);
    }
    if (outcome.resumedFromStep >= 0) summary["resumed_from_step"] = outcome.resumedFromStep;
    if (trainMode(config) != TrainMode::kPs) summary["regroups"] = outcome.regroups;
    const workers::Ledger ledger = workers::ledgerOf(outcome);
    if (outcome.shards.empty()) {
      // allreduce mode: every step applied every rank's batch; each worker
      // counted the samples of the steps taken, and they must agree.
      summary["ledger"] = {{"expected_samples", ledger.expectedSamples},
                           {"samples_applied", ledger.samplesApplied.at(0)},
                           {"workers_agree", ledger.workersAgree},
                           {"exact", ledger.exact}};
    } else {
      // Each shard applied every sample of every epoch once, and holds
      // every push its workers were acknowledged.
      int64_t applied = 0;
      for (const auto& sh : outcome.shards) applied += sh.pushesApplied;
      summary["ledger"] = {{"expected_samples_per_shard", ledger.expectedSamples},
                           {"samples_applied_per_shard", ledger.samplesApplied},
                           {"pushes_applied", applied},
                           {"duplicates_suppressed", ledger.duplicatesSuppressed},
                           {"pushes_acknowledged", ledger.pushesAcknowledged},
                           {"pushes_in_state_per_shard", ledger.pushesInState},
                           {"ranks_not_counted", ledger.ranksNotCounted},
                           {"exact", ledger.exact}};
    }
  }
  if (workers::skipsBadRecords(config) && config.getString("data.kind") == "criteo") {
    // data.on_bad_record = skip: how many lines of each file were dropped
    // (one more pass over each, counting; every reader logged its first few).
    Json bad = Json::object();
    for (const char* which : {"train", "test"}) {
      auto n = data::countBadCriteoLines(config.getString(std::string("data.") + which),
                                         int(config.getInt("data.categorical")),
                                         std::string(which) == "train" ? config.getInt("data.max_train_rows") : -1);
      bad[which] = n.hasValue() ? Json(*n) : Json(nullptr);
      if (n.hasValue() && *n > 0) log->warn("data.on_bad_record = skip: {} malformed lines of the {} file skipped", *n, which);
    }
    summary["bad_records"] = std::move(bad);
  }
  summary["run_dir"] = runDir;
  // (invalid UTF-8 in a path or a name is replaced, not thrown over)
  const std::string json = summary.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
  { std::ofstream(runDir + "/summary.json") << json; }
  if (!flags.summaryJson.empty()) {
    std::ofstream out(flags.summaryJson);
    out << json;
    if (!out) TROUPE_SETUP_ERROR("cannot write --summary-json '{}'", flags.summaryJson);
  }
  if (!flags.predictions.empty()) {
    std::FILE* f = std::fopen(flags.predictions.c_str(), "w");
    if (!f) TROUPE_SETUP_ERROR("cannot write --predictions '{}'", flags.predictions);
    for (size_t i = 0; i < last.labels.size(); ++i) {
      if (binary) {
        std::fprintf(f, "%d\t%.9g\n", int(last.labels[i]), last.predictions[i]);
      } else {
        std::fprintf(f, "%d\t%d\n", int(last.labels[i]), int(last.predictions[i]));
      }
    }
    std::fclose(f);
  }
  const bool countsExact = last.countChecked > 0 && last.countWrong == 0;
  if (counting) {
    if (countsExact) {
      std::printf("counts: all %lld values (every key's row, the dense parameters) equal the counts of the data: "
                  "exact\n",
                  static_cast<long long>(last.countChecked));
    } else {
      std::printf("counts: %lld of %lld values NOT EXACT: %s\n", static_cast<long long>(last.countWrong),
                  static_cast<long long>(last.countChecked), last.countErrors.c_str());
    }
  } else if (binary) {
    std::printf("test AUC %.5f  log-loss %.5f", last.auc, last.loss);
    if (data.synthetic) std::printf("   oracle AUC %.5f  log-loss %.5f", data.oracleAuc, data.oracleLogloss);
    std::printf("\n");
  } else {
    std::printf("test accuracy %.4f  loss %.4f\n", last.accuracy, last.loss);
  }
  std::printf("%lld steps, %.0f samples/s, %.1f s training, %.1f s wall; run directory %s\n",
              static_cast<long long>(report->steps), samplesPerSec, report->trainSeconds, wall, runDir.c_str());
  if (const auto st = workers::summarizeStaleness(outcome.shards); st.pushes > 0) {
    std::printf("staleness (updates a push's gradient missed): mean %.2f, p50 %lld, p99 %lld, max %lld over %lld "
                "pushes\n",
                st.mean, static_cast<long long>(st.p50), static_cast<long long>(st.p99),
                static_cast<long long>(st.max), static_cast<long long>(st.pushes));
  }
  if (job.profile && report->trainSeconds > 0) {
    // train.profile: where training's compute went. "summed" adds up calls
    // on every thread; "wall" counts the time with at least one call in
    // flight, so calls side by side count once. forEachIndependent's row is
    // the per-table pieces (key columns, the tables' maps, row copies, and
    // the kernels they call); the last row is outside every kernel and every
    // piece (the step's own code, the messages, the waits).
    const double train = report->trainSeconds;
    std::printf("kernel profile (%d threads; %% of %.2f s training, by wall time):\n", threads, train);
    std::printf("  %-24s %15s %10s %10s %7s\n", "kernel", "calls", "summed s", "wall s", "wall %");
    for (const auto& e : report->kernelProfile) {
      std::printf("  %-24s %9lld calls %10.3f %10.3f %6.1f%%\n", e.kernel.c_str(), static_cast<long long>(e.calls),
                  e.seconds, e.wallSeconds, 100 * e.wallSeconds / train);
    }
    const auto& wall = report->kernelWall;
    if (wall.sideBySideCalls > 0) {
      std::printf("  %-24s %9lld calls %10s %10.3f %6.1f%%  (per-table pieces side by side)\n", "forEachIndependent",
                  static_cast<long long>(wall.sideBySideCalls), "", wall.sideBySideSeconds,
                  100 * wall.sideBySideSeconds / train);
    }
    const double outside = std::max(0.0, train - wall.kernelSeconds);
    std::printf("  %-24s %15s %10s %10.3f %6.1f%%\n", "(not in a kernel)", "", "", outside, 100 * outside / train);
  }
  // The count model is a check: values that are not the counts fail it.
  return counting && !countsExact ? kExitFailure : kExitOk;
}

int runCoordinatorCommand(const CommonFlags& common, const std::string& address, const std::string& summaryJson,
                          int metricsPort) {
  TrainFlags flags;
  flags.common = common;
  flags.coordinatorAddress = address;
  flags.summaryJson = summaryJson;
  flags.metricsPort = metricsPort;
  return runTrain(flags);
}

void addTrainCommand(CLI::App* app, int* result) {
  auto flags = std::make_shared<TrainFlags>();
  auto* cmd = app->add_subcommand("train", "Train a model: in one process, or with cluster.workers > 0 as a multi-process parameter-server job on this machine");
  addCommonFlags(cmd, &flags->common);
  cmd->add_option("--summary-json", flags->summaryJson, "write the run's summary (metrics, speed) as JSON here");
  cmd->add_option("--predictions", flags->predictions,
                  "write the test predictions here: true label, a tab, the predicted probability or class");
  cmd->add_option("--resume", flags->resume,
                  "go on from the latest checkpoint of this run directory (or from this checkpoint directory), with "
                  "its config and any --set changes");
  cmd->add_flag("--baseline", flags->baseline,
               "with a fault plan: also run the same job without its faults, and set its test AUC (or accuracy) "
               "beside this one's in the fault report");
  cmd->add_option("--metrics-port", flags->metricsPort,
                  "a job of processes: serve its metrics (Prometheus text format) at "
                  "http://<transport.listen_host>:PORT/metrics while it runs");
  addFaultFlag(cmd, &flags->common);
  cmd->callback([=] { *result = runGuarded([&] { return runTrain(*flags); }); });
}

}  // namespace troupe::apps
