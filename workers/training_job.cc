#include "workers/training_job.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>

#include <fmt/ranges.h>

#include <caf/all.hpp>

#include "collectives/nccl_communicator.h"
#include "common/check.h"
#include "common/checksum_file.h"
#include "common/logging.h"
#include "common/mailbox.h"
#include "ps/wire.h"
#include "transport/remote_actors.h"
#include "workers/model_image.h"
#include "workers/residual_image.h"

namespace troupe::workers {
namespace {

using namespace std::chrono_literals;
using transport::DType;
using transport::Tensor;
using recheck_atom = caf::atom_constant<caf::atom("recheck")>;
using regroup_check_atom = caf::atom_constant<caf::atom("regroupchk")>;
using rebuild_atom = caf::atom_constant<caf::atom("rebuild")>;
using stall_atom = caf::atom_constant<caf::atom("stall")>;
using live_atom = caf::atom_constant<caf::atom("livepoll")>;
using pause_timeout_atom = caf::atom_constant<caf::atom("pausetime")>;
using write_timeout_atom = caf::atom_constant<caf::atom("writetime")>;
using Clock = std::chrono::steady_clock;

std::shared_ptr<spdlog::logger> log() { return logger("job"); }

}  // namespace

actors::CoordinatorOptions coordinatorOptions(const Config& config) {
  actors::CoordinatorOptions o;
  const int64_t servers = serverCount(config);
  const int64_t workers = config.getInt("cluster.workers");
  if (servers > 0) o.groups.push_back({"ps", servers});
  o.groups.push_back({"worker", workers});
  o.config = config.toToml();
  o.startTimeout = std::chrono::seconds(positive(config, "cluster.start_timeout_s"));
  o.replaceTimeout = std::chrono::seconds(positive(config, "supervision.replace_timeout_s"));
  const int64_t maxRestarts = config.getInt("supervision.max_restarts");  // >= 0: the schema's range
  o.restarts = actors::RestartPolicy{maxRestarts, std::chrono::seconds(positive(config, "supervision.restart_window_s"))};
  (void)workerLossPolicy(config);  // checked here, before any process starts
  (void)psReplicas(config);
  return o;
}

WorkerLoss workerLossPolicy(const Config& config) {
  const std::string p = config.getString("supervision.on_worker_loss");
  if (p == "restart") return WorkerLoss::kRestart;
  if (p == "fail") return WorkerLoss::kFail;
  if (p == "shrink") {
    // ps mode: the lost rank moves into a live worker's process. allreduce
    // and hybrid (ring backend): the group forms again without it; in
    // hybrid mode the shards first undo the steps it may have left half
    // pushed, which BSP shards can (they keep their last step's state).
    const TrainMode mode = trainMode(config);
    if (mode != TrainMode::kPs && collectivesBackend(config) != "ring") {
      TROUPE_SETUP_ERROR("config: supervision.on_worker_loss = shrink in {} mode is built for the ring backend; this "
                         "job has collectives.backend = {} (use restart or fail)",
                         trainModeName(mode), collectivesBackend(config));
    }
    if (mode == TrainMode::kHybrid && config.getString("ps.consistency") != "bsp") {
      TROUPE_SETUP_ERROR("config: supervision.on_worker_loss = shrink in hybrid mode is built for ps.consistency = "
                         "bsp (its shards can undo a step); this job has {} (use restart or fail)",
                         config.getString("ps.consistency"));
    }
    return WorkerLoss::kShrink;
  }
  TROUPE_SETUP_ERROR("config: supervision.on_worker_loss must be restart, shrink or fail, not '{}'", p);
}

StalenessSummary summarizeStaleness(const std::vector<ShardSummary>& shards) {
  StalenessSummary out;
  for (const auto& sh : shards) {
    if (out.histogram.size() < sh.staleness.size()) out.histogram.resize(sh.staleness.size(), 0);
    for (size_t k = 0; k < sh.staleness.size(); ++k) out.histogram[k] += sh.staleness[k];
    out.unknown += sh.stalenessUnknown;
  }
  double sum = 0;
  for (size_t k = 0; k < out.histogram.size(); ++k) {
    out.pushes += out.histogram[k];
    sum += double(k) * double(out.histogram[k]);
    if (out.histogram[k] > 0) out.max = int64_t(k);
  }
  if (out.pushes == 0) return out;
  out.mean = sum / double(out.pushes);
  int64_t seen = 0;
  for (size_t k = 0; k < out.histogram.size(); ++k) {
    seen += out.histogram[k];
    if (out.p50 < 0 && 2 * seen >= out.pushes) out.p50 = int64_t(k);
    if (out.p99 < 0 && 100 * seen >= 99 * out.pushes) out.p99 = int64_t(k);
  }
  return out;
}

TrainingJob::TrainingJob(const Config& config, TrainingJobOptions options)
    : onProgress_(std::move(options.onProgress)), onEval_(std::move(options.onEval)), onLive_(std::move(options.onLive)),
      liveEvery_(options.liveEvery), configText_(config.toToml()), config_(config) {
  generation_ = config.getInt("cluster.generation");
  if (const PipelineConfig pipe = pipelineOf(config); pipe.any()) pipelineStages_ = pipe.stages;
  checkpointBase_ = options.checkpointDir;
  if (!checkpointBase_.empty()) shape_ = jobShapeOf(config);
  checkpointEverySteps_ = std::max<int64_t>(0, config.getInt("checkpoint.every_steps"));
  checkpointEverySeconds_ = std::chrono::seconds(std::max<int64_t>(0, config.getInt("checkpoint.every_seconds")));
  checkpointKeep_ = positive(config, "checkpoint.keep");
  if (checkpointBase_.empty()) checkpointEverySteps_ = 0, checkpointEverySeconds_ = std::chrono::seconds(0);
  if (!checkpointBase_.empty()) nextCheckpointId_ = highestCheckpointId(checkpointBase_) + 1;
  if (options.resumedFrom) {
    nextCheckpointId_ = std::max(nextCheckpointId_, options.resumedFrom->id + 1);
    const auto& steps = options.resumedFrom->workerSteps;
    lastCheckpointStep_ = steps.empty() ? 0 : *std::min_element(steps.begin(), steps.end());
    outcome_.resumedFromStep = lastCheckpointStep_;
    latestCheckpoint_ = config.getString("checkpoint.resume");
    latestCheckpointId_ = options.resumedFrom->id;
    latestCut_ = steps;
  }
  workers_ = config.getInt("cluster.workers");
  servers_ = serverCount(config);
  replicas_ = servers_ > 0 ? psReplicas(config) : 1;
  primaryHost_.resize(size_t(servers_));
  for (int64_t k = 0; k < servers_; ++k) primaryHost_[size_t(k)] = k;
  backupSynced_.assign(size_t(servers_), replicas_ == 2);
  rebuildToken_.assign(size_t(servers_), 0);
  outcome_.replicas = replicas_;
  progressEvery_ = std::max<int64_t>(1, config.getInt("train.progress_every"));
  mode_ = trainMode(config);
  faults_ = std::make_unique<actors::FaultInjector>(actors::parseFaultPlan(config, workers_, servers_));
  auto consistency = ps::parseConsistency(config.getString("ps.consistency"));
  if (!consistency.hasValue()) TROUPE_SETUP_ERROR("config: ps.consistency: {}", consistency.status().message());
  consistency_ = *consistency;
  backend_ = collectivesBackend(config);
  {
    const CompressionConfig compression = compressionOf(config);
    residuals_ = (mode_ != TrainMode::kAllReduce && compression.push.kind != kernels::CodecKind::kNone) ||
                 (mode_ != TrainMode::kPs && compression.allreduce.kind != kernels::CodecKind::kNone);
  }
  onWorkerLoss_ = workerLossPolicy(config);
  epochs_ = config.getInt("train.epochs");
  maxSteps_ = config.getInt("train.max_steps");
  stallTimeout_ = std::chrono::seconds(positive(config, "supervision.stall_timeout_s"));
  collectiveTimeout_ = collectivesTimeout(config);
  lastProgress_.assign(size_t(workers_), Clock::now());
  lastStep_.assign(size_t(workers_), 0);
  for (int64_t w = 0; w < workers_ && size_t(w) < latestCut_.size(); ++w) lastStep_[size_t(w)] = latestCut_[size_t(w)];
  for (int64_t w = 0; w < workers_; ++w) holdsModel_.insert(w);
  rate_.assign(size_t(workers_), 0.0);
  progressSamples_.assign(size_t(workers_), 0);
  reported_.assign(size_t(workers_), false);
  offers_.resize(size_t(workers_));
  outcome_.workers.resize(size_t(workers_));
  for (int64_t w = 0; w < workers_; ++w) outcome_.workers[size_t(w)].rank = w;
  if (mode_ != TrainMode::kPs) outcome_.collectivesBackend = "ring";
  // (A pipeline's processes all read every batch: one part.)
  divisions_.push_back(DataDivision{0, 0, pipelineStages_ > 0 ? 1 : workers_});
  if (options.resumedFrom && mode_ != TrainMode::kPs) {
    // How the data was divided up to the cut (a group may have shrunk), then
    // the resumed job's ranks, all of them, divide what is left of the
    // cut's epoch.
    if (!options.resumedFrom->divisions.empty()) divisions_ = options.resumedFrom->divisions;
    divisions_.push_back(DataDivision{options.resumedFrom->cutEpoch, options.resumedFrom->cutBatch,
                                      pipelineStages_ > 0 ? 1 : workers_});
  }
}

// Samples every epoch applies once: all of them in ps mode; in a sync mode
// a step takes a batch of every rank, so an epoch takes whole rounds of W
// batches (rank r holds batches r, r + W, ...), and what is left over after
// the last whole round is not trained.
int64_t TrainingJob::expectedSamples(int64_t rowsPerEpoch) const {
  if (mode_ == TrainMode::kPs) return rowsPerEpoch * epochs_;
  // By the divisions of the data the job's groups trained by (a group
  // that shrank divides what is left of the epoch among fewer ranks).
  return syncSamples(rowsPerEpoch, std::max<int64_t>(1, config_.getInt("train.batch_size")), epochs_, divisions_);
}

// A shard's answer to stats_atom, into `out`; what its other answers filled
// in (staleness, queues) stays.
void setShardCounters(ShardSummary& out, int64_t shard, int64_t rows, int64_t pushes, int64_t dups, int64_t served,
                      int64_t delayed, int64_t lead, int64_t samples, std::vector<int64_t> byWorker) {
  out.rank = shard;
  out.rows = rows;
  out.pushesApplied = pushes;
  out.duplicatePushes = dups;
  out.pullsServed = served;
  out.pullsDelayed = delayed;
  out.maxLead = lead;
  out.samplesApplied = samples;
  out.pushesByWorker = std::move(byWorker);
}

void TrainingJob::pollLive(actors::JobContext& job) {
  struct Poll {
    LiveFigures figures;
    std::map<int64_t, ShardSummary> shards;
    int64_t left = 1;
  };
  if (livePolling_) return;  // (the last one has not answered yet: a slow shard is not asked twice)
  livePolling_ = true;
  auto poll = std::make_shared<Poll>();
  poll->figures.coordinatorMailbox = mailboxDepth(job.self());
  auto done = [this, &job, poll] {
    if (--poll->left > 0) return;
    livePolling_ = false;
    if (!onLive_ || job.over()) return;
    // The recoveries as of now (a poll's answers may have taken seconds).
    poll->figures.rollbacks = int64_t(outcome_.rollbacks.size());
    poll->figures.backupsPromoted = int64_t(outcome_.promotions.size());
    for (const std::string role : {"ps", "worker"}) {
      for (const auto& m : job.members(role)) poll->figures.processesReplaced += std::max<int64_t>(0, m.incarnation);
    }
    for (auto& [rank, s] : poll->shards) poll->figures.shards.push_back(std::move(s));
    onLive_(poll->figures);
  };
  auto dropped = [done](caf::error&) { done(); };  // (a shard that does not answer now is left out)
  // Every live process's traffic (its agent answers from its node's counters).
  for (const std::string role : {"ps", "worker"}) {
    for (const auto& m : job.members(role)) {
      if (!m.agent || !m.live()) continue;
      ++poll->left;
      job.self()
          ->request(m.agent, 5s, actors::links_atom::value)
          .then([poll, done](actors::LinkCounts& c) { poll->figures.processes.push_back(std::move(c)), done(); },
                dropped);
    }
  }
  const auto& psMembers = job.members("ps");
  for (int64_t s = 0; s < servers_; ++s) {
    // (Shard s is served by its primary's process: with ps.replicas = 2 not
    // always process s.)
    const int64_t host = primaryHost_[size_t(s)];
    if (host < 0 || host >= int64_t(psMembers.size()) || !psMembers[size_t(host)].live()) continue;
    poll->left += 3;
    job.self()
        ->request(shardActor(job, s), 5s, ps::stats_atom::value)
        .then(
            [poll, s, done](int64_t rows, int64_t pushes, int64_t dups, int64_t served, int64_t delayed, int64_t lead,
                            int64_t samples, std::vector<int64_t>& byWorker) {
              setShardCounters(poll->shards[s], s, rows, pushes, dups, served, delayed, lead, samples,
                               std::move(byWorker));
              done();
            },
            dropped);
    job.self()
        ->request(shardActor(job, s), 5s, ps::staleness_atom::value)
        .then(
            [poll, s, done](std::vector<int64_t>& histogram, int64_t unknown) {
              ShardSummary& out = poll->shards[s];
              out.rank = s;
              out.staleness = std::move(histogram);
              out.stalenessUnknown = unknown;
              done();
            },
            dropped);
    job.self()
        ->request(shardActor(job, s), 5s, ps::queues_atom::value)
        .then(
            [poll, s, done](int64_t parked, int64_t pending, int64_t awaiting, int64_t mailbox) {
              ShardSummary& out = poll->shards[s];
              out.rank = s;
              out.parkedPulls = parked;
              out.pendingSteps = pending;
              out.awaitingBackup = awaiting;
              out.mailbox = mailbox;
              done();
            },
            dropped);
  }
  done();
}

void TrainingJob::onStart(actors::JobContext& job) {
  started_ = true;
  awaitingReplacement_.clear();  // every rank has its process
  lastProgress_.assign(size_t(workers_), Clock::now());
  job.self()->delayed_send(job.self(), 1s, stall_atom::value);
  if (onLive_ && liveEvery_.count() > 0) job.self()->delayed_send(job.self(), liveEvery_, live_atom::value);
  faults_->start(job);
  log()->info("all {} processes are ready; training starts ({} mode, {}, {} workers, {} shards)", workers_ + servers_,
              trainModeName(mode_), ps::consistencyName(consistency_), workers_, servers_);
}

// The gate opens once every live worker that has not finished asked.
void TrainingJob::checkGate(actors::JobContext& job) {
  if (gateOpen_ || job.over() || gateWaiters_.empty() || !awaitingReplacement_.empty()) return;
  int64_t lead = -1;
  for (const auto& w : job.members("worker")) {
    if (!w.live()) continue;
    if (!gateWaiters_.count(w.rank)) return;  // someone still training
    if (lead < 0) lead = w.rank;
  }
  gateOpen_ = true;
  evaluator_ = lead;
  log()->info("every worker finished training; worker {} evaluates the model", lead);
  for (auto& [rank, promise] : gateWaiters_) {
    if (rank == lead || mode_ == TrainMode::kPs) {
      promise.deliver(GateDecision{rank == lead});
    } else {
      // Sync modes: the model lives in the workers, so the others stand by
      // (holding it) until the lead has evaluated; one takes its place if
      // it is lost first.
      standby_.insert_or_assign(rank, promise);
    }
  }
  gateWaiters_.clear();
}

void TrainingJob::checkDone(actors::JobContext& job) {
  // The evaluation of a rank lost on its way to the end comes from its
  // replacement (a rank that was not to evaluate is not waited for: its
  // pushes are in and the ledger counts it out).
  if (!awaitingReplacement_.empty() && (!gateOpen_ || (evaluator_ < 0 && !outcome_.evaluated))) return;
  int live = 0;
  for (const auto& w : job.members("worker")) {
    if (w.state == actors::MemberState::kLost) continue;
    ++live;
    if (!reported_[size_t(w.rank)]) return;
  }
  if (live == 0) return job.fail("every worker was lost");
  finalize(job);
}

void TrainingJob::finalize(actors::JobContext& job) {
  if (finishing_ || job.over()) return;
  finishing_ = true;
  if (!outcome_.evaluated) {
    return job.fail("every worker finished, but none evaluated the model (the evaluating worker was lost)");
  }
  // The shards' counters (and with message faults every process's link
  // counters), then the end.
  auto left = std::make_shared<int64_t>(1);
  auto done = [&job, left] {
    if (--*left == 0) job.finish();
  };
  outcome_.shards.assign(size_t(servers_), ShardSummary{});
  for (const auto& m : servers_ > 0 ? job.members("ps") : std::vector<actors::Member>{}) {
    const int64_t s = m.rank;
    ++*left;
    job.self()
        ->request(shardActor(job, m.rank), 10s, ps::stats_atom::value)
        .then(
            [this, s, done](int64_t rows, int64_t pushes, int64_t dups, int64_t served, int64_t delayed, int64_t lead,
                            int64_t samples, std::vector<int64_t>& byWorker) {
              setShardCounters(outcome_.shards[size_t(s)], s, rows, pushes, dups, served, delayed, lead, samples,
                               std::move(byWorker));
              done();
            },
            [&job, s](caf::error& err) {
              job.fail(fmt::format("ps {} did not report its counters: {}", s, actors::describe(err)));
            });
    ++*left;
    job.self()
        ->request(shardActor(job, m.rank), 10s, ps::staleness_atom::value)
        .then(
            [this, s, done](std::vector<int64_t>& histogram, int64_t unknown) {
              outcome_.shards[size_t(s)].staleness = std::move(histogram);
              outcome_.shards[size_t(s)].stalenessUnknown = unknown;
              done();
            },
            [&job, s](caf::error& err) {
              job.fail(fmt::format("ps {} did not report its staleness: {}", s, actors::describe(err)));
            });
  }
  if (!faults_->plan().messages.empty()) {
    for (const std::string role : {"ps", "worker"}) {
      for (const auto& m : job.members(role)) {
        if (!m.agent || m.state == actors::MemberState::kLost) continue;
        ++*left;
        job.self()
            ->request(m.agent, 5s, actors::links_atom::value)
            .then([this, done](actors::LinkCounts& c) { keepLinks(std::move(c)), done(); },
                  [done, who = m.describe()](caf::error& err) {
                    log()->warn("{} did not say what its links did: {}", who, actors::describe(err));
                    done();
                  });
      }
    }
  }
  done();
}

void TrainingJob::keepLinks(actors::LinkCounts c) {
  if ((c.role != "ps" && c.role != "worker") || c.rank < 0 || c.rank >= (c.role == "ps" ? servers_ : workers_)) return;
  const auto key = std::make_tuple(c.role, c.rank, c.incarnation);
  links_.insert_or_assign(key, std::move(c));
}

actors::LossDecision TrainingJob::onLoss(actors::JobContext& job, const actors::Member& m, const actors::Loss& loss) {
  actors::LossDecision d = decideLoss(job, m, loss);
  // A worker rank that a process is to take again is still training: the
  // gate waits for it (in ASP the others may be done long before). One the
  // job goes on without waits no more.
  if (m.role == "worker") {
    unheard_.erase(m.rank);  // a process that takes it next is waited for anew
    standby_.erase(m.rank);
    if (gateOpen_ && m.rank == evaluator_ && !outcome_.evaluated) {
      // Another evaluates: a worker standing by with the model (sync
      // modes), or the rank's replacement (ps mode: the model is on the shards).
      evaluator_ = -1;
      if (!standby_.empty()) {
        auto next = standby_.begin();
        evaluator_ = next->first;
        log()->warn("worker {} evaluates the model (worker {}, which was to, was lost)", next->first, m.rank);
        next->second.deliver(GateDecision{true});
        standby_.erase(next);
      }
    }
    if (started_ &&
        (d.action == actors::LossDecision::Action::kReplace || d.action == actors::LossDecision::Action::kAdopt)) {
      awaitingReplacement_.insert(m.rank);
    } else if (awaitingReplacement_.erase(m.rank) != 0) {
      job.self()->send(job.self(), recheck_atom::value);
    }
  }
  return d;
}

actors::LossDecision TrainingJob::decideLoss(actors::JobContext& job, const actors::Member& m,
                                             const actors::Loss& loss) {
  const std::string what = fmt::format("{} {}", m.describe(), loss.describe());
  // Whatever takes the rank next starts a new stall clock (a rank lost
  // because it hung must not be found hung again, in its new place, at once).
  if (m.role == "worker") lastProgress_[size_t(m.rank)] = Clock::now();
  if (m.role == "ps" && replicas_ == 2) return replicaLoss(job, m, what);
  if (m.role == "ps") {
    if (latestCheckpoint_.empty()) {
      return actors::LossDecision::fail(what + "; its shard of the model is gone, and the job has no checkpoint to "
                                               "roll back to (checkpoint.every_steps, checkpoint.every_seconds)");
    }
    if (mode_ == TrainMode::kHybrid && onWorkerLoss_ == WorkerLoss::kShrink) {
      for (const auto& w : job.members("worker")) {
        if (w.state != actors::MemberState::kLost) continue;
        return actors::LossDecision::fail(fmt::format(
            "{}; the workers' group went on without worker {} (supervision.on_worker_loss = shrink), so the job "
            "cannot roll back to checkpoint {} with every rank (resume it: troupe train --resume)",
            what, w.rank, latestCheckpointId_));
      }
    }
    for (int64_t w = 0; w < workers_; ++w) {
      if (reported_[size_t(w)]) {
        return actors::LossDecision::fail(
            fmt::format("{}; worker {} had finished already, so the job cannot roll back to checkpoint {}", what, w,
                        latestCheckpointId_));
      }
    }
    rollBack(job, m.rank, fmt::format("ps {} was lost", m.rank));
    return actors::LossDecision::replace();
  }
  if (loss.reason == actors::Errc::kRolledBack) return actors::LossDecision::replace();
  if (loss.reason == actors::Errc::kSetupFailed) return actors::LossDecision::fail(what);  // a new one fails alike
  if (onWorkerLoss_ == WorkerLoss::kFail) {
    return actors::LossDecision::fail(what + " (supervision.on_worker_loss = fail)");
  }
  if (mode_ != TrainMode::kPs) {
    if (outcome_.collectivesBackend != "ring") {
      return actors::LossDecision::fail(fmt::format(
          "{}; the workers use {} for their collectives, and forming that group again is not built (with "
          "collectives.backend = ring a lost worker is replaced)",
          what, outcome_.collectivesBackend));
    }
    // A checkpoint whose cut is taken (the model copied) stands; one on its
    // way is given up (the group forms again first).
    if (ckpt_.active && (!ckpt_.snapshotting || ckpt_.snapshotsLeft > 0)) {
      abandonCheckpoint(job, fmt::format("worker {} was lost", m.rank));
    }
    regroupReady_.erase(m.rank);
    regroupUnreachable_.erase(m.rank);
    regroupSteps_.erase(m.rank);
    regroupsSinceLoss_ = 0;
    forming_ = false;  // that group cannot form now; the next one will
    // In a sync mode every worker ends training at the same step: one at the
    // gate means all are done, and the rest go on without the lost one.
    for (const auto& w : job.members("worker")) {
      if (gateOpen_ || (w.rank != m.rank && (gateWaiters_.count(w.rank) || reported_[size_t(w.rank)]))) {
        log()->warn("{}: training was over; the others finish without it", what);
        gateWaiters_.erase(m.rank);
        job.self()->send(job.self(), recheck_atom::value);
        return actors::LossDecision::goOn();
      }
    }
    if (pipelineStages_ > 0) {
      // A pipeline's stage is in one process a replica, and the stages of
      // the others have gone on without its gradients or stopped mid-step:
      // every process starts again, from the latest checkpoint (step 0
      // without one: its initial model is the seed's), and redoes the steps.
      outcome_.workers[size_t(m.rank)].restarts += 1;
      rollBack(job, -1, what + "; it held a pipeline stage");
      return actors::LossDecision::replace();
    }
    awaitingGroup_ = true;  // no checkpoint until the group trains again
    // Without a checkpoint in sync modes the model lives in the workers: a
    // replacement copies it from a survivor, so losing every process that
    // holds it (a replacement gets it once its group formed) ends the job.
    holdsModel_.erase(m.rank);
    if (holdsModel_.empty()) {
      // An allreduce job without a checkpoint starts again from step 0 (its
      // initial model is the seed's); a hybrid one's shards have moved on.
      const bool fromStart = latestCheckpoint_.empty() && mode_ == TrainMode::kAllReduce;
      if ((latestCheckpoint_.empty() && !fromStart) || onWorkerLoss_ == WorkerLoss::kShrink) {
        return actors::LossDecision::fail(
            what + "; no live worker holds the model any more (the others are replacements still waiting for it), "
                   "so the group cannot form again" +
            (latestCheckpoint_.empty() ? " (and the job has no checkpoint to roll back to)" : ""));
      }
      // The model is in the latest checkpoint: every rank starts again
      // from it (and the shards of a hybrid job go back to it too).
      outcome_.workers[size_t(m.rank)].restarts += 1;
      rollBack(job, -1, what + "; no live worker held the model any more");
      return actors::LossDecision::replace();
    }
    const bool shrink = onWorkerLoss_ == WorkerLoss::kShrink;
    if (shrink) {
      log()->warn("{}: the others form the group without it and divide what is left of the data "
                  "(supervision.on_worker_loss = shrink)",
                  what);
    } else {
      outcome_.workers[size_t(m.rank)].restarts += 1;
      log()->warn("{}: a new process takes its rank, and the group forms again", what);
    }
    for (const auto& w : job.members("worker")) {
      if (w.rank != m.rank && w.live()) job.self()->send(job.actorOf(w, trainerName(w.rank)), RegroupNow{m.rank, regroupEpoch_ + 1});
    }
    if (shrink) {
      // Hybrid: the shards undo what it left half done before the group forms.
      if (mode_ == TrainMode::kHybrid) toRevert_.insert(m.rank);
      // The others may all be ready already (their collectives failed first).
      job.self()->send(job.self(), regroup_check_atom::value);
      return actors::LossDecision::goOn();
    }
    return actors::LossDecision::replace();
  }
  // A new process takes the rank (or, under shrink, a live worker's
  // process does) and resumes from the last step the shards have;
  // whatever it had asked the gate for, it asks again.
  gateWaiters_.erase(m.rank);
  // A checkpoint whose cut is taken (every shard has its copy) stands.
  if (ckpt_.active && (!ckpt_.snapshotting || ckpt_.snapshotsLeft > 0)) {
    abandonCheckpoint(job, fmt::format("worker {} was lost", m.rank));
  }
  outcome_.workers[size_t(m.rank)].restarts += 1;
  // Before training starts every process is still setting up: a new one
  // takes the rank.
  if (onWorkerLoss_ == WorkerLoss::kShrink && started_) {
    const int64_t host = adoptiveHost(job, m);
    if (host < 0) return actors::LossDecision::fail(what + "; no worker process is left to take its rank");
    log()->warn("{}: worker {}'s process takes its rank, and the job goes on with fewer processes "
                "(supervision.on_worker_loss = shrink)",
                what, host);
    return actors::LossDecision::adopt(host);
  }
  return actors::LossDecision::replace();
}

// ps mode, shrink: the process that takes a lost rank is one whose role
// runs (it has its roster; not the lost rank's own process, nor one going
// with it) that runs the fewest ranks, the lowest rank among those.
int64_t TrainingJob::adoptiveHost(actors::JobContext& job, const actors::Member& lost) const {
  const auto& members = job.members("worker");
  std::map<uint64_t, int64_t> ranksOn;  // by process (transport node)
  for (const auto& w : members) {
    if (w.live() || w.state == actors::MemberState::kFinished) ranksOn[w.node] += 1;
  }
  int64_t best = -1, fewest = std::numeric_limits<int64_t>::max();
  for (const auto& w : members) {
    if (w.rank == lost.rank || w.node == lost.node || !w.agent || !w.running) continue;
    if (w.state != actors::MemberState::kReady && w.state != actors::MemberState::kFinished) continue;
    if (ranksOn[w.node] < fewest) fewest = ranksOn[w.node], best = w.rank;
  }
  return best;
}

// Sync modes: once every live worker is ready (none is being replaced), the
// new group: its epoch and the node of each rank, to every worker.
void TrainingJob::tryRegroup(actors::JobContext& job) {
  if (regroupReady_.empty() || job.over()) return;
  std::vector<uint64_t> nodes;
  for (const auto& w : job.members("worker")) {
    if (onWorkerLoss_ == WorkerLoss::kShrink && w.state == actors::MemberState::kLost) continue;  // not replaced
    if (w.state != actors::MemberState::kReady || !regroupReady_.count(w.rank)) return;
    nodes.push_back(w.node);
  }
  if (nodes.empty()) return;
  // Groups formed again with no loss since the last: a rank slower than
  // the collectives' timeout makes the others give up again and again.
  // Hybrid shrink: the shards first undo what the lost ranks left half
  // done (their pushes may be at some shards and not others).
  if (!toRevert_.empty()) return revertShards(job);
  if (reverting_) return;
  if (++regroupsSinceLoss_ > 3) {
    // A member the others' transports found down while this coordinator
    // still hears it (a cut between them, or one that healed just before
    // the coordinator's own heartbeat timeout): it cannot be in a group with
    // them, so it is lost, unreachable (fenced and replaced as any loss).
    // The one most workers found down goes (a worker cut off from all the
    // others finds them all down, and each of them finds it); of equals,
    // the highest rank.
    std::map<int64_t, std::vector<int64_t>> votes;  // rank -> the workers that found it down
    for (const auto& [reporter, nodes] : regroupUnreachable_) {
      if (!regroupReady_.count(reporter)) continue;
      for (const auto& w : job.members("worker")) {
        if (w.rank != reporter && w.live() && std::find(nodes.begin(), nodes.end(), w.node) != nodes.end()) {
          votes[w.rank].push_back(reporter);
        }
      }
    }
    if (!votes.empty()) {
      auto most = votes.begin();
      for (auto it = votes.begin(); it != votes.end(); ++it) {
        if (it->second.size() >= most->second.size()) most = it;
      }
      const int64_t lost = most->first;
      log()->warn("worker {} found down by worker{} {}, and the group cannot form without it; it is lost", lost,
                  most->second.size() == 1 ? "" : "s", fmt::join(most->second, ", "));
      const std::string by = fmt::format("worker {} cannot reach it", fmt::join(most->second, ", "));
      regroupUnreachable_.clear();
      job.declareLost("worker", lost, caf::make_error(transport::Departure::kUnreachable, by));
      return;
    }
    return job.fail(fmt::format(
        "the workers' group formed again {} times without a lost worker: a rank is slower than the collectives' "
        "timeout (collectives.timeout_s, at most half of supervision.stall_timeout_s)",
        regroupsSinceLoss_ - 1));
  }
  ++regroupEpoch_;
  log()->info("every worker is ready: the group forms again (epoch {})", regroupEpoch_);
  const auto now = Clock::now();
  // The shards' step and generation go with every group formed until one
  // trains (a group that fails to form without a new loss forms again).
  const int64_t shardStep = revertedStep_;
  for (auto& [rank, who] : regroupReady_) {
    job.self()->send(who, Regroup{regroupEpoch_, nodes, shardStep, shardStep >= 0 ? generation_ : -1});
    lastProgress_[size_t(rank)] = now;  // forming the group is no stall (it has bounds of its own)
  }
  regroupReady_.clear();
  regroupUnreachable_.clear();
  regroupSteps_.clear();
  regroupDone_.clear();
  regroupSize_ = nodes.size();
  forming_ = true;
  ++outcome_.regroups;
}

// Hybrid shrink, once every survivor is ready: the step the group goes
// on from is the least of where the survivors are and of where every
// shard has the pushes of each rank, lost or not (a survivor's last push
// may still be on its way: it will be refused, and its step redone); the
// shards undo every step from there (at most their last, from the copy
// they kept), stop waiting for the lost ranks and move to a new generation
// (the old group's pushes still on their way are refused). Then the group
// forms, from that step at the latest.
void TrainingJob::revertShards(actors::JobContext& job) {
  if (reverting_) return;
  reverting_ = true;
  const std::vector<int64_t> lost(toRevert_.begin(), toRevert_.end());
  toRevert_.clear();
  int64_t least = std::numeric_limits<int64_t>::max();
  for (const auto& [rank, steps] : regroupSteps_) {
    if (steps >= 0) least = std::min(least, steps);
  }
  const auto& shards = job.members("ps");
  std::vector<int64_t> asked = lost;  // whose pushes the shards are asked about
  for (const auto& [rank, steps] : regroupSteps_) asked.push_back(rank);
  auto from = std::make_shared<int64_t>(least);
  auto left = std::make_shared<size_t>(shards.size() * asked.size());
  auto failed = std::make_shared<bool>(false);
  const int64_t generation = generation_ + 1;
  auto fail = [this, &job, failed, lost](const std::string& why) {
    if (*failed) return;
    *failed = true;
    reverting_ = false;
    // A shard lost meanwhile is a loss of its own: it ends a job that
    // shrank, unless its backup took over (ps.replicas = 2); then the undo
    // is done again, at the new primaries (a shard that did it already
    // does nothing more).
    for (const auto& s : job.members("ps")) {
      if (s.state == actors::MemberState::kReady) continue;
      if (replicas_ == 2) {
        toRevert_.insert(lost.begin(), lost.end());
        job.self()->delayed_send(job.self(), 1s, regroup_check_atom::value);
      }
      return;
    }
    job.fail(why);
  };
  auto undo = [this, &job, lost, from, generation, fail, failed] {
    auto& shards = job.members("ps");
    auto left = std::make_shared<size_t>(shards.size() * lost.size());
    log()->warn("the shards undo every step from {} (worker{} {} lost; the group goes on without {})", *from,
                lost.size() > 1 ? "s" : "", fmt::join(lost, ", "), lost.size() > 1 ? "them" : "it");
    for (const auto& s : shards) {
      for (int64_t w : lost) {
        const int64_t shard = s.rank;
        job.self()
            ->request(shardActor(job, s.rank), 30s, ps::revert_atom::value, w, *from, generation)
            .then(
                [this, &job, left, from, generation, failed](int64_t) {
                  if (*failed || --*left > 0) return;
                  generation_ = generation;
                  revertedStep_ = *from;
                  reverting_ = false;
                  tryRegroup(job);
                },
                [fail, shard](caf::error& err) {
                  fail(fmt::format("ps {} could not undo the lost worker's steps: {}", shard, actors::describe(err)));
                });
      }
    }
  };
  if (shards.empty() || lost.empty()) {
    reverting_ = false;
    return tryRegroup(job);
  }
  for (const auto& s : shards) {
    for (int64_t w : asked) {
      const int64_t shard = s.rank;
      job.self()
          ->request(shardActor(job, s.rank), 30s, ps::clock_atom::value, w)
          .then(
              [from, left, undo, failed](int64_t next) {
                *from = std::min(*from, next);
                if (!*failed && --*left == 0) undo();
              },
              [fail, shard](caf::error& err) {
                fail(fmt::format("ps {} did not say where the lost worker's pushes end: {}", shard,
                                 actors::describe(err)));
              });
    }
  }
}

actors::LossDecision TrainingJob::onEscalation(actors::JobContext& job, const actors::Member& m,
                                               const std::string& why) {
  (void)job;
  if (m.role == "worker") awaitingReplacement_.erase(m.rank);
  return actors::LossDecision::fail(why);
}

void TrainingJob::onReplaced(actors::JobContext& job, const actors::Member& m) {
  if (m.role == "ps" && rebuild_.erase(m.rank)) return rebuildCopies(job, m);
  if (m.role != "worker") return;
  awaitingReplacement_.erase(m.rank);
  rollbackUntrained_ = false;  // from now on it may train (it could not before)
  unheard_.insert(m.rank);  // its trainer may not be up yet: no checkpoint asks it to pause until it reports
  lastProgress_[size_t(m.rank)] = Clock::now();
  if (consistency_ != ps::Consistency::kAsp && !job.members("ps").empty()) {
    // The others waited for it (BSP, SSP): their stall clocks start now too.
    for (auto& t : lastProgress_) t = Clock::now();
  }
  for (const auto& w : job.members("worker")) {
    if (w.rank != m.rank && w.node == m.node && (w.live() || w.state == actors::MemberState::kFinished)) {
      log()->info("worker {} is back, in worker {}'s process; it resumes where the shards left it", m.rank, w.rank);
      return;
    }
  }
  log()->info("worker {} is back (process {} of its rank); it resumes where the shards left it", m.rank,
              m.incarnation + 1);
}

bool TrainingJob::othersExcused(actors::JobContext& job) const {
  for (const auto& s : job.members("ps")) {
    // (With replicas a lost shard's backup serves on: the workers train.)
    if (s.state != actors::MemberState::kReady && replicas_ != 2) return true;
  }
  return consistency_ != ps::Consistency::kAsp && !job.members("ps").empty() && !awaitingReplacement_.empty();
}

// A worker is hung when it is alive (its process answers heartbeats) but
// has reported no step for stall_timeout_s while it should be training. In
// ASP nobody waits for anyone, so a silent worker is hung itself; in BSP and
// SSP the others wait for the slowest and fall silent too, so the hung one
// is the silent worker the shards have the fewest steps of.
void TrainingJob::checkStalls(actors::JobContext& job) {
  if (checkingStalls_ || gateOpen_ || finishing_) return;
  const auto now = Clock::now();
  std::vector<int64_t> silent, training;
  std::map<int64_t, int64_t> incarnation;
  for (const auto& w : job.members("worker")) {
    // Only a rank that runs (not one whose new process or place is still
    // setting up: the replace timeout bounds that).
    if (w.state != actors::MemberState::kReady || !w.running || reported_[size_t(w.rank)] || gateWaiters_.count(w.rank) ||
        regroupReady_.count(w.rank)) {
      continue;
    }
    if (forming_ && !regroupDone_.count(w.rank)) continue;  // joining the group, copying the model
    // Paused for a checkpoint is not hung (the checkpoint has a timeout of its own).
    if (ckpt_.active && (ckpt_.waiting.count(w.rank) || ckpt_.paused.count(w.rank))) continue;
    training.push_back(w.rank);
    incarnation[w.rank] = w.incarnation;
    if (now - lastProgress_[size_t(w.rank)] > stallTimeout_) silent.push_back(w.rank);
  }
  if (othersExcused(job)) {
    // Their silence is the absent one's: their stall clocks start again
    // once it is back (else the first to be asked after a replacement
    // would be found hung for the time it spent waiting).
    for (int64_t w : training) lastProgress_[size_t(w)] = now;
    return;
  }
  if (silent.empty()) return;
  const auto& shards = job.members("ps");
  auto declare = [this, &job, incarnation](int64_t w, int64_t at) {
    // Still the same process, still silent, and not paused since the question was asked.
    bool same = false;
    for (const auto& m : job.members("worker")) {
      same = same || (m.rank == w && m.live() && m.incarnation == incarnation.at(w));
    }
    if (!same || Clock::now() - lastProgress_[size_t(w)] <= stallTimeout_) return;
    if (ckpt_.active && (ckpt_.waiting.count(w) || ckpt_.paused.count(w))) return;
    if (othersExcused(job)) return;  // one went while the shards were asked
    const double quiet = std::chrono::duration<double>(Clock::now() - lastProgress_[size_t(w)]).count();
    const std::string why = fmt::format("no step for {:.0f} s (supervision.stall_timeout_s = {}), at step {}", quiet,
                                        stallTimeout_.count(), at);
    log()->error("worker {}: {}; declared hung", w, why);
    job.declareLost("worker", w, caf::make_error(actors::Errc::kStalled, why));
  };
  // allreduce mode: the others wait in a collective for the hung one, give
  // up within half the stall timeout and are ready to regroup (not silent).
  if (consistency_ == ps::Consistency::kAsp || shards.empty()) {
    for (int64_t w : silent) declare(w, lastStep_[size_t(w)]);
    return;
  }
  // Which of the silent ones holds the others back: the shards say how far
  // each worker got (the lowest over the shards).
  checkingStalls_ = true;
  auto clocks = std::make_shared<std::map<int64_t, int64_t>>();
  auto left = std::make_shared<size_t>(shards.size() * training.size());
  for (const auto& s : shards) {
    for (int64_t w : training) {
      job.self()
          ->request(shardActor(job, s.rank), 10s, ps::clock_atom::value, w)
          .then(
              [=, this, &job](int64_t next) {
                auto [it, fresh] = clocks->emplace(w, next);
                if (!fresh) it->second = std::min(it->second, next);
                if (--*left > 0) return;
                checkingStalls_ = false;
                int64_t lowest = std::numeric_limits<int64_t>::max();
                for (const auto& [rank, c] : *clocks) lowest = std::min(lowest, c);
                for (int64_t v : silent) {
                  const auto c = clocks->find(v);
                  if (c != clocks->end() && c->second == lowest && !job.over()) declare(v, c->second);
                }
              },
              [=, this](caf::error&) {
                if (--*left == 0) checkingStalls_ = false;  // a lost shard is a loss of its own
              });
    }
  }
}

// ---------------------------------------------------------------- checkpoints

void TrainingJob::maybeCheckpoint(actors::JobContext& job) {
  if (ckpt_.active || checkpointBase_.empty() || !started_ || gateOpen_ || finishing_ || job.over()) return;
  if (Clock::now() < notBefore_) return;  // backing off after a checkpoint given up
  if (mode_ != TrainMode::kPs && (awaitingGroup_ || forming_ || !regroupReady_.empty())) {
    return;  // not while the group forms again
  }
  for (const auto& s : job.members("ps")) {
    if (s.state != actors::MemberState::kReady) return;  // not while a shard is being replaced
  }
  // Not before a rank's new process has reported progress: its trainer,
  // the actor a pause goes to, is published only once its role started.
  if (!unheard_.empty()) return;
  const auto& members = job.members("worker");
  int64_t slowest = std::numeric_limits<int64_t>::max();
  for (const auto& w : members) {
    if (mode_ != TrainMode::kPs && onWorkerLoss_ == WorkerLoss::kShrink && w.state == actors::MemberState::kLost) {
      continue;  // not replaced
    }
    // Not while a rank is lost or its new process is not running yet.
    if (w.state != actors::MemberState::kReady && w.state != actors::MemberState::kFinished) return;
    if (w.live() && !reported_[size_t(w.rank)] && !gateWaiters_.count(w.rank)) {
      slowest = std::min(slowest, lastStep_[size_t(w.rank)]);
    }
  }
  if (slowest == std::numeric_limits<int64_t>::max()) return;  // nobody trains any more
  const bool bySteps = checkpointEverySteps_ > 0 && slowest >= lastCheckpointStep_ + checkpointEverySteps_;
  const bool byTime = checkpointEverySeconds_.count() > 0 && Clock::now() - lastCheckpoint_ >= checkpointEverySeconds_;
  if (!bySteps && !byTime) return;
  ckpt_ = Checkpointing{};
  ckpt_.active = true;
  ckpt_.id = nextCheckpointId_++;
  ckpt_.dir = checkpointDir(checkpointBase_, ckpt_.id);
  ckpt_.started = Clock::now();
  std::error_code ec;
  std::filesystem::create_directories(ckpt_.dir, ec);
  if (ec) return abandonCheckpoint(job, fmt::format("cannot make {}: {}", ckpt_.dir, ec.message()));
  // The config beside it, as the manifest lists it.
  {
    const std::string path = ckpt_.dir + "/config.toml";
    std::ofstream out(path, std::ios::binary);
    out << configText_;
    out.close();
    if (!out) return abandonCheckpoint(job, "cannot write " + path);
    ckpt_.manifest.config = CheckpointFile{"config.toml", configText_.size(), xxh3(configText_.data(), configText_.size())};
  }
  for (const auto& w : members) {
    if (w.live()) ckpt_.waiting.insert(w.rank);
  }
  // Sync modes: every rank stops at the same step (a rank stopped early
  // would leave the others waiting in a collective).
  if (mode_ != TrainMode::kPs) return pauseWorkers(job, syncPauseStep());
  if (consistency_ == ps::Consistency::kAsp) return pauseWorkers(job, -1);
  // BSP and SSP: workers wait for each other (a BSP step's pushes are
  // acknowledged only once every worker's is in; an SSP pull waits for the
  // slowest), so every worker stops at the same boundary: some steps past
  // the furthest any shard has seen (a worker already past it says so; then
  // the checkpoint is tried again a little later, with more room).
  const auto& shards = job.members("ps");
  auto furthest = std::make_shared<int64_t>(0);
  auto left = std::make_shared<size_t>(shards.size() * size_t(workers_));
  const int64_t id = ckpt_.id;
  for (const auto& s : shards) {
    for (int64_t w = 0; w < workers_; ++w) {
      job.self()
          ->request(shardActor(job, s.rank), 30s, ps::clock_atom::value, w)
          .then(
              [this, &job, id, furthest, left](int64_t next) {
                *furthest = std::max(*furthest, next);
                if (--*left == 0 && ckpt_.active && ckpt_.id == id) {
                  pauseWorkers(job, *furthest + 3 + 8 * std::min<int64_t>(lateTries_, 16));
                }
              },
              [this, &job, id](caf::error& err) {
                if (ckpt_.active && ckpt_.id == id) {
                  abandonCheckpoint(job, "a shard did not say how far the workers are: " + actors::describe(err));
                }
              });
    }
  }
}

// Every worker stops at a step boundary (atStep, or its next: -1) with its
// pushes acknowledged.
void TrainingJob::pauseWorkers(actors::JobContext& job, int64_t atStep) {
  ckpt_.atStep = atStep;
  for (const auto& w : job.members("worker")) {
    if (ckpt_.waiting.count(w.rank)) job.self()->send(job.actorOf(w, trainerName(w.rank)), CheckpointPause{ckpt_.id, atStep});
  }
  log()->info("checkpoint {}: pausing the workers at {}", ckpt_.id,
              atStep < 0 ? std::string("their next step boundary") : fmt::format("step {}", atStep));
  job.self()->delayed_send(job.self(), pauseTimeout(), pause_timeout_atom::value, ckpt_.id);
}

std::chrono::seconds TrainingJob::pauseTimeout() const {
  if (mode_ != TrainMode::kPs) {
    // Within half the collectives' timeout: a rank that went past the step
    // waits in a collective for the paused ones, and must not give up on
    // them before they are let go.
    return std::max<std::chrono::seconds>(std::chrono::seconds(1), collectiveTimeout_ / 2);
  }
  return std::max<std::chrono::seconds>(std::chrono::seconds(5), std::min<std::chrono::seconds>(stallTimeout_ / 2, 60s));
}

int64_t TrainingJob::syncPauseStep() const {
  // Where the group is now (its last progress plus the steps since, at the
  // rate it reported), plus half a second of steps and some room; more after
  // each checkpoint given up because a rank was past the step already.
  const double batch = double(std::max<int64_t>(1, config_.getInt("train.batch_size")));
  const auto now = Clock::now();
  double furthest = 0, stepsPerSecond = 0;
  for (int64_t w = 0; w < workers_; ++w) {
    const double perSecond = rate_[size_t(w)] / batch;
    stepsPerSecond = std::max(stepsPerSecond, perSecond);
    const double since = std::chrono::duration<double>(now - lastProgress_[size_t(w)]).count();
    furthest = std::max(furthest, double(lastStep_[size_t(w)]) + perSecond * std::min(since, 10.0));
  }
  const double room = std::min(stepsPerSecond * 0.5, 10000.0) + 4 + 8 * double(std::min<int64_t>(lateTries_, 16));
  return int64_t(std::ceil(furthest + room));
}

void TrainingJob::takeCut(actors::JobContext& job) {
  ckpt_.snapshotting = true;
  const std::vector<actors::Member> shards = job.members("ps");
  const bool model = mode_ != TrainMode::kPs;
  ckpt_.snapshotsLeft = int64_t(shards.size()) + (model ? 1 : 0);
  ckpt_.writesLeft = ckpt_.snapshotsLeft;
  ckpt_.manifest.shards.assign(shards.size(), CheckpointFile{});
  ckpt_.manifest.samplesApplied.assign(shards.size(), 0);
  ckpt_.manifest.models.assign(model ? 1 : 0, CheckpointFile{});
  // Compression: every paused worker that still trains copies its codecs'
  // residuals and writes its own file.
  std::vector<int64_t> holdsResiduals;
  if (residuals_) {
    for (int64_t w : ckpt_.paused) {
      if (!ckpt_.over.count(w)) holdsResiduals.push_back(w);
    }
    ckpt_.manifest.residuals.assign(size_t(workers_), CheckpointFile{});
  }
  ckpt_.snapshotsLeft += int64_t(holdsResiduals.size());
  ckpt_.writesLeft += int64_t(holdsResiduals.size());
  const int64_t id = ckpt_.id;
  // The cut of every worker: each shard's, and the model's (all alike).
  auto agreeOnCut = [this, &job](const std::vector<int64_t>& steps, const std::string& who) {
    if (ckpt_.manifest.workerSteps.empty()) {
      ckpt_.manifest.workerSteps = steps;
      return true;
    }
    if (ckpt_.manifest.workerSteps == steps) return true;
    abandonCheckpoint(job, fmt::format("{} cut the workers at steps {}, another at {}", who, fmt::join(steps, "/"),
                                       fmt::join(ckpt_.manifest.workerSteps, "/")));
    return false;
  };
  for (const auto& s : shards) {
    const int64_t rank = s.rank;
    const std::string path = fmt::format("{}/shard-{}.ckpt", ckpt_.dir, rank);
    job.self()
        ->request(shardActor(job, s.rank), 60s, ps::snapshot_atom::value, id, path)
        .then(
            [this, &job, id, rank, agreeOnCut](int64_t, std::vector<int64_t>& floors, int64_t samples) {
              if (!ckpt_.active || ckpt_.id != id) return;
              if (!agreeOnCut(floors, fmt::format("shard {}", rank))) return;
              ckpt_.manifest.samplesApplied[size_t(rank)] = samples;
              cutTaken(job);
            },
            [this, &job, id, rank](caf::error& err) {
              if (ckpt_.active && ckpt_.id == id) {
                abandonCheckpoint(job, fmt::format("shard {} did not copy its state: {}", rank, actors::describe(err)));
              }
            });
  }
  for (int64_t rank : holdsResiduals) {
    const actors::Member* member = nullptr;
    for (const auto& w : job.members("worker")) {
      if (w.rank == rank && w.live()) member = &w;
    }
    if (!member) return abandonCheckpoint(job, fmt::format("worker {} went before it copied its residuals", rank));
    job.self()
        ->request(job.actorOf(*member, trainerName(rank)), 60s,
                  ResidualSnapshot{id, fmt::format("{}/{}", ckpt_.dir, residualFileName(rank))})
        .then(
            [this, &job, id, rank](int64_t step) {
              if (!ckpt_.active || ckpt_.id != id) return;
              ckpt_.residualSteps[rank] = step;
              if (step != ckpt_.pausedAt[rank]) {
                return abandonCheckpoint(job, fmt::format("worker {} copied its residuals at step {}, not {}", rank,
                                                          step, ckpt_.pausedAt[rank]));
              }
              cutTaken(job);
            },
            [this, &job, id, rank](caf::error& err) {
              if (ckpt_.active && ckpt_.id == id) {
                abandonCheckpoint(job, fmt::format("worker {} did not copy its residuals: {}", rank,
                                                   actors::describe(err)));
              }
            });
  }
  if (!model) return;
  // Sync modes: every rank paused at one step holds the same model; the
  // lowest live one copies it.
  std::set<int64_t> steps;
  for (const auto& [rank, step] : ckpt_.pausedAt) steps.insert(step);
  if (steps.size() != 1) {
    return abandonCheckpoint(job, fmt::format("the workers paused at different steps ({})", fmt::join(steps, ", ")));
  }
  const int64_t step = *steps.begin();
  const actors::Member* source = nullptr;
  for (const auto& w : job.members("worker")) {
    if (w.live() && !source) source = &w;
  }
  if (!source) return abandonCheckpoint(job, "no live worker holds the model");
  const int64_t rank = source->rank;
  job.self()
      ->request(job.actorOf(*source, trainerName(source->rank)), 60s, ModelSnapshot{id, ckpt_.dir + "/" + kModelImageFile, workers_})
      .then(
          [this, &job, id, step, agreeOnCut](const ModelCut& cut) {
            if (!ckpt_.active || ckpt_.id != id) return;
            if (cut.step != step) {
              return abandonCheckpoint(job, fmt::format("worker {} copied the model of step {}, not {}", cut.rank,
                                                        cut.step, step));
            }
            if (!agreeOnCut(std::vector<int64_t>(size_t(workers_), cut.step), fmt::format("worker {}", cut.rank))) {
              return;
            }
            ckpt_.manifest.cutEpoch = cut.epoch;
            ckpt_.manifest.cutBatch = cut.epochBatch;
            ckpt_.manifest.divisions = divisions_;  // how the data was divided up to the cut
            cutTaken(job);
          },
          [this, &job, id, rank](caf::error& err) {
            if (ckpt_.active && ckpt_.id == id) {
              abandonCheckpoint(job, fmt::format("worker {} did not copy the model: {}", rank, actors::describe(err)));
            }
          });
}

void TrainingJob::cutTaken(actors::JobContext& job) {
  if (--ckpt_.snapshotsLeft > 0) return;
  const int64_t id = ckpt_.id;
  // Every copy is taken: the workers train on.
  for (int64_t w : ckpt_.paused) {
    for (const auto& m : job.members("worker")) {
      if (m.rank == w && m.live()) job.self()->send(job.actorOf(m, trainerName(m.rank)), CheckpointResume{id});
    }
  }
  ckpt_.paused.clear();
  ckpt_.resumed = Clock::now();
  lastProgress_.assign(size_t(workers_), ckpt_.resumed);  // a pause is no stall
  lateTries_ = 0;
  // The files are written beside training, within a bound.
  job.self()->delayed_send(job.self(), std::max<std::chrono::seconds>(stallTimeout_, 60s), write_timeout_atom::value,
                           id);
  if (ckpt_.writesLeft == 0) checkpointWritten(job);  // the files were quicker
}

void TrainingJob::checkpointWritten(actors::JobContext& job) {
  auto& m = ckpt_.manifest;
  // Each worker's residuals are of the step the cut resumes it at.
  for (const auto& [rank, step] : ckpt_.residualSteps) {
    if (size_t(rank) < m.workerSteps.size() && m.workerSteps[size_t(rank)] != step) {
      return abandonCheckpoint(job, fmt::format("worker {}'s residuals are of step {}, the cut resumes it at {}", rank,
                                                step, m.workerSteps[size_t(rank)]));
    }
  }
  m.id = ckpt_.id;
  m.shape = shape_;
  const std::time_t now = std::time(nullptr);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  m.created = stamp;
  Status s = writeManifest(ckpt_.dir, m);
  if (!s.isOk()) return abandonCheckpoint(job, s.message());
  latestCheckpoint_ = ckpt_.dir;
  latestCheckpointId_ = ckpt_.id;
  latestCut_ = m.workerSteps;
  CheckpointRecord r;
  r.id = ckpt_.id;
  r.dir = ckpt_.dir;
  r.step = *std::min_element(m.workerSteps.begin(), m.workerSteps.end());
  r.pausedSeconds = std::chrono::duration<double>(ckpt_.resumed - ckpt_.firstPaused.value_or(ckpt_.started)).count();
  r.writtenSeconds = std::chrono::duration<double>(Clock::now() - ckpt_.firstPaused.value_or(ckpt_.started)).count();
  for (const auto& f : m.shards) r.bytes += f.bytes;
  for (const auto& f : m.models) r.bytes += f.bytes;
  for (const auto& f : m.residuals) r.bytes += f.bytes;
  outcome_.checkpoints.push_back(r);
  lastCheckpointStep_ = r.step;
  lastCheckpoint_ = Clock::now();
  log()->info("checkpoint {} written: {} (steps {}, {:.1f} MB; workers paused {:.3f} s, written in {:.2f} s)", r.id,
              r.dir, fmt::join(m.workerSteps, "/"), double(r.bytes) / 1e6, r.pausedSeconds, r.writtenSeconds);
  pruneCheckpoints(checkpointBase_, checkpointKeep_);
  ckpt_.active = false;
  faults_->checkpointWritten(job, int64_t(outcome_.checkpoints.size()));
}

void TrainingJob::abandonCheckpoint(actors::JobContext& job, const std::string& why) {
  if (!ckpt_.active) return;
  log()->warn("checkpoint {} abandoned: {}; training goes on", ckpt_.id, why);
  // Paused ones train on; those asked but not yet paused are let off (a
  // resume cancels a pause still to come).
  for (const auto& m : job.members("worker")) {
    if (m.live() && (ckpt_.paused.count(m.rank) || ckpt_.waiting.count(m.rank))) {
      job.self()->send(job.actorOf(m, trainerName(m.rank)), CheckpointResume{ckpt_.id});
    }
  }
  lastProgress_.assign(size_t(workers_), Clock::now());
  notBefore_ = Clock::now() + std::chrono::seconds(1);
  std::error_code ec;
  std::filesystem::remove_all(ckpt_.dir, ec);
  ckpt_.active = false;
  lastCheckpoint_ = Clock::now();  // not again at once
}

void TrainingJob::rollBack(actors::JobContext& job, int64_t lostShard, const std::string& why) {
  if (ckpt_.active) abandonCheckpoint(job, why);
  // With replicas a shard's copies are in two processes, and its primary
  // may have moved: a rollback waits for no rebuild (it fails instead).
  if (replicas_ == 2) {
    bool whole = rebuild_.empty();
    for (const auto& s : job.members("ps")) whole = whole && s.live();
    for (bool synced : backupSynced_) whole = whole && synced;
    if (!whole) {
      return job.fail(fmt::format("{}; the job would roll back to its checkpoint, but a parameter server's copies are "
                                  "being built again",
                                  why));
    }
  }
  gateOpen_ = false;  // the workers train again from the cut
  evaluator_ = -1;
  standby_.clear();  // their processes stop: nobody waits for these answers
  generation_ += 1;
  JobOutcome::Rollback r;
  r.checkpoint = latestCheckpointId_;
  r.dir = latestCheckpoint_;
  r.atSeconds = job.elapsed();
  // A shard lost after a rollback for the workers, before they trained
  // again, to the same checkpoint, begins that rollback again (a new
  // generation, every shard restored and every worker restarted once more)
  // but is not another: under load the workers' failed pushes to a killed
  // shard reach the coordinator before the shard's own loss, and one fault
  // would count as two rollbacks, the second redoing no step.
  const bool again = rollbackUntrained_ && lastRollbackShard_ < 0 && lostShard >= 0 &&
                     !outcome_.rollbacks.empty() && outcome_.rollbacks.back().checkpoint == r.checkpoint &&
                     outcome_.rollbacks.back().dir == r.dir;
  if (!again) outcome_.rollbacks.push_back(r);
  rollbackUntrained_ = true;
  lastRollbackShard_ = lostShard;
  const char* const againSaid =
      again ? " (again: no step was trained since the last rollback to it, which this one begins anew)" : "";
  if (servers_ == 0) {
    // No shards to say how far the workers got: their last reports do.
    latestCut_.resize(size_t(workers_), 0);
    if (latestCheckpoint_.empty()) latestCut_.assign(size_t(workers_), 0);
    for (int64_t w = 0; w < workers_; ++w) {
      outcome_.rollbacks.back().stepsRedone += std::max<int64_t>(0, lastStep_[size_t(w)] - latestCut_[size_t(w)]);
    }
  }
  if (latestCheckpoint_.empty()) {
    // No checkpoint yet (allreduce: no shards): every rank from step 0.
    log()->warn("{}: the job starts again from step 0 (it has no checkpoint yet; generation {}){}", why, generation_,
                againSaid);
  } else {
    log()->warn("{}: the job rolls back to checkpoint {} ({}; generation {}), its workers to steps {}{}", why,
                r.checkpoint, r.dir, generation_, fmt::join(latestCut_, "/"), againSaid);
  }
  Expected<CheckpointManifest> manifest = CheckpointManifest{};
  if (!latestCheckpoint_.empty()) manifest = readManifest(latestCheckpoint_);
  if (!manifest.hasValue()) {
    return job.fail(fmt::format("{} and its checkpoint cannot be read: {}", why, manifest.status().message()));
  }
  // The other shards go back to the cut; what waits on their old state is
  // told. First they say how far each worker had got: the steps done again.
  const std::vector<actors::Member> shardsNow = job.members("ps");
  const size_t index = outcome_.rollbacks.size() - 1;
  for (const auto& s : shardsNow) {
    // (Replicas: s.rank names the shard, shardActor its primary copy,
    // wherever it serves; every ps process is live, checked above.)
    if (!s.live() || s.rank == lostShard) continue;
    for (int64_t w = 0; w < workers_ && size_t(w) < latestCut_.size(); ++w) {
      const int64_t cut = latestCut_[size_t(w)];
      job.self()
          ->request(shardActor(job, s.rank), 30s, ps::clock_atom::value, w)
          .then(
              [this, index, w, cut](int64_t reached) {
                auto& seen = rolledBackTo_[{index, w}];
                const int64_t before = std::max<int64_t>(0, seen - cut);
                seen = std::max(seen, reached);
                outcome_.rollbacks[index].stepsRedone += std::max<int64_t>(0, seen - cut) - before;
              },
              [](caf::error&) {});
    }
    const std::string path = latestCheckpoint_ + "/" + manifest->shards[size_t(s.rank)].file;
    const int64_t rank = s.rank;
    job.self()
        ->request(shardActor(job, s.rank), 120s, ps::restore_atom::value, path, generation_)
        .then([](int64_t) {},
              [&job, rank, node = s.node](caf::error& err) {
                // A shard lost meanwhile is a loss of its own (another
                // rollback), whether the coordinator has heard of it yet
                // (its process's departure reaches the request first) or not.
                if (err == caf::sec::request_receiver_down) return;
                for (const auto& now : job.members("ps")) {
                  if (now.rank == rank && (!now.live() || now.node != node)) return;
                }
                job.fail(fmt::format("ps {} could not roll back: {}", rank, actors::describe(err)));
              });
  }
  // Every worker starts again from its cut, as a new process (hybrid: with
  // the checkpoint's model, in a group formed anew by all of them).
  gateWaiters_.clear();
  // Where the workers are now: the cut (what they said before is of the old processes).
  for (int64_t w = 0; w < workers_ && size_t(w) < latestCut_.size(); ++w) lastStep_[size_t(w)] = latestCut_[size_t(w)];
  lastProgress_.assign(size_t(workers_), Clock::now());
  if (mode_ != TrainMode::kPs) {
    regroupReady_.clear();
  regroupUnreachable_.clear();
    regroupSteps_.clear();
    toRevert_.clear();
    revertedStep_ = -1;
    regroupDone_.clear();
    forming_ = false;
    awaitingGroup_ = false;
    ++regroupEpoch_;  // what the old processes still say of a group is of an older one
    regroupsSinceLoss_ = 0;
    for (int64_t w = 0; w < workers_; ++w) holdsModel_.insert(w);
  }
  const std::vector<actors::Member> workersNow = job.members("worker");  // a copy: the losses below change them
  for (const auto& w : workersNow) {
    if (mode_ != TrainMode::kPs) fromCheckpoint_[w.rank] = w.incarnation + 1;
    if (!w.live()) continue;
    job.declareLost("worker", w.rank,
                    caf::make_error(actors::Errc::kRolledBack,
                                    latestCheckpoint_.empty() ? fmt::format("{}; back to step 0", why)
                                                              : fmt::format("{}; back to checkpoint {}", why, r.checkpoint)));
  }
}

caf::actor TrainingJob::shardActor(actors::JobContext& job, int64_t shard) {
  const auto& shards = job.members("ps");
  if (replicas_ == 1) return job.actorOf(shards[size_t(shard)], kShardName);
  return job.actorOf(shards[size_t(primaryHost_[size_t(shard)])], ps::shardCopyName(shard));
}

std::vector<int64_t> TrainingJob::primaryNodes(actors::JobContext& job) const {
  std::vector<int64_t> nodes;
  const auto& shards = job.members("ps");
  for (int64_t k = 0; k < servers_; ++k) nodes.push_back(int64_t(shards[size_t(primaryHost_[size_t(k)])].node));
  return nodes;
}

void TrainingJob::sendRoutes(actors::JobContext& job) {
  const std::vector<int64_t> nodes = primaryNodes(job);
  for (const auto& w : job.members("worker")) {
    if (w.live()) job.self()->send(job.actorOf(w, psClientName(w.rank)), ps::route_atom::value, nodes);
  }
}

// ps.replicas = 2: copies of shard k live in ps processes k and k+1 (mod S).
// A lost process's primaries are served by their backups from now on (no
// rollback: every push acknowledged is in the backup), its backups' primaries
// serve alone, and its replacement builds both its copies anew.
actors::LossDecision TrainingJob::replicaLoss(actors::JobContext& job, const actors::Member& m,
                                              const std::string& what) {
  const int64_t p = m.rank;
  const auto& shards = job.members("ps");
  if (!started_) {
    // Nothing has trained: the copies a new process starts with are the
    // same as the others' (fresh, or the checkpoint's), and its primary
    // takes its backup as the first ones do once every process is there.
    log()->warn("{}: a new process takes its place before training starts", what);
    return actors::LossDecision::replace();
  }
  std::vector<std::pair<int64_t, int64_t>> promote;  // (shard, new host)
  for (int64_t k = 0; k < servers_; ++k) {
    const int64_t a = k, b = (k + 1) % servers_;
    if (a != p && b != p) continue;
    const int64_t other = a == p ? b : a;
    if (primaryHost_[size_t(k)] != p) {
      if (backupSynced_[size_t(k)]) {
        log()->warn("{}: it held shard {}'s backup; the primary (ps {}) serves alone until a new one is built", what,
                    k, other);
      }
      backupSynced_[size_t(k)] = false;
      job.self()->request(shardActor(job, k), 30s, ps::detach_atom::value).then([](int64_t) {}, [](caf::error&) {});
      continue;
    }
    if (!backupSynced_[size_t(k)] || !shards[size_t(other)].live()) {
      return actors::LossDecision::fail(fmt::format(
          "{}; it held shard {}'s primary, and the shard's other copy (ps {}) is {}: no copy of shard {} is left "
          "(ps.replicas = 2 survives one lost copy at a time; resume from a checkpoint: troupe train --resume)",
          what, k, other, shards[size_t(other)].live() ? "still being built" : "lost too", k));
    }
    promote.emplace_back(k, other);
  }
  if (ckpt_.active) abandonCheckpoint(job, fmt::format("ps {} was lost", p));
  for (auto [k, to] : promote) {
    primaryHost_[size_t(k)] = to;
    backupSynced_[size_t(k)] = false;
    promotedAt_[outcome_.promotions.size()] = lastStep_;
    outcome_.promotions.push_back(JobOutcome::Promotion{k, p, to, job.elapsed()});
    log()->warn("{}: shard {}'s backup on ps {} is its primary now; the workers send there (nothing to roll back)",
                what, k, to);
    const int64_t shard = k;
    job.self()
        ->request(shardActor(job, k), 30s, ps::promote_atom::value)
        .then([](int64_t) {},
              [shard](caf::error& err) {
                log()->warn("shard {}: its new primary did not answer the promotion: {}", shard, actors::describe(err));
              });
  }
  if (!promote.empty()) sendRoutes(job);
  rebuild_.insert(p);
  return actors::LossDecision::replace();
}

void TrainingJob::rebuildCopies(actors::JobContext& job, const actors::Member& m) {
  const int64_t p = m.rank;
  for (int64_t k : {p, (p + servers_ - 1) % servers_}) rebuildCopy(job, k, p, m.node, 1, -1);
}

// Shard k's primary sends its state to its copy in ps process `backup`
// (node `node`), which becomes its backup; tried again (every 2 s, 5 times
// in all) while that process is the same.
void TrainingJob::rebuildCopy(actors::JobContext& job, int64_t k, int64_t backup, uint64_t node, int attempt,
                              int64_t token) {
  // One rebuild of a shard at a time: a newer one (another loss, another
  // backup_lost) makes the tries of an older one stale.
  if (token < 0) token = ++rebuildToken_[size_t(k)];
  if (token != rebuildToken_[size_t(k)]) return;
  const int64_t primary = primaryHost_[size_t(k)];
  if (primary == backup || job.over()) return;
  const auto& shards = job.members("ps");
  if (!shards[size_t(backup)].live() || shards[size_t(backup)].node != node) return;  // things moved on
  const double asked = job.elapsed();
  log()->info("shard {}: its primary (ps {}) sends its state to ps {}'s process, the new backup", k, primary, backup);
  job.self()
      ->request(shardActor(job, k), pullWaitBound(config_) + 120s, ps::replicate_atom::value, int64_t(node),
                ps::shardCopyName(k), true)
      .then(
          [this, &job, k, primary, backup, asked, node, token](int64_t) {
            const auto& shards = job.members("ps");
            if (token != rebuildToken_[size_t(k)] || primaryHost_[size_t(k)] != primary ||
                !shards[size_t(backup)].live() || shards[size_t(backup)].node != node) {
              return;  // things moved on meanwhile
            }
            backupSynced_[size_t(k)] = true;
            const double now = job.elapsed();
            outcome_.replicasBuilt.push_back(JobOutcome::ReplicaBuilt{k, primary, backup, now, now - asked});
            log()->info("shard {} has two copies again (primary on ps {}, backup on ps {}; the state moved in "
                        "{:.2f} s)",
                        k, primary, backup, now - asked);
          },
          [this, &job, k, backup, node, attempt, token](caf::error& err) {
            if (token != rebuildToken_[size_t(k)]) return;
            backupSynced_[size_t(k)] = false;
            log()->warn("shard {}: its new backup on ps {} could not be built (try {} of 5): {}", k, backup, attempt,
                        actors::describe(err));
            if (attempt >= 5) return;
            job.self()->delayed_send(job.self(), 2s, rebuild_atom::value, k, backup, int64_t(node),
                                     int64_t(attempt + 1), token);
          });
}

std::string TrainingJob::configFor(actors::JobContext&, const actors::Member& m, const std::string& base) {
  // The first process of every rank: the job's config (a resumed job's
  // names its checkpoint).
  if (m.incarnation == 0) return base;
  if (m.role == "ps" && rebuild_.count(m.rank)) {
    Config c = config_;
    c.setValue("cluster.generation", generation_);
    c.setValue("cluster.ps_rebuild", true);
    return c.toToml();
  }
  const bool rolledBack = generation_ != config_.getInt("cluster.generation");
  const bool syncWorker = mode_ != TrainMode::kPs && m.role == "worker";
  if (!rolledBack && !syncWorker) return base;
  // After a rollback: the new generation, and a new shard goes on from the
  // checkpoint. A sync-mode worker goes on from the checkpoint's model when
  // it is the first process of its rank after a rollback; any other
  // replacement copies the model from its group.
  Config c = config_;
  c.setValue("cluster.generation", generation_);
  if (m.role == "ps") c.setValue("checkpoint.resume", latestCheckpoint_);
  if (syncWorker) {
    auto it = fromCheckpoint_.find(m.rank);
    const bool fromCheckpoint = it != fromCheckpoint_.end() && it->second == m.incarnation;
    c.setValue("checkpoint.resume", fromCheckpoint ? latestCheckpoint_ : std::string());
    // The group's backend was chosen once (CommOffer): the same again.
    if (!outcome_.collectivesBackend.empty()) c.setValue("collectives.backend", outcome_.collectivesBackend);
    // (Rolled back to the start: no checkpoint, every rank from step 0.)
    c.setValue("cluster.fresh_start", fromCheckpoint && latestCheckpoint_.empty());
  }
  return c.toToml();
}

// A worker asked to pause that trains no more (at the gate, or done) is as
// good as paused: its pushes are all acknowledged.
void TrainingJob::trainsNoMore(actors::JobContext& job, int64_t rank) {
  if (!ckpt_.active || !ckpt_.waiting.erase(rank)) return;
  if (mode_ != TrainMode::kPs) {
    // Every rank of a sync group ends training at the same step: before the
    // one to stop at, so there is no cut to take.
    return abandonCheckpoint(job, fmt::format("worker {} finished training before the step to stop at", rank));
  }
  if (ckpt_.waiting.empty() && !ckpt_.snapshotting) takeCut(job);
}

void TrainingJob::onOver(actors::JobContext&) {
  for (auto& [rank, w] : gateWaiters_) w.deliver(GateDecision{false});
  gateWaiters_.clear();
  for (auto& [rank, w] : standby_) w.deliver(GateDecision{false});
  standby_.clear();
  for (auto& [rank, w] : commWaiters_) w.deliver(caf::make_error(actors::Errc::kJobFailed, "the job is over"));
  commWaiters_.clear();
}

caf::message_handler TrainingJob::handlers(actors::JobContext& job) {
  caf::message_handler own{
      [this, &job](ps::routes_atom) -> caf::result<std::vector<int64_t>> {
        if (replicas_ != 2) return caf::make_error(caf::sec::invalid_argument, "the job's shards have no replicas");
        return primaryNodes(job);
      },
      [this, &job](ps::backup_lost_atom, int64_t shard, const std::string& why) {
        if (replicas_ != 2 || shard < 0 || shard >= servers_) return;
        const int64_t primary = primaryHost_[size_t(shard)];
        const auto& shards = job.members("ps");
        const auto& sender = job.self()->current_sender();
        const auto& host = shards[size_t(primary)];
        if (!sender || !host.agent || sender->node() != host.agent.node()) return;  // only the primary's process says so
        log()->warn("shard {}: its primary (ps {}) lost its backup ({}); it serves alone until it is built again",
                    shard, primary, why);
        backupSynced_[size_t(shard)] = false;
        // The backup's process may be fine (the copies disagreed, or it was
        // slow): it gets the state again. One that is lost is replaced.
        const int64_t backup = primary == shard ? (shard + 1) % servers_ : shard;
        if (shards[size_t(backup)].live()) rebuildCopy(job, shard, backup, shards[size_t(backup)].node, 1, -1);
      },
      [this, &job](rebuild_atom, int64_t shard, int64_t backup, int64_t node, int64_t attempt, int64_t token) {
        if (shard < 0 || shard >= servers_ || backup < 0 || backup >= servers_ || token < 0) return;
        rebuildCopy(job, shard, backup, uint64_t(node), int(attempt), token);
      },
      [this, &job](const CheckpointPaused& p) {
        const auto pauser = caf::actor_cast<caf::actor>(job.self()->current_sender());
        if (!ckpt_.active || p.id != ckpt_.id) {
          // Late, for a checkpoint given up: it must not stay paused.
          if (!p.late) job.self()->send(pauser, CheckpointResume{p.id});
          return;
        }
        if (p.late) {
          ++lateTries_;
          return abandonCheckpoint(job, fmt::format("worker {} was past the step to stop at already (at {})", p.rank,
                                                    p.step));
        }
        if (mode_ != TrainMode::kPs && ckpt_.waiting.count(p.rank) && (p.over || p.step != ckpt_.atStep)) {
          // A sync group stops at one step; a rank elsewhere finished training before it.
          return abandonCheckpoint(job, fmt::format("worker {} finished training at step {}, before the step to "
                                                    "stop at ({})",
                                                    p.rank, p.step, ckpt_.atStep));
        }
        if (!ckpt_.waiting.erase(p.rank)) return;
        ckpt_.paused.insert(p.rank);
        if (p.over) ckpt_.over.insert(p.rank);
        ckpt_.pausedAt[p.rank] = p.step;
        if (!ckpt_.firstPaused) ckpt_.firstPaused = Clock::now();
        if (ckpt_.waiting.empty() && !ckpt_.snapshotting) takeCut(job);
      },
      [this, &job](write_timeout_atom, int64_t id) {
        if (ckpt_.active && ckpt_.id == id && ckpt_.writesLeft > 0) {
          abandonCheckpoint(job, fmt::format("{} checkpoint files were not written in time", ckpt_.writesLeft));
        }
      },
      [this, &job](pause_timeout_atom, int64_t id) {
        if (ckpt_.active && ckpt_.id == id && !ckpt_.waiting.empty()) {
          abandonCheckpoint(job, fmt::format("workers {} did not pause within {} s", fmt::join(ckpt_.waiting, ", "),
                                             pauseTimeout().count()));
        }
      },
      [this, &job](ps::written_atom, int64_t id, int64_t shard, const std::string& path, uint64_t bytes,
                   uint64_t checksum, const std::string& error) {
        if (!ckpt_.active || ckpt_.id != id || shard < 0 || shard >= int64_t(ckpt_.manifest.shards.size())) return;
        if (!error.empty()) return abandonCheckpoint(job, fmt::format("shard {}: {}", shard, error));
        ckpt_.manifest.shards[size_t(shard)] =
            CheckpointFile{std::filesystem::path(path).filename().string(), bytes, checksum};
        if (--ckpt_.writesLeft == 0 && ckpt_.snapshotsLeft == 0) checkpointWritten(job);
      },
      [this, &job](const ResidualWritten& w) {
        if (!ckpt_.active || ckpt_.id != w.id || w.rank < 0 || size_t(w.rank) >= ckpt_.manifest.residuals.size()) return;
        if (!ckpt_.manifest.residuals[size_t(w.rank)].file.empty()) return;  // said twice
        if (!w.error.empty()) return abandonCheckpoint(job, fmt::format("worker {}: {}", w.rank, w.error));
        ckpt_.manifest.residuals[size_t(w.rank)] =
            CheckpointFile{std::filesystem::path(w.path).filename().string(), w.bytes, w.checksum};
        if (--ckpt_.writesLeft == 0 && ckpt_.snapshotsLeft == 0) checkpointWritten(job);
      },
      [this, &job](const ModelWritten& w) {
        if (!ckpt_.active || ckpt_.id != w.id || ckpt_.manifest.models.size() != 1) return;
        if (!w.error.empty()) return abandonCheckpoint(job, fmt::format("worker {}: {}", w.rank, w.error));
        ckpt_.manifest.models[0] = CheckpointFile{std::filesystem::path(w.path).filename().string(), w.bytes, w.checksum};
        if (--ckpt_.writesLeft == 0 && ckpt_.snapshotsLeft == 0) checkpointWritten(job);
      },
      [this, &job](const RegroupReady& r) {
        if (r.rank < 0 || r.rank >= workers_ || mode_ == TrainMode::kPs) return;
        bool current = false;
        for (const auto& w : job.members("worker")) {
          current = current || (w.rank == r.rank && w.live() && w.incarnation == r.incarnation);
        }
        if (!current) return;
        log()->info("worker {} is ready for the group to form again ({})", r.rank,
                    r.steps < 0 ? std::string("a replacement") : fmt::format("{} steps taken", r.steps));
        regroupReady_[r.rank] = caf::actor_cast<caf::actor>(job.self()->current_sender());
        regroupSteps_[r.rank] = r.steps;
        regroupUnreachable_[r.rank] = r.unreachable;
        lastProgress_[size_t(r.rank)] = Clock::now();
        tryRegroup(job);
      },
      [this, &job](const RegroupDone& d) {
        if (d.epoch != regroupEpoch_ || d.rank < 0 || d.rank >= workers_ || !regroupDone_.insert(d.rank).second) return;
        if (regroupDone_.size() == 1) divisions_.push_back(DataDivision{d.dataEpoch, d.fromBatch, d.parts});
        holdsModel_.insert(d.rank);
        lastProgress_[size_t(d.rank)] = Clock::now();
        if (regroupDone_.size() < regroupSize_) return;
        forming_ = false;
        rollbackUntrained_ = false;  // it trains now
        revertedStep_ = -1;  // the group trains: the shards' undo is behind it
        awaitingGroup_ = false;
        regroupedAt_.push_back(job.elapsed());
        log()->info("the group of epoch {} trains again from step {}", d.epoch, d.step);
      },
      [this, &job](regroup_check_atom) { tryRegroup(job); },
      [this, &job](recheck_atom) {
        checkGate(job);
        checkDone(job);
      },
      [this, &job](live_atom) {
        if (job.over()) return;
        pollLive(job);
        job.self()->delayed_send(job.self(), liveEvery_, live_atom::value);
      },
      [this, &job](stall_atom) {
        if (job.over()) return;
        checkStalls(job);
        maybeCheckpoint(job);
        job.self()->delayed_send(job.self(), 1s, stall_atom::value);
      },
      [this, &job](const Progress& p) {
        if (p.rank < 0 || p.rank >= workers_) return;
        rate_[size_t(p.rank)] = p.samplesPerSec;
        progressSamples_[size_t(p.rank)] = p.rowsPerEpoch * p.epoch + p.epochRows;
        lastProgress_[size_t(p.rank)] = Clock::now();
        lastStep_[size_t(p.rank)] = p.step;
        if (size_t(p.rank) >= latestCut_.size() || p.step > latestCut_[size_t(p.rank)]) rollbackUntrained_ = false;
        unheard_.erase(p.rank);
        for (auto it = promotedAt_.begin(); it != promotedAt_.end();) {
          if (p.step >= it->second[size_t(p.rank)] + progressEvery_) {
            outcome_.promotions[it->first].trainingAtSeconds = job.elapsed();
            it = promotedAt_.erase(it);
          } else {
            ++it;
          }
        }
        maybeCheckpoint(job);
        if (!onProgress_ || !countsTraining(p.rank, false)) return;  // (a pipeline's loss is its last stages')
        JobProgress out{p.rank, p.step, p.epoch, p.epochRows, p.rowsPerEpoch, p.loss, 0, p.wireRatio, p.mailbox};
        const auto& members = job.members("worker");
        for (size_t w = 0; w < members.size() && w < rate_.size(); ++w) {
          if (members[w].live() && !reported_[w] && countsTraining(int64_t(w), false)) out.samplesPerSec += rate_[w];
        }
        onProgress_(out);
      },
      [this, &job](const EvalPoint& p) {
        if (!onEval_ || job.over() || p.rank < 0 || p.rank >= workers_) return;
        EvalPoint q = p;
        if (mode_ == TrainMode::kPs) {
          // The snapshot has its worker's samples; the others' as of their
          // last progress report (a sync mode's count every rank's).
          for (int64_t w = 0; w < workers_; ++w) {
            if (w != p.rank) q.samples += progressSamples_[size_t(w)];
          }
        }
        onEval_(q, job.elapsed());
      },
      [this, &job](const GateRequest& g) -> caf::typed_response_promise<GateDecision> {
        auto promise = job.self()->make_response_promise<GateDecision>();
        if (g.rank < 0 || g.rank >= workers_ || gateOpen_ || job.over()) {
          // The gate opened already: a replacement of a rank lost after it
          // evaluates if the lost process was to and had not reported.
          const bool take = gateOpen_ && !job.over() && g.rank >= 0 && g.rank < workers_ && evaluator_ < 0 &&
                            !outcome_.evaluated;
          if (take) {
            evaluator_ = g.rank;
            log()->warn("worker {} evaluates the model (the worker that was to was lost)", g.rank);
          }
          promise.deliver(GateDecision{take});
          return promise;
        }
        log()->info("worker {} finished training: {} steps, {} samples in {:.1f} s", g.rank, g.steps, g.samples,
                    g.trainSeconds);
        trainsNoMore(job, g.rank);
        gateWaiters_.insert_or_assign(g.rank, promise);
        checkGate(job);
        return promise;
      },
      [this, &job](actors::LinkCounts& c) {
        // Only from the process it speaks for (an actor on its agent's node).
        if (c.role != "ps" && c.role != "worker") return;
        const auto& members = job.members(c.role);
        const auto& sender = job.self()->current_sender();
        if (c.rank < 0 || c.rank >= int64_t(members.size()) || !sender) return;
        const actors::Member& m = members[size_t(c.rank)];
        if (m.incarnation != c.incarnation || !m.agent || sender->node() != m.agent.node()) return;
        keepLinks(std::move(c));
      },
      [this, &job](const WorkerReport& r) -> int64_t {
        if (r.rank < 0 || r.rank >= workers_ || reported_[size_t(r.rank)]) return r.rank;  // a repeat changes nothing
        // Only from the rank's live process (a report of one stopped for a
        // rollback may still be on its way: it counts for nothing).
        const actors::Member& m = job.members("worker")[size_t(r.rank)];
        const auto& sender = job.self()->current_sender();
        if (!m.live() || !m.agent || !sender || sender->node() != m.agent.node()) {
          log()->warn("a report of worker {} from a process that no longer holds the rank: ignored", r.rank);
          return r.rank;
        }
        reported_[size_t(r.rank)] = true;
        job.finished("worker", r.rank);
        trainsNoMore(job, r.rank);
        auto& o = outcome_;
        const int64_t restarts = o.workers[size_t(r.rank)].restarts;
        o.workers[size_t(r.rank)] = WorkerSummary{r.rank,         false,          r.steps,     r.samples, r.pushesAcked,
                                                  r.pulledRows,   r.trainSeconds, r.denseHash, restarts,  r.resumedAt,
                                                  r.stepsRedone,  r.pushesAcknowledged};
        o.workers[size_t(r.rank)].pullWaitSeconds = r.pullWaitSeconds;
        o.workers[size_t(r.rank)].collectiveSeconds = r.collectiveSeconds;
        if (countsTraining(r.rank, true)) o.steps += r.steps;
        if (countsTraining(r.rank, false)) o.samples += r.samples;
        for (size_t i = 0; i < r.wirePaths.size() && (i + 1) * kWireFigures <= r.wireFigures.size(); ++i) {
          auto it = std::find_if(o.traffic.begin(), o.traffic.end(),
                                 [&](const PathTraffic& t) { return t.path == r.wirePaths[i]; });
          if (it == o.traffic.end()) it = o.traffic.insert(o.traffic.end(), PathTraffic{r.wirePaths[i]});
          const double* f = r.wireFigures.data() + i * kWireFigures;
          it->frames += f[0];
          it->wireBytes += f[1];
          it->encodedBytes += f[2];
          it->rawBytes += f[3];
          it->messages += f[4];
          it->compressed += f[5];
        }
        if (mode_ == TrainMode::kAllReduce && o.reportsCounted > 0 && o.samplesApplied != r.samplesApplied &&
            !o.samplesDiffer) {
          o.samplesDiffer = true;
          log()->error("worker {} counts {} samples applied, another {}", r.rank, r.samplesApplied, o.samplesApplied);
        }
        o.samplesApplied = std::max(o.samplesApplied, r.samplesApplied);
        ++o.reportsCounted;
        o.pulledRows += r.pulledRows;
        o.trainSeconds = std::max(o.trainSeconds, r.trainSeconds);
        o.datasetRows = std::max(o.datasetRows, r.datasetRows);
        if (maxSteps_ == 0) o.expectedSamples = expectedSamples(o.datasetRows);
        if (r.evaluated) {
          o.evaluated = true;
          o.auc = r.auc;
          o.loss = r.loss;
          o.accuracy = r.accuracy;
          o.rows = r.rows;
          o.evalSeconds = r.evalSeconds;
          o.countChecked = r.countChecked;
          o.countWrong = r.countWrong;
          o.countErrors = r.countErrors;
          for (auto& [rank, w] : standby_) w.deliver(GateDecision{false});  // no one else needs to
          standby_.clear();
          if (r.labels.dtype == DType::kFloat32 && r.predictions.dtype == DType::kFloat32 &&
              r.labels.bytes == r.predictions.bytes) {
            o.labels.assign(r.labels.as<float>(), r.labels.as<float>() + r.labels.count<float>());
            o.predictions.assign(r.predictions.as<float>(), r.predictions.as<float>() + r.predictions.count<float>());
          }
        }
        checkDone(job);
        return r.rank;
      },
      [this, &job](CommOffer& offer) -> caf::typed_response_promise<CommChoice> {
        auto promise = job.self()->make_response_promise<CommChoice>();
        if (offer.rank < 0 || offer.rank >= workers_ || job.over() || offers_[size_t(offer.rank)]) {
          promise.deliver(caf::make_error(actors::Errc::kNotInJob,
                                          fmt::format("worker {} may not offer its collectives now", offer.rank)));
          return promise;
        }
        const int64_t rank = offer.rank;
        offers_[size_t(rank)] = std::move(offer);
        commWaiters_.emplace_back(rank, promise);
        for (const auto& o : offers_) {
          if (!o) return promise;
        }
        // NCCL takes one device per rank: the workers of a host take its
        // devices in rank order, and a host with more workers than devices
        // cannot use NCCL.
        std::vector<int64_t> device(static_cast<size_t>(workers_));
        std::vector<std::string> why(static_cast<size_t>(workers_));
        std::map<std::string, std::vector<int64_t>> hosts;
        const auto& members = job.members("worker");
        for (int64_t w = 0; w < workers_; ++w) {
          const std::string& a = members[size_t(w)].address;
          hosts[a.substr(0, a.rfind(':'))].push_back(w);
          why[size_t(w)] = offers_[size_t(w)]->unavailable;
        }
        for (const auto& [host, ranks] : hosts) {
          for (size_t i = 0; i < ranks.size(); ++i) {
            const int64_t w = ranks[i];
            device[size_t(w)] = int64_t(i);
            if (why[size_t(w)].empty() && int64_t(i) >= offers_[size_t(w)]->devices) {
              why[size_t(w)] = fmt::format("{} workers on host {} share its {} CUDA device(s), NCCL takes one each",
                                           ranks.size(), host, offers_[size_t(w)]->devices);
            }
          }
        }
        std::string backend = "nccl";
        for (int64_t w = 0; w < workers_ && backend == "nccl"; ++w) {
          if (why[size_t(w)].empty()) continue;
          if (backend_ == "nccl") {
            job.fail(fmt::format("collectives.backend = nccl, but worker {} cannot use NCCL: {}", w, why[size_t(w)]));
            return promise;
          }
          log()->info("collectives.backend = auto: the workers use the ring, since worker {} cannot use NCCL ({})", w,
                      why[size_t(w)]);
          backend = "ring";
        }
        const Tensor& id = offers_[0]->ncclId;
        if (backend == "nccl" && id.bytes != collectives::kNcclIdBytes) {
          job.fail(fmt::format("worker 0 sent an NCCL id of {} bytes, not {}", id.bytes, collectives::kNcclIdBytes));
          return promise;
        }
        if (backend == "nccl") log()->info("the {} workers use NCCL for their collectives", workers_);
        outcome_.collectivesBackend = backend;
        for (auto& [r, w] : commWaiters_) w.deliver(CommChoice{backend, id, device[size_t(r)]});
        commWaiters_.clear();
        return promise;
      },
  };
  return own.or_else(faults_->handlers(job));
}

JobOutcome TrainingJob::takeOutcome(const actors::JobResult& result) {
  JobOutcome o = std::move(outcome_);
  o.ok = result.ok;
  o.error = result.error;
  o.events = result.events;
  o.faultPlan = faults_->plan();
  o.injections = faults_->injections();
  o.endedAtSeconds = result.endedAtSeconds;
  for (auto& [key, c] : links_) o.links.push_back(c);
  if (result.links) o.links.push_back(*result.links);
  if (mode_ != TrainMode::kPs) {
    // Recovered once the group that took the replacement in trains again.
    // A group that shrank recovered once it trains again without the lost rank.
    for (auto& e : o.events) {
      const bool shrank = onWorkerLoss_ == WorkerLoss::kShrink && e.action == "went on without it";
      if (e.recoveredAtSeconds < 0 && !shrank) continue;
      auto at = std::lower_bound(regroupedAt_.begin(), regroupedAt_.end(), e.lostAtSeconds);
      if (at != regroupedAt_.end()) e.recoveredAtSeconds = std::max(e.recoveredAtSeconds, *at);
    }
  }
  return o;
}

}  // namespace troupe::workers
