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

#include "workers/training_job.h"

namespace troupe::workers {

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
    int64_t injected = 0, skipped = 0, detected = 0, recovered = 0;
    // Faults of the plan that fire once (at_step, at_s) and never did: the
    // job ended first, or their process had gone before it got there.
    int64_t unfired = 0;
    std::vector<double> detectSeconds, recoverSeconds;
  };
  uint64_t seed = 0;
  std::vector<std::string> plan;  // the faults as given
  std::vector<Hit> hits;          // in the order injected
  std::vector<Row> rows;          // per kind, in the order kill, stop, slow
  int64_t stepsRedone = 0;        // by replacements (ps mode) and rollbacks
  int64_t rollbacks = 0, regroups = 0;
  int64_t duplicatesSuppressed = 0;  // pushes a shard saw again and applied once
  // ps.replicas = 2: backups promoted (a primary's process lost; no
  // rollback) and copies built again by state transfer (the seconds each
  // transfer took).
  int64_t replicas = 1;
  std::vector<JobOutcome::Promotion> promotions;
  std::vector<JobOutcome::ReplicaBuilt> copiesBuilt;
  // The ledger: samples applied (per shard, or by the workers' group)
  // against rows x epochs.
  int64_t expectedSamples = 0;
  std::vector<int64_t> samplesApplied;  // per shard; one entry in allreduce mode
  std::vector<int64_t> pushesApplied;   // per shard
  bool ledgerExact = false;
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
std::string faultReportJson(const FaultReport& report);
// ps.replicas = 2: the promotions and the copies built, each as a JSON array
// (faults.json and the run's summary.json write the same).
std::string promotionsJson(const std::vector<JobOutcome::Promotion>& promotions);
std::string copiesBuiltJson(const std::vector<JobOutcome::ReplicaBuilt>& copies);
// Per kind (rows with nothing are left out): injected, skipped, unfired,
// detected, recovered, and the seconds to detect and to recover at each of
// `percentiles` (100: the max).
std::string faultKindTable(const std::vector<FaultReport::Row>& rows, const std::vector<double>& percentiles);
// The table printed at the end of a run.
std::string faultReportTable(const FaultReport& report);

// The p-th percentile (0..100) of xs by linear interpolation; NaN when empty.
double percentile(std::vector<double> xs, double p);

}  // namespace troupe::workers
