#include "workers/ps_role.h"

#include <unistd.h>

#include <caf/all.hpp>

#include "common/logging.h"
#include "kernels/kernels.h"
#include "ps/shard.h"
#include "ps/shard_image.h"
#include "transport/remote_actors.h"
#include "workers/checkpoint.h"
#include "workers/job_setup.h"
#include "workers/training_job.h"
#include "workers/worker_core.h"

namespace troupe::workers {

void PsRole::prepare(actors::MemberContext& ctx) {
  const Config& config = ctx.config;
  const int64_t rank = ctx.welcome.rank;
  const int threads = threads_ > 0 ? threads_ : int(std::max<int64_t>(1, config.getInt("cluster.server_threads")));
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
  // The dense slice's initial weights: the model initialised as every worker does.
  if (mode == TrainMode::kPs) {
    WorkerCore init(model);
    const auto slice = ps::denseSlice(init.denseParameters(), int(rank), servers);
    so.denseInit.assign(init.denseWeights() + slice.first, init.denseWeights() + slice.second);
  }
  so.denseOptimizer = model.denseOptimizer;
  auto consistency = ps::parseConsistency(config.getString("ps.consistency"));
  if (!consistency.hasValue()) TROUPE_SETUP_ERROR("config: ps.consistency: {}", consistency.status().message());
  so.consistency = *consistency;
  so.staleness = config.getInt("ps.staleness");
  so.parkTimeout = pullWaitBound(config);
  so.generation = config.getInt("cluster.generation");
  so.groupTrains = trainMode(config) != TrainMode::kPs;
  so.undoWholeSteps = trainMode(config) == TrainMode::kHybrid && workerLossPolicy(config) == WorkerLoss::kShrink;
  so.kernels = kernels;
  // A resumed job (or a rolled-back shard): the checkpoint's image of this shard.
  const std::string resume = config.getString("checkpoint.resume");
  if (!resume.empty()) {
    auto manifest = readManifest(resume);
    if (!manifest.hasValue()) TROUPE_SETUP_ERROR("{}", manifest.status().message());
    if (rank < 0 || rank >= int64_t(manifest->shards.size())) {
      TROUPE_SETUP_ERROR("{}: has {} shard files, none for ps {}", resume, manifest->shards.size(), rank);
    }
    const std::string path = resume + "/" + manifest->shards[size_t(rank)].file;
    auto image = ps::readShardImage(path);
    if (!image.hasValue()) TROUPE_SETUP_ERROR("{}", image.status().message());
    so.restore = std::make_shared<ps::ShardImage>(std::move(*image));
    logger("job")->info("ps {}: goes on from {}", rank, path);
  }
  shard_ = ps::spawnShard(ctx.system, so);
  ctx.remote.publish(shard_, kShardName);
}

std::vector<actors::ChildSpec> PsRole::start(actors::MemberContext&, const actors::Roster&) {
  return {actors::ChildSpec{"shard", [shard = shard_](caf::actor_system&) { return shard; }, false}};
}

}  // namespace troupe::workers
