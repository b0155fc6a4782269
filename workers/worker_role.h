// The worker process of a training job (workers/training_job.h). With the
// roster it builds what the job's mode needs: in a sync mode the workers'
// communicator (the ring over the transport, or NCCL when the coordinator
// picks it from every worker's CommOffer); the client of the shards (ps,
// hybrid) or its replica of the tables (allreduce with tables); loaders of
// its share of the training data (every W-th batch) and of the test data;
// and the worker actor, driven by a small actor that reports its result to
// the coordinator (WorkerReport). They run supervised (actors/node_agent.h);
// a failure of any of them is escalated to the coordinator, which decides
// for the job.
#pragma once

#include <memory>

#include "actors/node_agent.h"
#include "workers/ps_client.h"

namespace troupe::collectives {
class Communicator;
class PeerWatch;
}

namespace troupe::workers {

// A worker's compute threads: `requested` when above 0, else the config's
// cluster.worker_threads when above 0, else this machine's cores divided
// among the job's workers (cluster.workers). Measured on 16 cores (bench/
// RESULTS.md, "Sixteen cores"): cutting the workers' threads so that they and
// the shards' fit the cores moved no job by more than the run-to-run spread,
// so the default stays.
int workerThreads(const Config& c, int requested);

class WorkerRole final : public actors::Role {
 public:
  // threads: compute threads (0: the config's cluster.worker_threads, or
  // the cores divided among the workers of this machine).
  explicit WorkerRole(int threads);
  ~WorkerRole() override;
  void prepare(actors::MemberContext& ctx) override;
  std::vector<actors::ChildSpec> start(actors::MemberContext& ctx, const actors::Roster& roster) override;
  void release() override;

 private:
  int threads_;
  std::unique_ptr<collectives::PeerWatch> peerWatch_;  // the NCCL communicator's health; outlives it
  std::shared_ptr<collectives::Communicator> comm_;
  std::shared_ptr<PsPathBytes> psBytes_ = std::make_shared<PsPathBytes>();  // the ps client's counts
};

}  // namespace troupe::workers
