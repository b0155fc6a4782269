// The fault report (README, Fault plans): what a job's fault plan injected,
// what the job detected and recovered from, how long each took, and the
// ledger that says whether anything was lost or applied twice. Written as
// faults.json in the run directory and printed as a table.
//
// An injection counts as detected when the coordinator lost the process it
// hit, and it was the latest fault to hit that process before the loss and
// could have caused it (a kill found within twice the heartbeat timeout and
// a second, a stop while the process was stopped, a slow worker declared
// hung any time after; a member stopped for another's rollback is no
// detection): detect is the seconds between the two. It counts as
// recovered when that loss was (the replacement ready, or the group that
// took it in training again): recover is the seconds from the loss. A stop
// shorter than the heartbeat timeout, or a slow worker that stays within
// the stall timeout, goes undetected, and that is what the report says.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "workers/training_job.h"

namespace troupe::workers {

// The ledger of a job: what every run writes in summary.json and a run with
// faults in faults.json. Samples applied (per shard, or by the workers'
// group in allreduce mode) against rows x epochs; and with shards, the
// pushes every shard acknowledged (the distinct sequence numbers, over the
// worker ranks whose last process reported: a rank's pushes before its
// process resumed count, as the shards had them) against the distinct
// pushes of those ranks in each shard's final state. Exact when every
// count is equal: nothing acknowledged was lost, no sample was trained
// twice or never.
struct Ledger {
  int64_t expectedSamples = 0;          // 0: not counted (train.max_steps cut training short)
  std::vector<int64_t> samplesApplied;  // per shard; one entry (the group's) in allreduce mode
  bool workersAgree = true;             // allreduce: every rank counted the same
  int64_t pushesAcknowledged = 0;
  std::vector<int64_t> pushesInState;   // per shard (empty without shards)
  std::vector<int64_t> ranksNotCounted; // worker ranks no process of which reported (the job went on without them)
  int64_t duplicatesSuppressed = 0;     // pushes a shard saw again and applied once
  bool exact = false;
};
Ledger ledgerOf(const JobOutcome& outcome);

struct FaultReport {
  struct Hit {
    actors::Injection injection;
    std::string target;      // "worker 1"
    bool detected = false;
    bool recovered = false;
    double detectSeconds = -1, recoverSeconds = -1;
    std::string detectedBy;  // the loss ("crashed", "timed out", ...)
    std::string action;      // what the job did ("replaced", ...)
  };
  struct Row {
    std::string kind;
    // Whether detected and recovered are counted for this kind (a message
    // fault other than a partition costs resends, counted for all of them
    // together: FaultReport::links).
    bool detects = true;
    int64_t injected = 0, skipped = 0, detected = 0, recovered = 0;
    // Faults of the plan that fire once (at_step, at_s) and never did: the
    // job ended first, or their process had gone before it got there.
    int64_t unfired = 0;
    std::vector<double> detectSeconds, recoverSeconds;
  };
  uint64_t seed = 0;
  std::vector<std::string> plan;  // the faults as given
  std::vector<Hit> hits;          // in the order injected
  std::vector<Row> rows;          // per kind: kill, stop, slow, then the plan's message kinds
  // Partitions (a message fault that cuts a process off for a while): each
  // is detected when the job lost the process cut off (by its silence, or
  // the reset of the connection it dropped when it lost the coordinator)
  // while the partition lasted (or within the detection bound after).
  struct Partition {
    int64_t fault = 0;
    std::string target;
    double atSeconds = 0, durationSeconds = 0;
    bool opened = false;  // the job was still on when it began
    bool detected = false, recovered = false;
    double detectSeconds = -1, recoverSeconds = -1;
  };
  std::vector<Partition> partitions;
  // What the processes' reliable links did, added up over their last words
  // (LinkCounts; a process killed since said it up to a second before).
  bool hasLinks = false;
  actors::LinkCounts links;
  int64_t linkProcesses = 0;
  int64_t stepsRedone = 0;        // by replacements (ps mode) and rollbacks
  int64_t rollbacks = 0, regroups = 0;
  int64_t duplicatesSuppressed = 0;  // pushes a shard saw again and applied once (Ledger's)
  // ps.replicas = 2: backups promoted (a primary's process lost; no
  // rollback) and copies built again by state transfer (the seconds each
  // transfer took).
  int64_t replicas = 1;
  std::vector<JobOutcome::Promotion> promotions;
  std::vector<JobOutcome::ReplicaBuilt> copiesBuilt;
  Ledger ledger;
  // The count model (model.kind = count): every value checked against the
  // counts of the data; those that were not exact.
  bool counted = false;
  int64_t countChecked = 0, countWrong = 0;
  std::string countErrors;
  std::vector<std::string> crashes;  // processes that died of a crash signal (not SIGKILL, SIGTERM, SIGINT)
  bool ok = false;  // the job finished
  std::string error;
  // The final model's quality, and that of the same job without faults
  // when it was run too (troupe train --baseline).
  std::string metric;  // "test_auc" or "test_accuracy"
  double value = 0;
  bool evaluated = false;  // the job finished and evaluated its model
  bool hasBaseline = false;
  bool baselineOk = false;
  double baseline = 0;
};

// `binary`: the model is judged by AUC (else by accuracy). `baseline`: the
// same job without faults, or null.
FaultReport faultReport(const JobOutcome& outcome, bool binary = true, const JobOutcome* baseline = nullptr);
// faults.json: the report as JSON text (indented by 2; a time or quality
// that is not there, or not finite, is null).
std::string faultReportJson(const FaultReport& report);
// ps.replicas = 2: the promotions and the copies built, each as a JSON array
// (faults.json and the run's summary.json write the same).
nlohmann::ordered_json promotionsJson(const std::vector<JobOutcome::Promotion>& promotions);
nlohmann::ordered_json copiesBuiltJson(const std::vector<JobOutcome::ReplicaBuilt>& copies);
// Per kind (rows with nothing are left out): injected, skipped, unfired,
// detected, recovered, and the seconds to detect and to recover at each of
// `percentiles` (100: the max).
std::string faultKindTable(const std::vector<FaultReport::Row>& rows, const std::vector<double>& percentiles);
// The table printed at the end of a run.
std::string faultReportTable(const FaultReport& report);

// The p-th percentile (0..100) of xs by linear interpolation; NaN when empty.
double percentile(std::vector<double> xs, double p);

}  // namespace troupe::workers
