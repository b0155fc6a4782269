#include "workers/worker_role.h"

#include <unistd.h>

#include <limits>
#include <thread>

#include <caf/all.hpp>

#include "collectives/compressed_allreduce.h"
#include "collectives/nccl_communicator.h"
#include "collectives/peer_watch.h"
#include "collectives/ring_communicator.h"
#include "common/check.h"
#include "common/hash.h"
#include "common/logging.h"
#include "kernels/kernels.h"
#include "ps/table_holder.h"
#include "ps/wire.h"
#include "transport/remote_actors.h"
#include "workers/checkpoint.h"
#include "workers/evaluator_actor.h"
#include "workers/residual_image.h"
#include "workers/job_messages.h"
#include "workers/job_setup.h"
#include "workers/loader_actor.h"
#include "workers/messages.h"
#include "workers/mlp.h"
#include "workers/model_image.h"
#include "workers/pipeline_actor.h"
#include "workers/ps_client.h"
#include "workers/training_job.h"
#include "workers/worker_actor.h"

namespace troupe::workers {
namespace {

using namespace std::chrono_literals;
using transport::DType;
using transport::Tensor;

// Drives the worker actor: starts its run, sends its result to the
// coordinator, and ends once the coordinator has it. Fails (and so
// escalates) with the worker's error. Stopped, it stops the worker first:
// the worker's core holds the communicator, which must go before the
// transport does.
// What the driver adds to the worker's report.
struct ReportFacts {
  int64_t rank = 0;
  int64_t datasetRows = 0;             // training rows per epoch
  int64_t resumedAt = 0, redone = 0;   // a replacement: where it resumed, steps it redid
  std::function<void(WorkerReport*)> traffic;  // fills the wire figures
};

// The bytes of each path this worker uses (WorkerReport::wirePaths): the
// transport's counts of the path's frames, and what the path's code handed
// it (tensor bytes encoded and in float32).
struct PathSources {
  transport::RemoteActors* remote = nullptr;
  std::shared_ptr<PsPathBytes> ps;  // ps and hybrid modes
  std::shared_ptr<collectives::CompressedAllReduce> allreduce;
  bool pushes = false, allreduces = false;
};

void addTraffic(const PathSources& src, WorkerReport* r) {
  const auto wire = src.remote->traffic();
  auto count = [&](const char* label) {
    auto it = wire.find(label);
    return it == wire.end() ? transport::RemoteActors::TrafficCount{} : it->second;
  };
  auto add = [&](const char* path, transport::RemoteActors::TrafficCount c, double encoded, double raw, double messages,
                 double compressed) {
    r->wirePaths.push_back(path);
    for (double f : {double(c.frames), double(c.bytes), encoded, raw, messages, compressed}) r->wireFigures.push_back(f);
  };
  if (src.pushes && src.ps) {
    const PsPathBytes& b = *src.ps;
    add("push", count("push"), double(b.pushEncoded), double(b.pushRaw), double(b.pushes), double(b.pushesCompressed));
    add("pull", count("pull-reply"), double(b.pullEncoded), double(b.pullRaw), double(b.pulls),
        double(b.pullsCompressed));
  }
  if (src.allreduces) {
    const auto st = src.allreduce ? src.allreduce->stats() : collectives::CompressionStats{};
    add("allreduce", count("allreduce"), st.encodedBytes, st.rawBytes, double(st.reductions), double(st.compressed));
  }
}

// Encoded / float32 over every path so far (1 with nothing sent).
double wireRatio(const PathSources& src) {
  double encoded = 0, raw = 0;
  if (src.ps) {
    encoded += double(src.ps->pushEncoded) + double(src.ps->pullEncoded);
    raw += double(src.ps->pushRaw) + double(src.ps->pullRaw);
  }
  if (src.allreduce) {
    const auto st = src.allreduce->stats();
    encoded += st.encodedBytes;
    raw += st.rawBytes;
  }
  return raw > 0 ? encoded / raw : 1.0;
}

struct DriverState {
  caf::actor worker;
  caf::actor coordinator;
  ReportFacts facts;
  bool workerDown = false;
  bool ending = false;  // it ends with `reason` once the worker is down
  caf::error reason;
  static inline const char* name = "worker_driver";
};

// Ends the driver with `reason` once the worker actor is gone (its core
// holds the communicator, which must go before the transport does).
void endDriver(caf::stateful_actor<DriverState>* self, caf::error reason) {
  auto& st = self->state;
  if (!st.ending) {
    st.ending = true;
    st.reason = std::move(reason);
  }
  if (st.workerDown) return self->quit(st.reason);
  if (st.reason) self->send_exit(st.worker, caf::exit_reason::user_shutdown);
}

caf::behavior driver(caf::stateful_actor<DriverState>* self, std::function<caf::actor()> spawnWorker,
                     caf::actor coordinator, ReportFacts facts) {
  auto& st = self->state;
  st.coordinator = std::move(coordinator);
  st.facts = facts;
  st.worker = spawnWorker();
  self->monitor(st.worker);
  self->set_down_handler([=](caf::down_msg& dm) {
    auto& st = self->state;
    if (dm.source != st.worker.address()) return;
    st.workerDown = true;
    if (st.ending) return self->quit(st.reason);
    if (dm.reason && dm.reason != caf::exit_reason::normal) return endDriver(self, dm.reason);
    // A normal end: its report is on its way (or here already).
  });
  self->set_exit_handler([=](caf::exit_msg& em) { endDriver(self, em.reason); });
  self->set_error_handler([=](caf::error& err) { endDriver(self, err); });
  self->send(st.worker, run_atom::value);
  return {
      // The actor it drives: what a fault plan's kill of actor "worker" kills
      // (the driver then ends with the worker's reason, and escalates).
      [=](actors::which_atom, const std::string&) { return self->state.worker; },
      [=](TrainReportPtr report) {
        auto& st = self->state;
        const bool evaluated = !report->evals.empty();
        const EvalResult eval = evaluated ? report->evals.back() : EvalResult{};
        WorkerReport r;
        r.rank = st.facts.rank;
        r.steps = report->steps;
        r.samples = report->samples;
        r.pushesAcked = report->pushesAcked;
        r.pulledRows = report->pulledRows;
        r.trainSeconds = report->trainSeconds;
        r.evalSeconds = report->evalSeconds;
        r.pullWaitSeconds = report->pullWaitSeconds;
        r.collectiveSeconds = report->collectiveSeconds;
        r.evaluated = evaluated;
        r.auc = eval.auc;
        r.loss = eval.loss;
        r.accuracy = eval.accuracy;
        r.rows = eval.rows;
        r.labels = Tensor::copyOf(eval.labels.data(), eval.labels.size() * 4, DType::kFloat32);
        r.predictions = Tensor::copyOf(eval.predictions.data(), eval.predictions.size() * 4, DType::kFloat32);
        r.datasetRows = st.facts.datasetRows;
        r.resumedAt = st.facts.resumedAt;
        r.stepsRedone = st.facts.redone;
        r.samplesApplied = report->samplesApplied;
        r.pushesAcknowledged = report->pushesAcknowledged;
        r.countChecked = eval.countChecked;
        r.countWrong = eval.countWrong;
        r.countErrors = eval.countErrors;
        if (st.facts.traffic) st.facts.traffic(&r);
        r.denseHash = hashBytes(std::string_view(reinterpret_cast<const char*>(report->denseWeights.data()),
                                                 report->denseWeights.size() * 4),
                                0);
        self->request(st.coordinator, 60s, std::move(r))
            .then([=](int64_t) { endDriver(self, caf::error()); },
                  [=](caf::error& err) {
                    endDriver(self, caf::make_error(actors::Errc::kMemberFailed,
                                                    "the coordinator did not take the report: " + actors::describe(err)));
                  });
      },
  };
}

// A child the role spawned already (the supervisor takes it as it is; it
// is not restarted in place).
actors::ChildSpec existing(std::string name, caf::actor a) {
  return actors::ChildSpec{std::move(name), [a](caf::actor_system&) { return a; }, false};
}

}  // namespace

WorkerRole::WorkerRole(int threads) : threads_(threads) {}
WorkerRole::~WorkerRole() = default;

int workerThreads(const Config& c, int requested) {
  if (requested > 0) return requested;
  const int64_t t = c.getInt("cluster.worker_threads");
  if (t > 0) return int(t);
  const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / int(std::max<int64_t>(1, c.getInt("cluster.workers"))));
}

void WorkerRole::prepare(actors::MemberContext&) {}

std::vector<actors::ChildSpec> WorkerRole::start(actors::MemberContext& ctx, const actors::Roster& roster) {
  const Config& config = ctx.config;
  const int64_t rank = ctx.welcome.rank;
  const int threads = workerThreads(config, threads_);
  logger("job")->info("worker {} (pid {}) on {} ({} compute threads)", rank, ::getpid(), ctx.remote.node().address(),
                      threads);
  auto kernels = std::shared_ptr<kernels::Kernels>(kernels::createKernels({kernels::Device::kCpu, threads}));
  const int64_t workers = config.getInt("cluster.workers");
  const TrainMode mode = trainMode(config);
  const int64_t servers = serverCount(config);
  const std::vector<uint64_t> shardNodes = roster.nodesOf("ps");
  const std::vector<uint64_t> workerNodes = roster.nodesOf("worker");
  if (int64_t(shardNodes.size()) != servers || int64_t(workerNodes.size()) != workers) {
    TROUPE_SETUP_ERROR("the roster names {} shards and {} workers; the job has {} and {}", shardNodes.size(),
                       workerNodes.size(), servers, workers);
  }
  WorkerCoreOptions model = modelOptions(config, threads);
  model.kernels = kernels;
  model.worker = rank;
  model.denseOnServers = mode == TrainMode::kPs;
  // A process that replaces a lost worker of a sync mode joins the group
  // the others form again (workers/worker_actor.h); its model comes from them.
  // A sync-mode worker that starts again from a checkpoint after a rollback
  // (its config names it) is not one: every rank does, and they form the
  // group anew.
  const bool rejoin = mode != TrainMode::kPs && ctx.welcome.incarnation > 0 &&
                      config.getString("checkpoint.resume").empty() && !config.getBool("cluster.fresh_start");
  bool regroupFirst = false;  // the first group failed as it formed
  // A pipeline across processes (train_command checked the job): rank r
  // runs stage r % p of replica r / p, and its ring is its stage group's,
  // the same stage of every replica.
  const PipelineConfig pipe = pipelineOf(config);
  const bool staged = pipe.any();
  const int stageOf = staged ? int(rank % pipe.stages) : 0, replicaOf = staged ? int(rank / pipe.stages) : 0;
  std::vector<uint64_t> ringNodes = workerNodes;
  if (staged) {
    // (train_command refused these before any process started; a launched
    // worker takes the coordinator's config.)
    if (mode != TrainMode::kAllReduce || model.kind != ModelKind::kMlp) {
      TROUPE_SETUP_ERROR("worker {}: a pipeline across processes runs the MLP in allreduce mode", rank);
    }
    if (workers != int64_t(pipe.stages) * pipe.replicas) {
      TROUPE_SETUP_ERROR("worker {}: a pipeline of {} stages x {} replicas needs as many worker processes; this job "
                         "has {}", rank, pipe.stages, pipe.replicas, workers);
    }
    ringNodes.clear();
    for (int d = 0; d < pipe.replicas; ++d) ringNodes.push_back(workerNodes[size_t(d * pipe.stages + stageOf)]);
  }
  collectives::RingOptions ro;
  ro.rank = staged ? replicaOf : int(rank);
  ro.nodes = ringNodes;
  ro.chunkBytes = size_t(positive(config, "collectives.chunk_kb")) << 10;
  ro.smallBytes = size_t(std::max<int64_t>(0, config.getInt("collectives.small_kb"))) << 10;
  ro.timeout = collectivesTimeout(config);
  ro.connectTimeout = std::chrono::seconds(config.getInt("cluster.start_timeout_s"));
  ro.spin = std::chrono::microseconds(std::max<int64_t>(0, config.getInt("collectives.spin_us")));
  std::string backend = "ring";
  if (mode != TrainMode::kPs && !rejoin) {
    const std::string requested = staged ? std::string("ring") : collectivesBackend(config);
    Tensor ncclId;
    int device = -1;
    if (requested != "ring") {
      // Every worker says whether it can use NCCL; rank 0 makes the id;
      // the coordinator decides for all and hands out rank 0's id.
      std::string why = collectives::ncclUnavailableReason();
      std::string id;
      if (why.empty() && rank == 0) {
        auto made = collectives::makeNcclId();
        if (made.hasValue()) {
          id = std::move(*made);
        } else {
          why = made.status().message();
        }
      }
      caf::scoped_actor self{ctx.system};
      std::string error;
      bool decided = false;
      self->request(ctx.coordinator, std::chrono::seconds(positive(config, "cluster.start_timeout_s")),
                    CommOffer{rank, int64_t(collectives::ncclDevices()), why,
                              Tensor::copyOf(id.data(), id.size(), DType::kBytes)})
          .receive(
              [&](CommChoice& c) {
                backend = std::move(c.backend);
                ncclId = std::move(c.ncclId);
                device = int(c.device);
                decided = true;
              },
              [&](caf::error& e) { error = actors::describe(e); });
      if (!decided) TROUPE_SETUP_ERROR("worker {}: no collectives backend: {}", rank, error);
    }
    const auto timeout = std::chrono::seconds(positive(config, "collectives.timeout_s"));
    const auto connectTimeout = std::chrono::seconds(config.getInt("cluster.start_timeout_s"));
    if (backend == "nccl") {
      peerWatch_ = std::make_unique<collectives::PeerWatch>(ctx.remote, workerNodes, int(rank));
      collectives::NcclOptions no;
      no.rank = int(rank);
      no.size = int(workers);
      no.device = device;
      no.id.assign(reinterpret_cast<const char*>(ncclId.data), size_t(ncclId.bytes));
      no.timeout = timeout;
      no.connectTimeout = connectTimeout;
      no.health = [watch = peerWatch_.get()] { return watch->status(); };
      auto nccl = collectives::createNcclCommunicator(std::move(no));
      if (!nccl.hasValue()) TROUPE_SETUP_ERROR("worker {}: the workers' communicator: {}", rank, nccl.status().message());
      comm_ = std::move(*nccl);
    } else {
      auto ring = collectives::RingCommunicator::create(ctx.remote, ro);
      const bool peerDown = !ring.hasValue() && ring.status().code() == Status::Code::kUnavailable;
      if (peerDown && workerLossPolicy(config) != WorkerLoss::kFail) {
        // A rank went down while the group formed: this worker waits, with
        // its model at step 0, for the group to form again with the
        // lost rank's replacement.
        logger("job")->warn("worker {}: the workers' communicator: {}; it waits for the group to form again", rank,
                            ring.status().message());
        regroupFirst = true;
      } else if (!ring.hasValue()) {
        TROUPE_SETUP_ERROR("worker {}: the workers' communicator: {}", rank, ring.status().message());
      } else {
        comm_ = std::move(*ring);
      }
    }
  }
  const CompressionConfig compression = compressionOf(config);
  // The transport counts each path's bytes (summary: wire bytes by path).
  ctx.remote.countMessages(ps::push_atom::value, "push");
  ctx.remote.countMessages(ps::pull_atom::value, "pull");
  if (mode != TrainMode::kPs) {
    model.comm = comm_;
    model.bucketBytes = positive(config, "train.bucket_kb") << 10;
    if (compression.allreduce.kind != kernels::CodecKind::kNone) {
      model.compression =
          std::make_shared<collectives::CompressedAllReduce>(compression.allreduce, compression.warmupSteps);
    }
    model.replicatedTables = mode == TrainMode::kAllReduce && model.kind != ModelKind::kMlp;
    model.keepPrevious = mode == TrainMode::kHybrid;
  }
  if (staged) {
    // Its stage actor, published for its neighbours and the model's
    // gathering, and linked to theirs once they answer.
    ProcessStageOptions so;
    so.stage.widths = model.mlpWidths;
    so.stage.cut = pipelineCut(pipe, model.mlpWidths);
    so.stage.stage = stageOf;
    so.stage.microBatches = pipe.microBatches;
    so.stage.schedule = pipe.schedule;
    so.stage.optimizer = model.denseOptimizer;
    so.stage.kernels = kernels;
    so.replica = replicaOf;
    so.replicas = pipe.replicas;
    for (int s = 0; s < pipe.stages; ++s) {
      const int64_t r = int64_t(replicaOf) * pipe.stages + s;
      so.replicaRanks.push_back(r);
      so.replicaStages.push_back(r == rank ? caf::actor()
                                           : ctx.remote.remoteActor(workerNodes[size_t(r)], pipelineStageName(r)));
    }
    so.stepTimeout = std::chrono::seconds(positive(config, "supervision.stall_timeout_s"));
    auto stage = std::make_shared<ProcessStage>(ctx.system, std::move(so));
    ctx.remote.publish(stage->actor(), pipelineStageName(rank));
    Status up = stage->connect(std::chrono::seconds(positive(config, "cluster.start_timeout_s")));
    if (!up.isOk()) TROUPE_SETUP_ERROR("worker {}: {}", rank, up.message());
    const auto slice = mlpStageSlice(model.mlpWidths, stage->local().options().cut, stageOf);
    logger("job")->info("worker {}: pipeline stage {} of replica {} ({} of the MLP's {} weights, from {})", rank,
                        stageOf, replicaOf, slice.second, Mlp::parameterCount(model.mlpWidths), slice.first);
    model.stage = std::move(stage);
  }
  // A worker resumes at the first step of its rank that not every shard
  // has: 0 in a new job; where a lost one left off (a step some shard has is
  // re-sent and applied there once); the cut of a checkpoint the job goes on
  // from.
  // ps.replicas = 2: each shard's primary may have moved (a backup took
  // over): the coordinator knows where each is.
  const bool replicated = servers > 0 && psReplicas(config) == 2;
  std::vector<uint64_t> primaryNodes = shardNodes;
  auto fetchRoutes = [&] {
    caf::scoped_actor self{ctx.system};
    std::string error;
    bool answered = false;
    self->request(ctx.coordinator, 30s, ps::routes_atom::value)
        .receive(
            [&](const std::vector<int64_t>& nodes) {
              answered = nodes.size() == shardNodes.size();
              if (!answered) error = fmt::format("{} nodes for {} shards", nodes.size(), shardNodes.size());
              for (size_t k = 0; answered && k < nodes.size(); ++k) primaryNodes[k] = uint64_t(nodes[k]);
            },
            [&](caf::error& e) { error = actors::describe(e); });
    if (!answered) TROUPE_SETUP_ERROR("worker {}: the coordinator did not say where the shards are: {}", rank, error);
  };
  if (replicated) fetchRoutes();
  auto shardActor = [&](size_t k) {
    return replicated ? ctx.remote.remoteActor(primaryNodes[k], ps::shardCopyName(int64_t(k)))
                      : ctx.remote.remoteActor(shardNodes[k], kShardName);
  };
  int64_t resumeAt = 0, redo = 0;
  if (mode == TrainMode::kPs || (mode == TrainMode::kHybrid && rejoin)) {
    caf::scoped_actor self{ctx.system};
    // With replicas a shard's primary may be going as this process starts
    // (stopped, or lost and its backup about to be promoted): it asks again,
    // where the coordinator says the primaries are now, until the job has
    // had time to find the loss (2 x the heartbeat timeout, and 30 s).
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::milliseconds(2 * config.getInt("transport.heartbeat_timeout_ms")) + 30s;
    int64_t furthest = 0;
    for (int attempt = 1;; ++attempt) {
      resumeAt = std::numeric_limits<int64_t>::max();
      furthest = 0;
      std::string error;
      size_t failedShard = 0;
      for (size_t s = 0; s < shardNodes.size() && error.empty(); ++s) {
        bool answered = false;
        self->request(shardActor(s), replicated ? 5s : 30s, ps::clock_atom::value, rank)
            .receive(
                [&](int64_t next) {
                  resumeAt = std::min(resumeAt, next);
                  furthest = std::max(furthest, next);
                  answered = true;
                },
                [&](caf::error& e) { error = actors::describe(e); });
        if (!answered) {
          failedShard = s;
          if (error.empty()) error = "no answer";
        }
      }
      if (error.empty()) break;
      if (!replicated || std::chrono::steady_clock::now() >= deadline) {
        TROUPE_SETUP_ERROR("worker {}: shard {} did not say where to resume: {}", rank, failedShard, error);
      }
      logger("job")->warn("worker {}: shard {} did not say where to resume ({}); asking again where the primaries are "
                          "(try {})",
                          rank, failedShard, error, attempt);
      std::this_thread::sleep_for(500ms);
      fetchRoutes();
    }
    redo = furthest - resumeAt;  // steps some shard has already: redone, applied there once
    if (mode == TrainMode::kPs && (resumeAt > 0 || redo > 0)) {
      logger("job")->info("worker {} (process {} of its rank) resumes at step {} ({} steps redone)", rank,
                          ctx.welcome.incarnation + 1, resumeAt, redo);
    }
  }
  // A sync-mode job resumed from a checkpoint: every rank goes on with the
  // group's model at the cut (a replacement copies it from the group).
  std::shared_ptr<ModelImage> resumedModel;
  std::string modelPath;  // its file
  const std::string resume = config.getString("checkpoint.resume");
  if (mode != TrainMode::kPs && !rejoin && !resume.empty()) {
    auto manifest = readManifest(resume);  // a sync job's lists exactly one model file
    if (!manifest.hasValue()) TROUPE_SETUP_ERROR("{}", manifest.status().message());
    modelPath = resume + "/" + manifest->models.at(0).file;
    auto image = readModelImage(modelPath);
    if (!image.hasValue()) TROUPE_SETUP_ERROR("{}", image.status().message());
    resumedModel = std::make_shared<ModelImage>(std::move(*image));
    resumeAt = resumedModel->step;
    logger("job")->info("worker {}: goes on from {} (step {}, epoch {}, from its batch {})", rank, modelPath, resumeAt,
                        resumedModel->epoch, resumedModel->epochBatch);
  }
  DataSources data = openData(config, threads);
  const int64_t datasetRows = data.train->rowsPerEpoch();
  if (model.kind == ModelKind::kCount) model.countScale = countScale(config, datasetRows);
  auto core = std::make_shared<std::unique_ptr<WorkerCore>>(std::make_unique<WorkerCore>(model));
  if (mode == TrainMode::kPs) (*core)->resumeAt(resumeAt);
  if (resumedModel) {
    WorkerCore& c = **core;
    const bool tables = model.replicatedTables;
    Status fits = checkModelImage(*resumedModel, modelPath, workers, c.denseParameters(),
                                  c.denseStateFloats(), tables ? model.dlrm.numTables : 0);
    if (!fits.isOk()) TROUPE_SETUP_ERROR("{}", fits.message());
    std::copy(resumedModel->dense.begin(), resumedModel->dense.end(), c.denseState());
    c.setPosition(resumedModel->step, resumedModel->samplesApplied);
    c.denseStateLoaded();
  }
  // Compression with error feedback, resumed from a checkpoint: what this
  // rank's codecs held back at the cut (its own file), so that it sends
  // what the uninterrupted job would have. The first process of a rank
  // refuses a file that does not fit; a later one (a sync group's rollback
  // names the checkpoint it goes back to) starts with no residuals instead,
  // saying why, and so does a ps-mode replacement (its config names the
  // checkpoint the job was resumed from, which may be gone by now).
  std::shared_ptr<const ResidualImage> residuals;
  const bool pushCompressed = mode != TrainMode::kAllReduce && compression.push.kind != kernels::CodecKind::kNone;
  const bool reduceCompressed = model.compression != nullptr;
  if (!resume.empty() && !rejoin && (pushCompressed || reduceCompressed) &&
      (mode != TrainMode::kPs || ctx.welcome.incarnation == 0)) {
    auto load = [&]() -> Expected<std::shared_ptr<const ResidualImage>> {
      auto manifest = readManifest(resume);
      if (!manifest.hasValue()) return manifest.status();
      const size_t r = size_t(rank);
      if (r >= manifest->residuals.size() || manifest->residuals[r].file.empty()) {
        return std::shared_ptr<const ResidualImage>();
      }
      const std::string path = resume + "/" + manifest->residuals[r].file;
      auto image = readResidualImage(path);
      if (!image.hasValue()) return image.status();
      std::vector<int64_t> dims, slices;
      for (const auto& t : tableOptions(config, model)) dims.push_back(t.dim);
      const int64_t denseOnShards = mode == TrainMode::kPs ? (*core)->denseParameters() : 0;
      for (int64_t k = 0; k < servers; ++k) {
        const auto slice = ps::denseSlice(denseOnShards, int(k), int(servers));
        slices.push_back(slice.second - slice.first);
      }
      Status fits = checkResidualImage(*image, path, rank, resumeAt, dims, slices);
      if (!fits.isOk()) return fits;
      // Residuals mean something only to the codec that kept them.
      if (image->pushCodec != uint8_t(compression.push.kind)) {
        logger("job")->info("worker {}: {} holds push residuals of codec {}; this job's is {}: its pushes start with "
                            "none", rank, path, kernels::codecName(kernels::CodecKind(image->pushCodec)),
                            kernels::codecName(compression.push.kind));
        image->pushDense.clear();
        image->pushRows.clear();
      }
      const auto reduceKind = reduceCompressed ? model.compression->kind() : kernels::CodecKind::kNone;
      if (image->allreduceCodec != uint8_t(reduceKind)) {
        logger("job")->info("worker {}: {} holds all-reduce residuals of codec {}; this job's is {}: its all-reduce "
                            "starts with none", rank, path,
                            kernels::codecName(kernels::CodecKind(image->allreduceCodec)), kernels::codecName(reduceKind));
        image->allreduce.clear();
      }
      if (reduceCompressed) {
        Status s = model.compression->restoreResiduals(image->allreduce);
        if (!s.isOk()) return Status::corruption(fmt::format("{}: {}", path, s.message()));
      }
      logger("job")->info("worker {}: its codecs go on with the residuals of {}", rank, path);
      return std::shared_ptr<const ResidualImage>(std::make_shared<ResidualImage>(std::move(*image)));
    };
    auto loaded = load();
    if (loaded.hasValue() && *loaded) {
      residuals = std::move(*loaded);
    } else if (loaded.hasValue()) {
      logger("job")->info("worker {}: {} holds no residuals for it: its codecs start with none", rank, resume);
    } else if (ctx.welcome.incarnation == 0) {
      TROUPE_SETUP_ERROR("{}", loaded.status().message());
    } else {
      logger("job")->warn("worker {}: its codecs start with no residuals: {}", rank, loaded.status().message());
    }
  }
  const EvalSchedule evalSchedule = evalScheduleOf(config, model.kind);
  const bool evaluates = evalSchedule.any() && rank == 0;
  caf::actor client;
  caf::actor evalClient;  // the evaluator's pulls: not in this worker's traffic figures
  if (mode != TrainMode::kAllReduce) {
    PsClientOptions co;
    co.worker = rank;
    for (size_t k = 0; k < shardNodes.size(); ++k) co.shards.push_back(shardActor(k));
    if (replicated) {
      co.replicated = true;
      co.nodes = primaryNodes;
      co.locate = [&remote = ctx.remote](uint64_t node, const std::string& name) { return remote.remoteActor(node, name); };
      co.coordinator = ctx.coordinator;
      co.rerouteTimeout = std::chrono::seconds(2 * config.getInt("transport.heartbeat_timeout_ms") / 1000 + 30);
    }
    for (const auto& t : tableOptions(config, model)) co.dims.push_back(t.dim);
    co.denseSize = mode == TrainMode::kPs ? (*core)->denseParameters() : 0;
    co.requestTimeout = pullWaitBound(config) + std::chrono::seconds(20);
    co.generation = config.getInt("cluster.generation");
    co.pushCodec = compression.push;
    co.pullCodec = compression.pull;
    co.warmupSteps = compression.warmupSteps;
    co.maxResidualRows = compression.residualRows;
    co.bytes = psBytes_;
    co.resumedResiduals = residuals;
    client = spawnPsClient(ctx.system, co);
    if (evaluates) {
      co.bytes = nullptr;
      co.resumedResiduals = nullptr;
      evalClient = spawnPsClient(ctx.system, co);
    }
    // The coordinator names a shard's new primary here (route_atom).
    if (replicated) ctx.remote.publish(client, psClientName(rank));
  } else if ((*core)->hasTables()) {
    ps::TableHolderOptions ho;
    ho.tables = tableOptions(config, model);
    ho.kernels = kernels;
    client = ps::spawnTableHolder(ctx.system, ho);  // this rank's replica of the tables
    if (resumedModel) {
      caf::scoped_actor self{ctx.system};
      std::string error;
      const ps::TableImagesPtr tables = resumedModel->tables ? resumedModel->tables
                                                             : std::make_shared<const std::vector<ps::TableImage>>();
      self->request(client, 120s, ps::load_atom::value, tables, rank, resumedModel->step)
          .receive([](int64_t) {}, [&](caf::error& e) { error = actors::describe(e); });
      if (!error.empty()) TROUPE_SETUP_ERROR("{}: the tables do not load: {}", modelPath, error);
    }
  }
  const int prefetch = int(positive(config, "data.prefetch"));
  // (Every stage of a pipeline reads every batch; each replica takes its share of the rows.)
  std::shared_ptr<BatchSource> share = staged ? everyNthBatch(data.train, 0, 1) : everyNthBatch(data.train, rank, workers);
  DataDivision division{0, 0, staged ? 1 : workers};
  if (resumedModel) {
    // The ranks divide what is left of the cut's epoch.
    division = DataDivision{resumedModel->epoch, resumedModel->epochBatch, staged ? 1 : workers};
    Status s = staged ? share->reshare(division.epoch, division.fromBatch, 0, 1)
                      : share->reshare(division.epoch, division.fromBatch, rank, workers);
    if (!s.isOk()) TROUPE_SETUP_ERROR("{}: {}", modelPath, s.message());
  }
  // Evaluations during training: rank 0's evaluator (it reads the test set
  // now, before the test loader does).
  caf::actor evaluator;
  if (evaluates) {
    EvaluatorOptions eo;
    eo.core = model;
    eo.test = data.test;
    eo.tables = evalClient ? evalClient : client;
    eo.requestTimeout = pullWaitBound(config) + std::chrono::seconds(30);
    eo.rank = rank;
    eo.onPoint = [coord = ctx.coordinator](const EvalPoint& p) { caf::anon_send(coord, p); };
    evaluator = spawnEvaluator(ctx.system, std::move(eo));
  }
  auto trainLoader = spawnLoader(ctx.system, share, prefetch);
  auto testLoader = spawnLoader(ctx.system, data.test, prefetch);
  WorkerOptions wo;
  wo.core = model;
  wo.pushResiduals = mode != TrainMode::kAllReduce && compression.push.kind != kernels::CodecKind::kNone;
  wo.epochs = positive(config, "train.epochs");
  // The dense learning rate decays per epoch: applied by the workers in the
  // sync modes, and sent with every push in ps mode, where the shards hold
  // the dense optimizer.
  if (model.kind != ModelKind::kCount) wo.lrDecayPerEpoch = config.getFloat("train.lr_decay");
  wo.maxSteps = config.getInt("train.max_steps");
  wo.progressEverySteps = positive(config, "train.progress_every");
  wo.evaluateEachEpoch = false;
  wo.evalGate = ctx.coordinator;
  wo.evaluator = evaluator;
  wo.evalSchedule = evalSchedule;
  wo.skipBatches = mode == TrainMode::kPs ? resumeAt : 0;
  wo.division = division;
  if (resumedModel) wo.startEpoch = resumedModel->epoch;  // its share starts at the cut
  // The core holds the communicator; the options must not (a group formed
  // again replaces it, and the old one must go first).
  wo.core.comm.reset();
  wo.core.stage.reset();  // (the stage goes with the core, before the transport)
  // A pull waits at a shard at most pullWaitBound (the shard then fails it,
  // naming whom it waited for); the requests allow for that.
  wo.requestTimeout = pullWaitBound(config) + std::chrono::seconds(30);
  // The fault plan's step-triggered faults of this rank hit its first
  // process only (a replacement redoing those steps is not hit again).
  if (ctx.welcome.incarnation == 0) {
    wo.faults = actors::parseFaultPlan(config, workers, servers).stepFaultsOf(rank);
  }
  wo.faultRecorder = ctx.coordinator;
  wo.firedAs = actors::FaultFired{0, "worker", rank, ctx.welcome.incarnation, 0};
  wo.progressInterval = std::chrono::seconds(1);
  if (staged) {
    // A lost peer is the coordinator's to handle (it restarts every stage,
    // or ends the job): it finds the loss within the heartbeat timeout.
    wo.awaitRestart = std::chrono::seconds(2 * config.getInt("transport.heartbeat_timeout_ms") / 1000 + 30);
  }
  if (mode != TrainMode::kPs && backend == "ring" && !staged) {
    wo.regroup.leave = [this] { comm_.reset(); };
    // The nodes of the group it was in last: one its transport found down
    // is named when it is ready for the next.
    auto group = std::make_shared<std::vector<uint64_t>>(workerNodes);
    wo.regroup.unreachable = [group, &remote = ctx.remote, self = workerNodes[size_t(rank)]] {
      std::vector<uint64_t> down;
      for (uint64_t node : *group) {
        if (node != self && node != 0 && remote.peerDown(node)) down.push_back(node);
      }
      return down;
    };
    wo.regroup.join = [this, &remote = ctx.remote, ro, self = workerNodes[size_t(rank)], group](
                          uint64_t epoch, const std::vector<uint64_t>& nodes)
        -> Expected<std::shared_ptr<collectives::Communicator>> {
      *group = nodes;
      collectives::RingOptions o = ro;
      o.epoch = epoch;
      o.nodes = nodes;
      // Its rank in the group: where its node is (a group that shrank has fewer ranks than the job).
      const auto at = std::find(nodes.begin(), nodes.end(), self);
      if (at == nodes.end()) return Status::internal("the group formed again without this worker's node");
      o.rank = int(at - nodes.begin());
      auto ring = collectives::RingCommunicator::create(remote, o);
      if (!ring.hasValue()) return ring.status();
      comm_ = std::shared_ptr<collectives::Communicator>(std::move(*ring));
      return comm_;
    };
    wo.regroup.coordinator = ctx.coordinator;
    wo.regroup.timeout = std::chrono::duration_cast<std::chrono::seconds>(wo.requestTimeout);
    wo.regroup.rejoin = rejoin;
    wo.regroup.first = regroupFirst;
    wo.regroup.incarnation = ctx.welcome.incarnation;
    wo.regroup.shardClock = mode == TrainMode::kHybrid && rejoin ? resumeAt : -1;
  }
  PathSources paths{&ctx.remote, psBytes_, model.compression, mode != TrainMode::kAllReduce, mode != TrainMode::kPs};
  wo.onEvent = [coord = ctx.coordinator, rank, paths](const WorkerEvent& e) {
    if (e.kind != WorkerEvent::Kind::kProgress) return;
    caf::anon_send(coord, Progress{rank, e.epoch, e.step, e.epochRows, e.rowsPerEpoch, e.meanLoss, e.samplesPerSec,
                                   wireRatio(paths), e.mailbox});
  };
  std::vector<actors::ChildSpec> children = {existing("train-loader", trainLoader),
                                             existing("test-loader", testLoader)};
  if (client) children.push_back(existing("tables", client));
  if (evalClient) children.push_back(existing("evaluator-tables", evalClient));
  if (evaluator) children.push_back(existing("evaluator", evaluator));
  auto spawnWorker = [&system = ctx.system, &remote = ctx.remote, wo, core, trainLoader, testLoader, client, rank]() {
    auto w = workers::spawnWorker(system, wo, std::move(*core), trainLoader, testLoader, client);
    remote.publish(w, trainerName(rank));  // the coordinator pauses it for checkpoints
    return w;
  };
  children.push_back(actors::ChildSpec{"worker",
                                       [spawnWorker, coord = ctx.coordinator,
                                        facts = ReportFacts{rank, datasetRows, resumeAt, redo,
                                                            [paths](WorkerReport* r) { addTraffic(paths, r); }}](
                                           caf::actor_system& sys) {
                                         return sys.spawn(driver, spawnWorker, coord, facts);
                                       },
                                       false});
  return children;
}

void WorkerRole::release() {
  comm_.reset();
  peerWatch_.reset();
}

}  // namespace troupe::workers
