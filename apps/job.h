// A multi-process training job (DESIGN.md, Processes and roles): one
// coordinator, S parameter-server processes (one shard each) and W worker
// processes. train.mode picks where parameters live: ps (all on the shards),
// allreduce (no shards: every worker holds the dense parameters and a
// replica of the tables, and the workers' communicator averages gradients),
// hybrid (tables on the shards, dense parameters by all-reduce).
//
// The coordinator publishes the actor "coordinator". Every other process
// joins the coordinator's node, publishes "process" (it answers shutdown)
// and speaks, in order:
//   (hello_atom, role, requested rank, node id, address) -> (rank, config TOML)
//       the coordinator assigns the rank (the requested one when free) and
//       hands out the job's config; it monitors the process from now on
//   (ready_atom, role, rank) -> Tensor u64[S + W]: the shards' node ids, then
//       the workers', once every process is ready (a ps publishes "shard"
//       before it says ready); workers of a sync mode build their
//       communicator from the workers' ids
// and a worker then trains against the shards, reports progress
// (progress_atom ...), passes the evaluation gate (gate_atom ...: the lowest
// live rank evaluates the final model) and reports (done_atom ...). The
// coordinator asks the shards for their counters, sends shutdown to
// every process and writes the summary.
//
// A lost shard, a lost worker in BSP or a sync mode, a failed worker or a process that does
// not join within cluster.start_timeout_s ends the job with an error naming
// it; a lost worker in SSP / ASP is reported and the others finish.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "transport/node.h"

namespace troupe::apps {

struct JobProgress {
  int64_t worker = 0, step = 0, epoch = 0, epochRows = 0, rowsPerEpoch = 0;
  double loss = 0, samplesPerSec = 0;  // samplesPerSec: all workers together
};

struct WorkerSummary {
  int64_t rank = 0;
  bool lost = false;
  int64_t steps = 0, samples = 0, pushesAcked = 0, pulledRows = 0;
  double trainSeconds = 0;
  uint64_t denseHash = 0;  // of the final dense weights (identical on every rank in sync modes)
};

struct ShardSummary {
  int64_t rank = 0;
  int64_t rows = 0, pushesApplied = 0, duplicatePushes = 0, pullsServed = 0, pullsDelayed = 0, maxLead = 0;
};

struct JobOutcome {
  bool ok = false;
  std::string error;  // when !ok
  // The final evaluation (by the lowest live worker rank).
  bool evaluated = false;
  double auc = 0, loss = 0, accuracy = 0;
  int64_t rows = 0;
  std::vector<float> labels, predictions;
  double trainSeconds = 0;   // the longest worker's training time
  double evalSeconds = 0;
  int64_t steps = 0, samples = 0, pulledRows = 0;  // all workers
  std::vector<WorkerSummary> workers;
  std::vector<ShardSummary> shards;
  std::vector<std::string> events;  // lost processes, in order
  std::string collectivesBackend;   // sync modes: the one the workers use ("ring", "nccl")
};

struct CoordinatorOptions {
  Config config{troupeConfigSchema()};  // the job's, handed to every process
  transport::NodeOptions node;
  std::function<void(const JobProgress&)> onProgress;  // on the coordinator's thread
  // Polled about every 100 ms while the job runs: a non-empty answer aborts
  // the job with it (Ctrl-C, a child that exited early).
  std::function<std::string()> checkAbort;
  // Called once the coordinator listens, with its address (a local job
  // starts its children from here).
  std::function<void(const std::string& address)> onListening;
};

// Runs the coordinator until the job ends. Never throws for a job that
// fails: the outcome says why.
JobOutcome runCoordinator(const CoordinatorOptions& options);

struct MemberOptions {
  std::string role;  // "ps" or "worker"
  int64_t requestedRank = -1;  // -1: any
  transport::NodeOptions node;  // coordinator address and token set
  int threads = 0;  // 0: from the job's config
};

// Runs a ps or worker process until the coordinator shuts the job down.
// Returns the process exit status (0 clean) after logging any error.
int runMember(const MemberOptions& options);

}  // namespace troupe::apps
