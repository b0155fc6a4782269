#include "workers/ps_role.h"

#include <unistd.h>

#include <optional>

#include <caf/all.hpp>

#include "common/logging.h"
#include "kernels/kernels.h"
#include "ps/shard.h"
#include "ps/shard_image.h"
#include "ps/wire.h"
#include "transport/remote_actors.h"
#include "workers/checkpoint.h"
#include "workers/job_setup.h"
#include "workers/training_job.h"
#include "workers/worker_core.h"

namespace troupe::workers {

int serverThreads(const Config& c, int requested) {
  return requested > 0 ? requested : int(std::max<int64_t>(1, c.getInt("cluster.server_threads")));
}

void PsRole::prepare(actors::MemberContext& ctx) {
  const Config& config = ctx.config;
  const int64_t rank = ctx.welcome.rank;
  const int threads = serverThreads(config, threads_);
  logger("job")->info("ps {} (pid {}) on {} ({} compute threads)", rank, ::getpid(), ctx.remote.node().address(),
                      threads);
  auto kernels = std::shared_ptr<kernels::Kernels>(kernels::createKernels({kernels::Device::kCpu, threads}));
  const TrainMode mode = trainMode(config);
  const int servers = int(serverCount(config));
  WorkerCoreOptions model = modelOptions(config, threads);
  model.kernels = kernels;
  ps::ShardOptions so;
  so.shard = int(rank);
  so.shards = servers;
  so.workers = int(config.getInt("cluster.workers"));
  so.tables = tableOptions(config, model);
  for (auto& t : so.tables) t.initialCapacity = 1024;
  so.denseOptimizer = model.denseOptimizer;
  auto consistency = ps::parseConsistency(config.getString("ps.consistency"));
  if (!consistency.hasValue()) TROUPE_SETUP_ERROR("config: ps.consistency: {}", consistency.status().message());
  so.consistency = *consistency;
  so.staleness = config.getInt("ps.staleness");
  const StaleAware staleAware = staleAwareOf(config);
  if (mode == TrainMode::kPs) {  // (hybrid's ranks push one synchronous step: their order is no staleness)
    so.staleLr = staleAware.staleLr;
    so.delayCompensation = staleAware.delayCompensation;
  }
  so.parkTimeout = pullWaitBound(config);
  so.generation = config.getInt("cluster.generation");
  so.groupTrains = trainMode(config) != TrainMode::kPs;
  so.undoWholeSteps = trainMode(config) == TrainMode::kHybrid && workerLossPolicy(config) == WorkerLoss::kShrink;
  so.kernels = kernels;
  const CompressionConfig compression = compressionOf(config);
  so.pushCodec = compression.push;
  so.pullCodec = compression.pull;
  so.warmupSteps = compression.warmupSteps;
  // ps.replicas = 2: this process holds a copy of its rank's shard and one
  // of the shard before it (copies of shard k live in processes k and
  // k+1). In a job's first processes both start from the same state, and
  // its rank's copy is the primary, which serves once it has its backup
  // (start, below). A process that replaces a lost one holds two backups
  // that wait for their primaries' state (the coordinator has them sent).
  replicated_ = psReplicas(config) == 2;
  rebuild_ = replicated_ && config.getBool("cluster.ps_rebuild");
  servers_ = servers;
  // A forwarded BSP push is answered once its step is complete: as late as
  // a training pull may wait. A lost backup is found sooner, by its process.
  so.backupTimeout = std::chrono::duration_cast<std::chrono::milliseconds>(pullWaitBound(config) + std::chrono::seconds(60));
  so.locate = [&remote = ctx.remote](uint64_t node, const std::string& name) { return remote.remoteActor(node, name); };
  so.coordinator = ctx.coordinator;
  // A resumed job (or a rolled-back shard): the checkpoint's image of a shard.
  const std::string resume = config.getString("checkpoint.resume");
  std::optional<CheckpointManifest> manifest;
  if (!resume.empty() && !rebuild_) {
    auto m = readManifest(resume);
    if (!m.hasValue()) TROUPE_SETUP_ERROR("{}", m.status().message());
    manifest = std::move(*m);
  }
  auto spawnCopy = [&](int64_t shard, ps::ShardOptions::Start start, bool backup) {
    ps::ShardOptions o = so;
    o.shard = int(shard);
    o.start = start;
    o.backup = backup;
    if (mode == TrainMode::kPs) {  // the dense slice's initial weights: the model initialised as every worker does
      WorkerCore init(model);
      const auto slice = ps::denseSlice(init.denseParameters(), int(shard), servers);
      o.denseInit.assign(init.denseWeights() + slice.first, init.denseWeights() + slice.second);
    }
    if (manifest) {
      if (shard < 0 || shard >= int64_t(manifest->shards.size())) {
        TROUPE_SETUP_ERROR("{}: has {} shard files, none for shard {}", resume, manifest->shards.size(), shard);
      }
      const std::string path = resume + "/" + manifest->shards[size_t(shard)].file;
      auto image = ps::readShardImage(path);
      if (!image.hasValue()) TROUPE_SETUP_ERROR("{}", image.status().message());
      o.restore = std::make_shared<ps::ShardImage>(std::move(*image));
      logger("job")->info("ps {}: shard {} goes on from {}", rank, shard, path);
    }
    return ps::spawnShard(ctx.system, o);
  };
  if (!replicated_) {
    shard_ = spawnCopy(rank, ps::ShardOptions::Start::kServe, false);
    ctx.remote.publish(shard_, kShardName);
    return;
  }
  using Start = ps::ShardOptions::Start;
  const int64_t before = (rank + servers - 1) % servers;
  shard_ = spawnCopy(rank, rebuild_ ? Start::kAwaitImage : Start::kAwaitBackup, rebuild_);
  second_ = spawnCopy(before, rebuild_ ? Start::kAwaitImage : Start::kServe, true);
  ctx.remote.publish(shard_, kShardName);
  ctx.remote.publish(shard_, ps::shardCopyName(rank));
  ctx.remote.publish(second_, ps::shardCopyName(before));
  logger("job")->info("ps {}: copies of shards {} and {} ({})", rank, rank, before,
                      rebuild_ ? "backups, built from their primaries" : "primary and backup");
}

std::vector<actors::ChildSpec> PsRole::start(actors::MemberContext& ctx, const actors::Roster& roster) {
  std::vector<actors::ChildSpec> children{
      actors::ChildSpec{"shard", [shard = shard_](caf::actor_system&) { return shard; }, false}};
  if (!replicated_) return children;
  children.push_back(actors::ChildSpec{"backup", [shard = second_](caf::actor_system&) { return shard; }, false});
  if (!rebuild_) {
    // The primary's backup is the next process's copy of it.
    const int64_t rank = ctx.welcome.rank;
    const std::vector<uint64_t> nodes = roster.nodesOf("ps");
    if (int64_t(nodes.size()) != servers_) {
      TROUPE_SETUP_ERROR("the roster names {} ps processes; the job has {}", nodes.size(), servers_);
    }
    caf::anon_send(shard_, ps::replicate_atom::value, int64_t(nodes[size_t((rank + 1) % servers_)]),
                   ps::shardCopyName(rank), false);
  }
  return children;
}

}  // namespace troupe::workers
