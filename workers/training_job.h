// A multi-process training job (DESIGN.md, Processes and roles): one
// coordinator, S parameter-server processes (one shard each) and W worker
// processes. train.mode picks where parameters live: ps (all on the
// shards), allreduce (no shards: every worker holds the dense parameters and
// a replica of the tables, and the workers' communicator averages
// gradients), hybrid (tables on the shards, dense parameters by all-reduce).
//
// The lifecycle (ranks, readiness, losses, shutdown) is the coordinator's
// (actors/coordinator.h); TrainingJob is the job's policy there: it follows
// the workers' progress, opens the evaluation gate once every live worker
// has trained its share (the lowest live rank evaluates the final model),
// collects their reports (workers/job_messages.h), picks the collectives
// backend of a sync mode, and, once every live worker reported, asks the
// shards for their counters and ends the job. The roles of the other
// processes are in workers/ps_role.h and workers/worker_role.h.
//
// A loss (TrainingJob::onLoss): a lost shard rolls the job back to its
// latest checkpoint (rollBack), or without one ends the job naming it. A
// lost or failed worker is replaced (supervision.on_worker_loss = restart,
// within supervision.max_restarts). In ps mode its new process asks the
// shards where its rank left off and resumes its share of the data there,
// while the shards wait for it (BSP) or the others go on (SSP within the
// staleness, ASP); a re-sent push is applied once. In a sync mode (ring
// backend) the survivors wait, ready (RegroupReady), and once the
// replacement is too, the coordinator names the new group (Regroup); the
// workers agree on the step and copy the model among themselves
// (workers/worker_actor.h). With on_worker_loss = shrink (allreduce mode)
// the lost rank is not replaced: the survivors form the group without it
// and divide what is left of the data among themselves. With on_worker_loss
// = fail, with NCCL, or once no live worker holds the model, the job ends
// naming the loss.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "actors/coordinator.h"
#include "actors/fault_injector.h"
#include "common/config.h"
#include "ps/shard.h"
#include "transport/node.h"
#include "transport/tensor.h"
#include "workers/checkpoint.h"
#include "workers/job_messages.h"
#include "workers/job_setup.h"
#include "workers/regroup.h"

namespace troupe::workers {

struct JobProgress {
  int64_t worker = 0, step = 0, epoch = 0, epochRows = 0, rowsPerEpoch = 0;
  double loss = 0, samplesPerSec = 0;  // samplesPerSec: all workers together
  double wireRatio = 1;                // the worker's compression so far (encoded / float32 bytes)
  int64_t mailbox = 0;                 // messages waiting in the worker actor's mailbox
};

// One path's bytes over the workers' last processes (WorkerReport's wire
// figures, summed).
struct PathTraffic {
  std::string path;
  double frames = 0, wireBytes = 0, encodedBytes = 0, rawBytes = 0, messages = 0, compressed = 0;
};

// What the last process of a worker rank reported.
struct WorkerSummary {
  int64_t rank = 0;
  bool lost = false;
  int64_t steps = 0, samples = 0, pushesAcked = 0, pulledRows = 0;  // samples: trained by that process
  double trainSeconds = 0;
  uint64_t denseHash = 0;  // of the final dense weights (identical on every rank in sync modes)
  int64_t restarts = 0;    // processes that replaced a lost one of this rank
  int64_t resumedAt = 0;   // the step the last one resumed at (0: it trained from the start)
  int64_t stepsRedone = 0; // steps it redid that some shard had already (applied there once)
  // The ledger: the distinct pushes of this rank every shard acknowledged
  // (its earlier processes' included); -1 when no process of it reported.
  int64_t pushesAcknowledged = -1;
  // Of trainSeconds (its last process's): waiting for training pulls, and
  // in collectives.
  double pullWaitSeconds = 0, collectiveSeconds = 0;
};

struct ShardSummary {
  int64_t rank = 0;
  int64_t rows = 0, pushesApplied = 0, duplicatePushes = 0, pullsServed = 0, pullsDelayed = 0, maxLead = 0;
  int64_t samplesApplied = 0;  // the ledger: rows of the distinct pushes applied
  std::vector<int64_t> pushesByWorker;  // the ledger: per worker rank, the distinct pushes in the shard's state
  // ps::ShardStats::staleness: pushes by the updates their gradients missed.
  std::vector<int64_t> staleness;
  int64_t stalenessUnknown = 0;
  // While the job runs (LiveFigures): what waits in the shard now.
  int64_t parkedPulls = 0, pendingSteps = 0, awaitingBackup = 0;
  int64_t mailbox = 0;  // messages waiting in the shard actor's mailbox
};

// Staleness over every shard (ShardSummary::staleness summed): its count,
// mean and quantiles (the smallest k with at least that share of pushes at
// or below it; -1 with no push).
struct StalenessSummary {
  std::vector<int64_t> histogram;
  int64_t pushes = 0, unknown = 0;
  double mean = 0;
  int64_t p50 = -1, p99 = -1, max = -1;
};
StalenessSummary summarizeStaleness(const std::vector<ShardSummary>& shards);

// supervision.on_worker_loss. Throws SetupError on another value.
enum class WorkerLoss { kRestart, kShrink, kFail };
WorkerLoss workerLossPolicy(const Config& config);

// One checkpoint the job wrote.
struct CheckpointRecord {
  int64_t id = 0;
  std::string dir;
  int64_t step = 0;            // the slowest worker's step at the cut
  double pausedSeconds = 0;    // from the first worker paused until every copy was taken
  double writtenSeconds = 0;   // from the first worker paused until the manifest was written
  uint64_t bytes = 0;
};

struct JobOutcome {
  bool ok = false;
  std::string error;  // when !ok
  // A job of processes: its coordinator's node's counters at the end (who
  // knocked without the token, or held a handshake slot idle).
  std::optional<transport::NodeStats> coordinatorNode;
  // The final evaluation (by the lowest live worker rank).
  bool evaluated = false;
  double auc = 0, loss = 0, accuracy = 0;
  int64_t rows = 0;
  std::vector<float> labels, predictions;
  // The count model: values checked against the counts, those wrong, the
  // first few named.
  int64_t countChecked = 0, countWrong = 0;
  std::string countErrors;
  double trainSeconds = 0;  // the longest worker's training time
  double evalSeconds = 0;
  int64_t steps = 0, samples = 0, pulledRows = 0;  // all workers
  std::vector<WorkerSummary> workers;
  std::vector<ShardSummary> shards;
  std::vector<actors::RecoveryEvent> events;  // every loss, in order
  std::vector<PathTraffic> traffic;           // by path, in order of first report
  // The ledger: every sample of every epoch applied once on every shard
  // (ps and hybrid modes) makes each shard's samplesApplied equal this.
  int64_t datasetRows = 0;      // training rows per epoch
  int64_t expectedSamples = 0;  // datasetRows x epochs (0 when train.max_steps cuts training short)
  std::string collectivesBackend;             // sync modes: the one the workers use ("ring", "nccl")
  std::vector<CheckpointRecord> checkpoints;  // written, in order
  int64_t resumedFromStep = -1;               // a resumed job: the cut it went on from
  // Rollbacks after a lost shard: to which checkpoint, and the steps the
  // workers had taken beyond its cut (done again).
  struct Rollback {
    int64_t checkpoint = 0;
    std::string dir;
    int64_t stepsRedone = 0;
    double atSeconds = 0;
  };
  std::vector<Rollback> rollbacks;
  // Sync modes: a loss counts as recovered (RecoveryEvent::recoveredAtSeconds)
  // once the group formed again trains, not when the replacement is ready.
  // Times the workers' group formed again, and the samples the
  // steps applied (every rank's; each worker counts them, and all agree).
  int64_t regroups = 0;
  int64_t samplesApplied = 0;
  bool samplesDiffer = false;
  int64_t reportsCounted = 0;
  // Processes of a local job that died of a signal nobody sent on purpose
  // (actors::LocalJob::crashes).
  std::vector<std::string> crashes;
  // ps.replicas = 2: backups promoted (the primary's process was lost) and
  // backups built anew (state transfer to a replacement process), in order.
  int64_t replicas = 1;
  struct Promotion {
    int64_t shard = 0, from = 0, to = 0;  // its primary's ps process was lost; the backup's serves
    double atSeconds = 0;
    // When training went on (at the latest): the first progress report a
    // worker sent after the promotion (train.progress_every steps past the
    // last one it had reported before it); -1 when none came.
    double trainingAtSeconds = -1;
  };
  std::vector<Promotion> promotions;
  struct ReplicaBuilt {
    int64_t shard = 0, primary = 0, backup = 0;  // ps processes
    double atSeconds = 0, seconds = 0;  // when two copies were there again; how long the transfer took
  };
  std::vector<ReplicaBuilt> replicasBuilt;
  // The fault plan (faults.plan) and every fault it injected, in order.
  actors::FaultPlan faultPlan;
  std::vector<actors::Injection> injections;
  // A plan with message faults: what each process's links did (its last
  // word: at the end, or a second before it was lost), the coordinator's too.
  std::vector<actors::LinkCounts> links;
  double endedAtSeconds = 0;  // since the coordinator started
};

// The published names of a ps process's shard actor and of a worker
// process's worker actor.
inline constexpr const char* kShardName = "shard";
// A worker process publishes each of its ranks' trainer (a rank moved
// into it has one of its own) as trainerName(rank).
inline std::string trainerName(int64_t rank) { return "trainer" + std::to_string(rank); }
// ps.replicas = 2: a worker process publishes each of its ranks' ps client
// as psClientName(rank) (the coordinator names new primaries to it).
inline std::string psClientName(int64_t rank) { return "psclient" + std::to_string(rank); }

// What the job knows besides progress, while it runs (--metrics-port):
// each live shard's counters and staleness histogram, and its recoveries so
// far.
struct LiveFigures {
  std::vector<ShardSummary> shards;  // the shards that answered
  int64_t processesReplaced = 0;     // processes that took the rank of a lost one (every role)
  int64_t rollbacks = 0, backupsPromoted = 0;
  std::vector<actors::LinkCounts> processes;  // each live ps and worker process's (its node's traffic so far)
  int64_t coordinatorMailbox = 0;  // messages waiting in the coordinator's mailbox when the poll began
};

struct TrainingJobOptions {
  std::function<void(const JobProgress&)> onProgress;  // on the coordinator's thread
  // An evaluation during training (train.eval_every_*), with the seconds
  // since the job started; on the coordinator's thread.
  std::function<void(const EvalPoint&, double wallSeconds)> onEval;
  // LiveFigures every `liveEvery` while the job runs (0: never); on the
  // coordinator's thread. Each asks every live shard, as the end does.
  std::function<void(const LiveFigures&)> onLive;
  std::chrono::milliseconds liveEvery{0};
  // Where checkpoints go (checkpoint.dir, or the run directory's
  // checkpoints/); "" when the job writes none.
  std::string checkpointDir;
  // A resumed job: the checkpoint it goes on from (its id and cut).
  const CheckpointManifest* resumedFrom = nullptr;
};

class TrainingJob final : public actors::JobPolicy {
 public:
  TrainingJob(const Config& config, TrainingJobOptions options);

  caf::message_handler handlers(actors::JobContext& job) override;
  void onStart(actors::JobContext& job) override;
  actors::LossDecision onLoss(actors::JobContext& job, const actors::Member& m, const actors::Loss& loss) override;
  void onReplaced(actors::JobContext& job, const actors::Member& m) override;
  actors::LossDecision onEscalation(actors::JobContext& job, const actors::Member& m, const std::string& why) override;
  void onOver(actors::JobContext& job) override;
  std::string configFor(actors::JobContext& job, const actors::Member& m, const std::string& base) override;

  // Whether every process was ready once (any thread).
  bool started() const { return started_.load(); }
  // The outcome; complete once the coordinator's run is over.
  JobOutcome takeOutcome(const actors::JobResult& result);

 private:
  int64_t expectedSamples(int64_t rowsPerEpoch) const;
  void checkGate(actors::JobContext& job);
  void tryRegroup(actors::JobContext& job);
  int64_t adoptiveHost(actors::JobContext& job, const actors::Member& lost) const;
  actors::LossDecision decideLoss(actors::JobContext& job, const actors::Member& m, const actors::Loss& loss);
  void checkDone(actors::JobContext& job);
  void finalize(actors::JobContext& job);
  // Finds workers alive but making no step (supervision.stall_timeout_s).
  void checkStalls(actors::JobContext& job);
  // Whether the workers' silence is explained by a process that is away: a
  // shard without replicas that is not running (lost, its new process
  // setting up; with replicas its backup serves on), or, where workers wait
  // for each other through the shards (BSP, SSP), a worker rank awaiting
  // its new process (until that process is ready). A rank lost for good,
  // not replaced, is left by the shards, and nobody waits for it. Bounded:
  // a replacement that does not come in supervision.replace_timeout_s ends
  // the job.
  bool othersExcused(actors::JobContext& job) const;
  // Checkpoints (workers/checkpoint.h): starts one when one is due; the
  // steps of one; gives one up (the workers train on).
  void maybeCheckpoint(actors::JobContext& job);
  void pauseWorkers(actors::JobContext& job, int64_t atStep);
  std::chrono::seconds pauseTimeout() const;
  void trainsNoMore(actors::JobContext& job, int64_t rank);
  // Sync modes: the step every rank stops at (far enough ahead that each
  // hears of it before the group gets there).
  int64_t syncPauseStep() const;
  // Every worker is paused: the shards copy their state, and in a sync mode
  // the lowest live rank the group's model; once all have, the workers
  // train on (cutTaken) while the files are written.
  void takeCut(actors::JobContext& job);
  void cutTaken(actors::JobContext& job);
  void checkpointWritten(actors::JobContext& job);
  void abandonCheckpoint(actors::JobContext& job, const std::string& why);
  // A shard is lost (`lostShard`), or in a sync mode every worker that
  // held the model (-1): every other shard goes back to the latest
  // checkpoint, every worker is restarted from its cut, and the lost
  // shard's replacement starts from it (a new generation: what the old
  // workers still send is refused). `why` says what was lost.
  void rollBack(actors::JobContext& job, int64_t lostShard, const std::string& why);
  // ps.replicas = 2: the actor serving shard k (its primary copy), a lost
  // ps process's shards (backups promoted, primaries told their backups are
  // gone), the workers told where the primaries are, and a replacement's
  // copies built from their primaries.
  caf::actor shardActor(actors::JobContext& job, int64_t shard);
  actors::LossDecision replicaLoss(actors::JobContext& job, const actors::Member& m, const std::string& what);
  std::vector<int64_t> primaryNodes(actors::JobContext& job) const;
  void sendRoutes(actors::JobContext& job);
  void rebuildCopies(actors::JobContext& job, const actors::Member& m);
  void rebuildCopy(actors::JobContext& job, int64_t shard, int64_t backup, uint64_t node, int attempt, int64_t token);

  int64_t workers_ = 0, servers_ = 0;
  // A pipeline across the workers (rank r: stage r % p of replica r / p):
  // p, else 0. Its samples and steps are counted once a replica (at the
  // last stages), not once a stage.
  int64_t pipelineStages_ = 0;
  bool countsTraining(int64_t rank, bool steps) const {
    return pipelineStages_ == 0 || (rank % pipelineStages_ == pipelineStages_ - 1 && (!steps || rank < pipelineStages_));
  }
  int64_t replicas_ = 1;
  std::vector<int64_t> primaryHost_;  // ps.replicas = 2: per shard, the ps rank whose process serves it
  std::vector<bool> backupSynced_;    // per shard: its other copy is live and identical
  std::vector<int64_t> rebuildToken_; // per shard: the latest rebuild (older tries are stale)
  std::set<int64_t> rebuild_;         // ps ranks whose next process builds its copies from their primaries
  // Promotions (outcome_.promotions indices) waiting for training to go on,
  // and each worker's last reported step at the promotion.
  std::map<size_t, std::vector<int64_t>> promotedAt_;
  int64_t progressEvery_ = 100;
  ps::Consistency consistency_ = ps::Consistency::kBsp;
  TrainMode mode_ = TrainMode::kPs;
  std::string backend_;  // collectives.backend
  WorkerLoss onWorkerLoss_ = WorkerLoss::kRestart;
  int64_t epochs_ = 1, maxSteps_ = 0;
  std::function<void(const JobProgress&)> onProgress_;
  std::function<void(const EvalPoint&, double)> onEval_;
  std::function<void(const LiveFigures&)> onLive_;
  std::chrono::milliseconds liveEvery_{0};
  bool livePolling_ = false;  // a poll's answers are outstanding
  void pollLive(actors::JobContext& job);
  std::string configText_;
  JobShape shape_;
  // Checkpoints.
  std::string checkpointBase_;
  int64_t checkpointEverySteps_ = 0, checkpointKeep_ = 2;
  std::chrono::seconds checkpointEverySeconds_{0};
  int64_t nextCheckpointId_ = 1;
  int64_t lastCheckpointStep_ = 0;
  std::chrono::steady_clock::time_point lastCheckpoint_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point notBefore_{};  // no new checkpoint before (backing off)
  int64_t lateTries_ = 0;  // checkpoints given up in a row because a worker was past the step
  // Compression with error feedback (push or all-reduce): each paused
  // worker's codec residuals are part of the cut (workers/residual_image.h).
  bool residuals_ = false;
  struct Checkpointing {
    bool active = false;
    int64_t id = 0;
    std::string dir;
    std::chrono::steady_clock::time_point started, resumed;
    std::optional<std::chrono::steady_clock::time_point> firstPaused;  // when the first worker stopped
    std::set<int64_t> waiting;          // workers asked to pause, not yet paused
    std::set<int64_t> paused;           // workers paused (to resume)
    std::set<int64_t> over;             // of those, ones that train no more (no residuals to copy)
    int64_t snapshotsLeft = 0, writesLeft = 0;
    bool snapshotting = false;  // the shards (and the model's rank) were asked for their copies
    std::map<int64_t, int64_t> pausedAt;  // the step each worker paused at
    std::map<int64_t, int64_t> residualSteps;  // compression: the step of each worker's residuals
    int64_t atStep = -1;                  // the step asked for (-1: each worker's next)
    CheckpointManifest manifest;
  } ckpt_;
  std::string latestCheckpoint_;  // the newest complete checkpoint's directory
  int64_t latestCheckpointId_ = 0;
  std::vector<int64_t> latestCut_;
  int64_t generation_ = 0;        // one more at each rollback begun (also one begun again) and each shrink's undo
  std::map<std::pair<size_t, int64_t>, int64_t> rolledBackTo_;  // (rollback, worker) -> furthest step a shard had
  // The last rollback was for the workers (no live one held the model) and
  // none can have trained since (no new worker process is up yet, none
  // reported a step past its cut): a shard's loss now is the same fault
  // heard of twice (the workers' pushes to a killed shard failed first, and
  // ended them), and begins that rollback again, counted once.
  bool rollbackUntrained_ = false;
  int64_t lastRollbackShard_ = -1;  // the shard lost for the last rollback (-1: none, the workers)
  Config config_;
  std::atomic<bool> started_{false};
  std::vector<double> rate_;  // per worker: samples/s it reported last
  std::vector<int64_t> progressSamples_;  // per worker: samples it had trained at its last progress report
  // Per worker: when it last reported a step, and which.
  std::vector<std::chrono::steady_clock::time_point> lastProgress_;
  std::vector<int64_t> lastStep_;
  std::chrono::seconds stallTimeout_{300};
  std::chrono::seconds collectiveTimeout_{600};  // sync modes: a collective gives up after this
  bool checkingStalls_ = false;
  std::vector<bool> reported_;
  std::map<int64_t, caf::typed_response_promise<GateDecision>> gateWaiters_;
  // Sync modes, the gate open: the workers not evaluating, held until the
  // evaluating one has (one of them takes its place if it is lost).
  std::map<int64_t, caf::typed_response_promise<GateDecision>> standby_;
  std::set<int64_t> awaitingReplacement_;  // worker ranks lost whose new process is not ready yet
  std::set<int64_t> unheard_;  // worker ranks whose new process has not reported progress yet
  bool gateOpen_ = false;
  int64_t evaluator_ = -1;  // the rank evaluating the final model (-1: none yet, or it was lost first)
  bool finishing_ = false;
  // The collectives backend of a sync mode (CommOffer).
  std::vector<std::optional<CommOffer>> offers_;
  std::vector<std::pair<int64_t, caf::typed_response_promise<CommChoice>>> commWaiters_;
  // Sync modes: the workers ready for the group to form again (each one's
  // worker actor), and the groups formed so far.
  std::map<int64_t, caf::actor> regroupReady_;
  std::map<int64_t, int64_t> regroupSteps_;  // the steps each ready survivor took (-1: a replacement)
  std::map<int64_t, std::vector<uint64_t>> regroupUnreachable_;  // the nodes each ready worker found down
  // Hybrid shrink: ranks lost whose steps the shards must undo before the
  // group goes on without them; the undo under way; what the group gets.
  std::set<int64_t> toRevert_;
  bool reverting_ = false;
  int64_t revertedStep_ = -1;  // the shards went back to this step for the group to come
  void revertShards(actors::JobContext& job);
  int64_t regroupEpoch_ = 0;
  std::set<int64_t> regroupDone_;     // ranks in the group of regroupEpoch_ that copied the model
  size_t regroupSize_ = 0;            // ranks in that group
  std::set<int64_t> holdsModel_;      // ranks whose live process holds the model (not a replacement still waiting)
  std::vector<double> regroupedAt_;   // when each group trained again (seconds since the start)
  bool forming_ = false;              // a Regroup went out; not every rank said RegroupDone yet
  bool awaitingGroup_ = false;        // a rank was lost; the group has not trained again since
  int64_t regroupsSinceLoss_ = 0;
  // Sync modes: how the group divided the data, in order (the job's, then
  // each group formed again): the ledger's expected samples follow them.
  std::vector<DataDivision> divisions_;
  // Hybrid, after a rollback: rank -> the incarnation that starts from the
  // checkpoint's model (later ones copy the model from their group).
  std::map<int64_t, int64_t> fromCheckpoint_;
  std::unique_ptr<actors::FaultInjector> faults_;  // the fault plan's
  // The last LinkCounts of every process (role, rank, incarnation).
  std::map<std::tuple<std::string, int64_t, int64_t>, actors::LinkCounts> links_;
  void keepLinks(actors::LinkCounts c);
  JobOutcome outcome_;
};

// The coordinator of a training job: its role groups ({ps: S, worker: W})
// and its timeouts, from the config. Throws SetupError on a bad value.
actors::CoordinatorOptions coordinatorOptions(const Config& config);

}  // namespace troupe::workers
