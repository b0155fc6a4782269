// The parameter-server process of a training job (workers/training_job.h):
// one shard (ps/shard.h) owning hash(key) mod S of every embedding table and
// its slice of the dense parameters, built from the job's config and
// published as kShardName before the process says Ready, so no worker pulls
// before it exists. The shard is supervised but never restarted in place: a
// restarted shard would have lost what it held (the coordinator handles
// the process's loss).
#pragma once

#include <memory>

#include <caf/actor.hpp>

#include "actors/node_agent.h"

namespace troupe::workers {

// A shard process's compute threads: `requested` when above 0, else the
// config's cluster.server_threads (at least 1).
int serverThreads(const Config& c, int requested);

class PsRole final : public actors::Role {
 public:
  // threads: compute threads (0: the config's cluster.server_threads).
  explicit PsRole(int threads) : threads_(threads) {}
  void prepare(actors::MemberContext& ctx) override;
  std::vector<actors::ChildSpec> start(actors::MemberContext& ctx, const actors::Roster& roster) override;
  void release() override {
    shard_ = caf::actor();
    second_ = caf::actor();
  }

 private:
  int threads_;
  caf::actor shard_;   // its rank's shard (a copy of it, with ps.replicas = 2)
  caf::actor second_;  // ps.replicas = 2: its copy of shard rank-1 (mod S)
  bool replicated_ = false, rebuild_ = false;
  int64_t servers_ = 0;
};

}  // namespace troupe::workers
