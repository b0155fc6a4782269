#include "apps/job.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <thread>

#include <caf/all.hpp>

#include "apps/job_protocol.h"
#include "apps/job_setup.h"
#include "apps/process_util.h"
#include "collectives/nccl_communicator.h"
#include "collectives/peer_watch.h"
#include "collectives/ring_communicator.h"
#include "common/check.h"
#include "common/hash.h"
#include "common/logging.h"
#include "kernels/kernels.h"
#include "ps/shard.h"
#include "ps/table_holder.h"
#include "ps/wire.h"
#include "transport/remote_actors.h"
#include "workers/loader_actor.h"
#include "workers/messages.h"
#include "workers/ps_client.h"
#include "workers/worker_actor.h"

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<troupe::apps::JobOutcome>)

namespace troupe::apps {
namespace {

using namespace std::chrono_literals;
using transport::DType;
using transport::Tensor;
using JobOutcomePtr = std::shared_ptr<JobOutcome>;

// ------------------------------------------------------------------ coordinator

struct Proc {
  std::string role;
  int64_t rank = 0;
  uint64_t node = 0;  // 0: not joined
  std::string address;
  bool ready = false;
  bool done = false;  // a worker that reported done
  bool lost = false;
  caf::actor proxy;   // its "process" actor, monitored
};

struct CoordinatorState {
  std::unique_ptr<CoordinatorOptions> options_;
  CoordinatorOptions& options() { return *options_; }
  transport::RemoteActors* remote = nullptr;
  int workers = 0, servers = 0;
  ps::Consistency consistency = ps::Consistency::kBsp;
  TrainMode mode = TrainMode::kPs;
  std::string toml;
  std::vector<Proc> ps, wk;
  std::vector<caf::typed_response_promise<Tensor>> readyWaiters;
  // The workers' choice of collectives backend (commid_atom).
  std::string backend = "ring";  // collectives.backend
  std::vector<std::pair<int64_t, caf::typed_response_promise<std::string, Tensor, int64_t>>> commWaiters;
  std::vector<bool> commAsked;
  std::vector<int64_t> commDevices;  // per worker: CUDA devices it can use
  std::vector<std::string> commWhy;  // per worker: why it cannot use NCCL
  Tensor commId;
  std::map<int64_t, caf::typed_response_promise<bool>> gateWaiters;
  bool gateOpen = false;
  bool finishing = false;
  bool finished = false;
  std::vector<double> workerRate;
  JobOutcomePtr outcome = std::make_shared<JobOutcome>();
  caf::typed_response_promise<JobOutcomePtr> result;
  bool haveResult = false;
  std::shared_ptr<spdlog::logger> log = logger("job");
  static inline const char* name = "coordinator";
};

using Coord = caf::stateful_actor<CoordinatorState>;

std::string describe(const Proc& p) {
  return fmt::format("{} {}{}", p.role, p.rank, p.address.empty() ? "" : fmt::format(" ({})", p.address));
}

void deliver(Coord* self) {
  auto& st = self->state;
  if (st.finished) return;
  st.finished = true;
  for (auto* list : {&st.ps, &st.wk}) {
    for (auto& p : *list) {
      if (p.proxy && !p.lost) self->send(p.proxy, shutdown_atom::value);
    }
  }
  for (auto& [rank, w] : st.gateWaiters) w.deliver(false);
  st.gateWaiters.clear();
  if (st.haveResult) st.result.deliver(st.outcome);
}

void fail(Coord* self, const std::string& why) {
  auto& st = self->state;
  if (st.finished) return;
  st.log->error("job failed: {}", why);
  st.outcome->ok = false;
  st.outcome->error = why;
  for (auto& w : st.readyWaiters) w.deliver(caf::make_error(caf::sec::runtime_error, "the job failed: " + why));
  st.readyWaiters.clear();
  for (auto& [rank, w] : st.commWaiters) w.deliver(caf::make_error(caf::sec::runtime_error, "the job failed: " + why));
  st.commWaiters.clear();
  deliver(self);
}

bool everyoneReady(const CoordinatorState& st) {
  for (const auto* list : {&st.ps, &st.wk}) {
    for (const auto& p : *list) {
      if (!p.ready) return false;
    }
  }
  return true;
}

void finalize(Coord* self) {
  auto& st = self->state;
  if (st.finishing || st.finished) return;
  st.finishing = true;
  if (!st.outcome->evaluated) return fail(self, "every worker finished, but none evaluated the model (the evaluating worker was lost)");
  if (st.servers == 0) {
    st.outcome->ok = true;
    return deliver(self);
  }
  // Shard counters, then shut down.
  auto left = std::make_shared<int>(st.servers);
  st.outcome->shards.assign(size_t(st.servers), ShardSummary{});
  for (int s = 0; s < st.servers; ++s) {
    auto shard = st.remote->remoteActor(st.ps[size_t(s)].node, kShardActor);
    self->request(shard, 10s, ps::stats_atom::value)
        .then(
            [=](int64_t rows, int64_t pushes, int64_t dups, int64_t served, int64_t delayed, int64_t lead) {
              auto& sum = self->state.outcome->shards[size_t(s)];
              sum = ShardSummary{s, rows, pushes, dups, served, delayed, lead};
              if (--*left == 0) {
                self->state.outcome->ok = true;
                deliver(self);
              }
            },
            [=](caf::error& err) {
              fail(self, fmt::format("ps {} did not report its counters: {}", s, caf::to_string(err)));
            });
  }
}

void checkGate(Coord* self) {
  auto& st = self->state;
  if (st.gateOpen || st.finished) return;
  int64_t lead = -1;
  for (const auto& w : st.wk) {
    if (w.lost || w.done) continue;
    if (!st.gateWaiters.count(w.rank)) return;  // someone still training
    if (lead < 0) lead = w.rank;
  }
  if (st.gateWaiters.empty()) return;
  st.gateOpen = true;
  st.log->info("every worker finished training; worker {} evaluates the model", lead);
  for (auto& [rank, promise] : st.gateWaiters) promise.deliver(rank == lead);
  st.gateWaiters.clear();
}

void checkDone(Coord* self) {
  auto& st = self->state;
  int live = 0;
  for (const auto& w : st.wk) {
    if (w.lost) continue;
    ++live;
    if (!w.done) return;
  }
  if (live == 0) return fail(self, "every worker was lost");
  finalize(self);
}

void onLost(Coord* self, Proc& p, const caf::error& reason) {
  auto& st = self->state;
  if (p.lost || st.finished) return;
  p.lost = true;
  const std::string what = fmt::format("{} is down ({})", describe(p), caf::to_string(reason));
  st.outcome->events.push_back(what);
  if (p.role == "ps") return fail(self, what + "; its shard of the model is gone");
  if (p.done) {
    st.log->info("{} after it finished", what);
    return;
  }
  if (st.mode != TrainMode::kPs) {
    return fail(self, fmt::format("{}; {} training cannot take a step without every worker", what,
                                  trainModeName(st.mode)));
  }
  if (st.consistency == ps::Consistency::kBsp) {
    return fail(self, what + "; BSP cannot take a step without every worker");
  }
  st.log->warn("{}; the other workers go on without it ({})", what, ps::consistencyName(st.consistency));
  for (const auto& s : st.ps) {
    if (s.node) {
      self->request(st.remote->remoteActor(s.node, kShardActor), 10s, ps::leave_atom::value, p.rank)
          .then([](int64_t) {}, [](caf::error&) {});  // a lost shard ends the job on its own
    }
  }
  st.gateWaiters.erase(p.rank);
  checkGate(self);
  checkDone(self);
}

caf::behavior coordinator(Coord* self, CoordinatorOptions options, transport::RemoteActors* remote) {
  auto& st = self->state;
  st.options_ = std::make_unique<CoordinatorOptions>(std::move(options));
  st.remote = remote;
  st.workers = int(st.options().config.getInt("cluster.workers"));
  st.mode = trainMode(st.options().config);
  st.servers = int(serverCount(st.options().config));
  st.consistency = *ps::parseConsistency(st.options().config.getString("ps.consistency"));
  st.toml = st.options().config.toToml();
  st.backend = collectivesBackend(st.options().config);
  st.commAsked.assign(size_t(st.workers), false);
  st.commWhy.assign(size_t(st.workers), std::string());
  st.commDevices.assign(size_t(st.workers), 0);
  if (st.mode != TrainMode::kPs) st.outcome->collectivesBackend = "ring";
  for (int i = 0; i < st.servers; ++i) st.ps.push_back(Proc{"ps", i});
  for (int i = 0; i < st.workers; ++i) st.wk.push_back(Proc{"worker", i});
  st.workerRate.assign(size_t(st.workers), 0.0);
  st.outcome->workers.resize(size_t(st.workers));
  for (int i = 0; i < st.workers; ++i) st.outcome->workers[size_t(i)].rank = i;
  self->set_error_handler([=](caf::error& err) {
    self->state.log->warn("coordinator: ignored an error message: {}", caf::to_string(err));
  });
  self->set_default_handler([=](caf::scheduled_actor*, caf::message_view& x) -> caf::result<caf::message> {
    self->state.log->warn("coordinator: refused an unknown message {}", caf::to_string(x.content()));
    return caf::sec::unexpected_message;
  });
  self->set_down_handler([=](caf::down_msg& dm) {
    for (auto* list : {&self->state.ps, &self->state.wk}) {
      for (auto& p : *list) {
        if (p.proxy && p.proxy.address() == dm.source) onLost(self, p, dm.reason);
      }
    }
  });
  self->delayed_send(self, std::chrono::seconds(st.options().config.getInt("cluster.start_timeout_s")),
                     deadline_atom::value);
  return {
      [=](workers::run_atom) -> caf::typed_response_promise<JobOutcomePtr> {
        auto& st = self->state;
        st.result = self->make_response_promise<JobOutcomePtr>();
        st.haveResult = true;
        if (st.finished) st.result.deliver(st.outcome);
        return st.result;
      },
      [=](abort_atom, const std::string& why) { fail(self, why); },
      [=](deadline_atom) {
        auto& st = self->state;
        if (st.finished || everyoneReady(st)) return;
        std::vector<std::string> missing;
        for (const auto* list : {&st.ps, &st.wk}) {
          for (const auto& p : *list) {
            if (!p.ready) missing.push_back(fmt::format("{} {}{}", p.role, p.rank, p.node ? " (joined)" : ""));
          }
        }
        fail(self, fmt::format("not every process was ready within cluster.start_timeout_s = {} s; missing: {}",
                               st.options().config.getInt("cluster.start_timeout_s"), fmt::join(missing, ", ")));
      },
      [=](hello_atom, const std::string& role, int64_t requested, uint64_t node,
          const std::string& address) -> caf::result<int64_t, std::string> {
        auto& st = self->state;
        if (st.finished) return caf::make_error(caf::sec::runtime_error, "the job is over: " + st.outcome->error);
        std::vector<Proc>* list = role == "ps" ? &st.ps : role == "worker" ? &st.wk : nullptr;
        if (!list) return caf::make_error(caf::sec::invalid_argument, fmt::format("no such role '{}'", role));
        Proc* slot = nullptr;
        if (requested >= 0 && requested < int64_t(list->size()) && (*list)[size_t(requested)].node == 0) {
          slot = &(*list)[size_t(requested)];
        }
        for (auto& p : *list) {
          if (!slot && p.node == 0) slot = &p;
        }
        if (!slot) {
          return caf::make_error(caf::sec::invalid_argument,
                                 fmt::format("the job has {} {} processes and every rank is taken", list->size(), role));
        }
        slot->node = node;
        slot->address = address;
        slot->proxy = st.remote->remoteActor(node, kProcessActor);
        self->monitor(slot->proxy);
        st.log->info("{} joined", describe(*slot));
        return {slot->rank, st.toml};
      },
      [=](ready_atom, const std::string& role, int64_t rank) -> caf::typed_response_promise<Tensor> {
        auto& st = self->state;
        auto promise = self->make_response_promise<Tensor>();
        std::vector<Proc>* list = role == "ps" ? &st.ps : &st.wk;
        if (rank < 0 || rank >= int64_t(list->size()) || st.finished) {
          promise.deliver(caf::make_error(caf::sec::invalid_argument, fmt::format("{} {} is not in the job", role, rank)));
          return promise;
        }
        (*list)[size_t(rank)].ready = true;
        st.readyWaiters.push_back(promise);
        if (everyoneReady(st)) {
          std::vector<uint64_t> nodes;
          for (const auto& p : st.ps) nodes.push_back(p.node);
          for (const auto& p : st.wk) nodes.push_back(p.node);
          Tensor t = Tensor::copyOf(nodes.data(), nodes.size() * 8, DType::kUInt64);
          st.log->info("all {} processes are ready; training starts ({} mode, {}, {} workers, {} shards)",
                       st.workers + st.servers, trainModeName(st.mode), ps::consistencyName(st.consistency),
                       st.workers, st.servers);
          for (auto& w : st.readyWaiters) w.deliver(t);
          st.readyWaiters.clear();
        }
        return promise;
      },
      [=](commid_atom, int64_t rank, int64_t devices, const std::string& unavailable,
          Tensor& id) -> caf::typed_response_promise<std::string, Tensor, int64_t> {
        auto& st = self->state;
        auto promise = self->make_response_promise<std::string, Tensor, int64_t>();
        if (rank < 0 || rank >= st.workers || st.finished || st.commAsked[size_t(rank)]) {
          promise.deliver(caf::make_error(caf::sec::invalid_argument,
                                          fmt::format("worker {} may not ask for the collectives' id now", rank)));
          return promise;
        }
        st.commAsked[size_t(rank)] = true;
        st.commWhy[size_t(rank)] = unavailable;
        st.commDevices[size_t(rank)] = devices;
        if (rank == 0) st.commId = std::move(id);
        st.commWaiters.emplace_back(rank, promise);
        if (std::find(st.commAsked.begin(), st.commAsked.end(), false) != st.commAsked.end()) return promise;
        // NCCL takes one device per rank: the workers of a host take its
        // devices in rank order, and a host with more workers than devices
        // cannot use NCCL.
        std::vector<int64_t> device(size_t(st.workers));
        std::map<std::string, std::vector<int>> hosts;
        for (int w = 0; w < st.workers; ++w) {
          const std::string& a = st.wk[size_t(w)].address;
          hosts[a.substr(0, a.rfind(':'))].push_back(w);
        }
        for (const auto& [host, ranks] : hosts) {
          for (size_t i = 0; i < ranks.size(); ++i) {
            const int w = ranks[i];
            device[size_t(w)] = int64_t(i);
            if (st.commWhy[size_t(w)].empty() && int64_t(i) >= st.commDevices[size_t(w)]) {
              st.commWhy[size_t(w)] = fmt::format("{} workers on host {} share its {} CUDA device(s), NCCL takes one each",
                                                  ranks.size(), host, st.commDevices[size_t(w)]);
            }
          }
        }
        std::string backend = "nccl";
        for (int w = 0; w < st.workers && backend == "nccl"; ++w) {
          const std::string& why = st.commWhy[size_t(w)];
          if (why.empty()) continue;
          if (st.backend == "nccl") {
            fail(self, fmt::format("collectives.backend = nccl, but worker {} cannot use NCCL: {}", w, why));
            return promise;
          }
          st.log->info("collectives.backend = auto: the workers use the ring, since worker {} cannot use NCCL ({})",
                       w, why);
          backend = "ring";
        }
        if (backend == "nccl" && st.commId.bytes != collectives::kNcclIdBytes) {
          fail(self, fmt::format("worker 0 sent an NCCL id of {} bytes, not {}", st.commId.bytes,
                                 collectives::kNcclIdBytes));
          return promise;
        }
        if (backend == "nccl") st.log->info("the {} workers use NCCL for their collectives", st.workers);
        st.outcome->collectivesBackend = backend;
        for (auto& [r, w] : st.commWaiters) w.deliver(backend, st.commId, device[size_t(r)]);
        st.commWaiters.clear();
        return promise;
      },
      [=](progress_atom, int64_t rank, int64_t epoch, int64_t step, int64_t epochRows, int64_t rowsPerEpoch,
          double loss, double rate) {
        auto& st = self->state;
        if (rank < 0 || rank >= st.workers) return;
        st.workerRate[size_t(rank)] = rate;
        if (!st.options().onProgress) return;
        JobProgress p{rank, step, epoch, epochRows, rowsPerEpoch, loss, 0};
        for (size_t w = 0; w < st.workerRate.size(); ++w) {
          if (!st.wk[w].lost && !st.wk[w].done) p.samplesPerSec += st.workerRate[w];
        }
        st.options().onProgress(p);
      },
      [=](workers::gate_atom, int64_t rank, int64_t steps, int64_t samples,
          double trainSeconds) -> caf::typed_response_promise<bool> {
        auto& st = self->state;
        auto promise = self->make_response_promise<bool>();
        if (rank < 0 || rank >= st.workers || st.gateOpen) {
          promise.deliver(false);
          return promise;
        }
        st.log->info("worker {} finished training: {} steps, {} samples in {:.1f} s", rank, steps, samples,
                     trainSeconds);
        st.gateWaiters.emplace(rank, promise);
        checkGate(self);
        return promise;
      },
      [=](done_atom, int64_t rank, bool ok, const std::string& error, int64_t steps, int64_t samples,
          int64_t pushes, int64_t pulled, double trainSeconds, double evalSeconds, bool evaluated, double auc,
          double loss, double accuracy, int64_t rows, const Tensor& labels, const Tensor& predictions,
          uint64_t denseHash) -> int64_t {
        auto& st = self->state;
        if (rank < 0 || rank >= st.workers) return rank;
        if (!ok) {
          fail(self, fmt::format("worker {} failed: {}", rank, error));
          return rank;
        }
        st.wk[size_t(rank)].done = true;
        auto& o = *st.outcome;
        o.workers[size_t(rank)] = WorkerSummary{rank, false, steps, samples, pushes, pulled, trainSeconds, denseHash};
        o.steps += steps;
        o.samples += samples;
        o.pulledRows += pulled;
        o.trainSeconds = std::max(o.trainSeconds, trainSeconds);
        if (evaluated) {
          o.evaluated = true;
          o.auc = auc;
          o.loss = loss;
          o.accuracy = accuracy;
          o.rows = rows;
          o.evalSeconds = evalSeconds;
          if (labels.dtype == DType::kFloat32 && predictions.dtype == DType::kFloat32 &&
              labels.bytes == predictions.bytes) {
            o.labels.assign(labels.as<float>(), labels.as<float>() + labels.count<float>());
            o.predictions.assign(predictions.as<float>(), predictions.as<float>() + predictions.count<float>());
          }
        }
        checkDone(self);
        return rank;
      },
  };
}

}  // namespace

JobOutcome runCoordinator(const CoordinatorOptions& options) {
  JobOutcome failed;
  auto parsed = ps::parseConsistency(options.config.getString("ps.consistency"));
  if (!parsed.hasValue()) TROUPE_SETUP_ERROR("config: ps.consistency: {}", parsed.status().message());
  caf::actor_system_config cfg;
  configureSharingScheduler(cfg, 2);
  caf::actor_system system{cfg};
  transport::NodeOptions node = options.node;
  node.role = "coordinator";
  node.isCoordinator = true;
  node.coordinator.clear();
  auto remote = transport::RemoteActors::start(system, node);
  if (!remote.hasValue()) TROUPE_SETUP_ERROR("coordinator: {}", remote.status().message());
  auto coord = system.spawn(coordinator, options, remote->get());
  (*remote)->publish(coord, kCoordinatorActor);
  logger("job")->info("coordinator listening on {}", (*remote)->node().address());
  if (options.onListening) options.onListening((*remote)->node().address());
  JobOutcomePtr outcome;
  {
    caf::scoped_actor self{system};
    self->send(coord, workers::run_atom::value);
    bool aborted = false;
    while (!outcome) {
      self->receive([&](JobOutcomePtr o) { outcome = o; }, [&](caf::error& e) {
                      failed.error = "coordinator: " + caf::to_string(e);
                      outcome = std::make_shared<JobOutcome>(failed);
                    },
                    caf::after(100ms) >> [&] {
                      if (aborted || !options.checkAbort) return;
                      std::string why = options.checkAbort();
                      if (!why.empty()) {
                        aborted = true;
                        self->send(coord, abort_atom::value, why);
                      }
                    });
    }
    // Give the processes a moment to receive their shutdown before the
    // coordinator's node goes away.
    std::this_thread::sleep_for(200ms);
    self->send_exit(coord, caf::exit_reason::user_shutdown);
  }
  return *outcome;
}

// ------------------------------------------------------------------ members

namespace {

struct ProcessState {
  static inline const char* name = "process";
};

caf::behavior processActor(caf::stateful_actor<ProcessState>* self) {
  return {
      [=](shutdown_atom) { self->quit(); },
  };
}

Config configFrom(const std::string& toml) {
  Config c(troupeConfigSchema());
  c.loadString(toml, "the coordinator");
  return c;
}

int memberThreads(const Config& c, const std::string& role, int requested) {
  if (requested > 0) return requested;
  if (role == "ps") return int(std::max<int64_t>(1, c.getInt("cluster.server_threads")));
  const int64_t t = c.getInt("cluster.worker_threads");
  if (t > 0) return int(t);
  const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / int(std::max<int64_t>(1, c.getInt("cluster.workers"))));
}

}  // namespace

int runMember(const MemberOptions& options) {
  auto log = logger("job");
  caf::actor_system_config cfg;
  // NCCL's bootstrap sockets stay on loopback with the transport (set
  // before any thread starts: getenv elsewhere is not synchronized).
  if (options.node.listenHost.rfind("127.", 0) == 0 || options.node.listenHost == "localhost") {
    setenv("NCCL_SOCKET_IFNAME", "lo", 0);
  }
  configureSharingScheduler(cfg, 2);
  caf::actor_system system{cfg};
  transport::NodeOptions nodeOptions = options.node;
  nodeOptions.role = options.role;
  nodeOptions.isCoordinator = false;
  auto remote = transport::RemoteActors::start(system, nodeOptions);
  if (!remote.hasValue()) {
    log->error("{}: {}", options.role, remote.status().message());
    return 1;
  }
  transport::Node& node = (*remote)->node();
  // The membership arrives shortly after the join.
  uint64_t coordinatorNode = 0;
  const auto joinDeadline = std::chrono::steady_clock::now() + nodeOptions.joinTimeout;
  while (coordinatorNode == 0 && std::chrono::steady_clock::now() < joinDeadline) {
    for (const auto& m : node.members()) {
      if (m.role == "coordinator") coordinatorNode = m.nodeId;
    }
    if (coordinatorNode == 0) std::this_thread::sleep_for(10ms);
  }
  if (coordinatorNode == 0) {
    log->error("{}: joined {}, but no coordinator is among its members", options.role, nodeOptions.coordinator);
    return 1;
  }
  caf::actor coord = (*remote)->remoteActor(coordinatorNode, kCoordinatorActor);
  auto proc = system.spawn(processActor);
  (*remote)->publish(proc, kProcessActor);
  caf::scoped_actor self{system};
  self->monitor(coord);
  self->monitor(proc);
  const auto startTimeout = 600s;

  int64_t rank = -1;
  std::string toml, error;
  self->request(coord, startTimeout, hello_atom::value, options.role, options.requestedRank, node.id(),
                node.address())
      .receive([&](int64_t r, std::string& t) { rank = r, toml = std::move(t); },
               [&](caf::error& e) { error = caf::to_string(e); });
  if (rank < 0) {
    log->error("{}: the coordinator did not take this process: {}", options.role, error);
    return 1;
  }
  Config config = configFrom(toml);
  const int threads = memberThreads(config, options.role, options.threads);
  log->info("{} {} on {} ({} compute threads)", options.role, rank, node.address(), threads);
  auto kernels = std::shared_ptr<kernels::Kernels>(kernels::createKernels({kernels::Device::kCpu, threads}));
  const int workers = int(config.getInt("cluster.workers"));
  int status = 0;
  caf::actor shard, worker, trainLoader, testLoader, client;
  std::unique_ptr<collectives::PeerWatch> peerWatch;  // the NCCL communicator's health; outlives it
  std::shared_ptr<collectives::Communicator> comm;      // destroyed before the transport
  try {
  const TrainMode mode = trainMode(config);
  const int servers = int(serverCount(config));
  workers::WorkerCoreOptions model = modelOptions(config, threads);
  model.kernels = kernels;
  model.worker = rank;
  model.denseOnServers = mode == TrainMode::kPs;
    if (options.role == "ps") {
      ps::ShardOptions so;
      so.shard = int(rank);
      so.shards = servers;
      so.workers = workers;
      so.tables = tableOptions(config, model);
      for (auto& t : so.tables) t.initialCapacity = 1024;
      // The dense slice's initial weights: the model initialised as every worker does.
      if (mode == TrainMode::kPs) {
        workers::WorkerCore init(model);
        const auto slice = ps::denseSlice(init.denseParameters(), int(rank), servers);
        so.denseInit.assign(init.denseWeights() + slice.first, init.denseWeights() + slice.second);
      }
      so.denseOptimizer = model.denseOptimizer;
      so.consistency = *ps::parseConsistency(config.getString("ps.consistency"));
      so.staleness = config.getInt("ps.staleness");
      so.kernels = kernels;
      shard = ps::spawnShard(system, so);
      shard->attach_functor([rank](const caf::error& reason) {
        if (reason) logger("job")->error("ps {}: the shard actor stopped: {}", rank, caf::to_string(reason));
      });
      (*remote)->publish(shard, kShardActor);
    }
    Tensor shardNodes;
    bool ready = false;
    self->request(coord, startTimeout, ready_atom::value, options.role, rank)
        .receive(
            [&](Tensor& t) {
              shardNodes = std::move(t);
              ready = true;
            },
            [&](caf::error& e) { error = caf::to_string(e); });
    if (!ready) TROUPE_SETUP_ERROR("the job did not start: {}", error);
    if (options.role == "worker") {
      if (shardNodes.dtype != DType::kUInt64 || shardNodes.count<uint64_t>() != size_t(servers + workers)) {
        TROUPE_SETUP_ERROR("the coordinator sent {} node ids for {} shards and {} workers",
                           shardNodes.count<uint64_t>(), servers, workers);
      }
      const uint64_t* nodeIds = shardNodes.as<uint64_t>();
      if (mode != TrainMode::kPs) {
        std::vector<uint64_t> workerNodes(nodeIds + servers, nodeIds + servers + workers);
        const std::string requested = collectivesBackend(config);
        std::string backend = "ring";
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
          bool decided = false;
          self->request(coord, startTimeout, commid_atom::value, rank, int64_t(collectives::ncclDevices()), why,
                        Tensor::copyOf(id.data(), id.size(), DType::kBytes))
              .receive(
                  [&](std::string& b, Tensor& t, int64_t d) {
                    backend = std::move(b);
                    ncclId = std::move(t);
                    device = int(d);
                    decided = true;
                  },
                  [&](caf::error& e) { error = caf::to_string(e); });
          if (!decided) TROUPE_SETUP_ERROR("worker {}: no collectives backend: {}", rank, error);
        }
        const auto timeout = std::chrono::seconds(positive(config, "collectives.timeout_s"));
        const auto connectTimeout = std::chrono::seconds(config.getInt("cluster.start_timeout_s"));
        if (backend == "nccl") {
          peerWatch = std::make_unique<collectives::PeerWatch>(**remote, workerNodes, int(rank));
          collectives::NcclOptions no;
          no.rank = int(rank);
          no.size = workers;
          no.device = device;
          no.id.assign(reinterpret_cast<const char*>(ncclId.data), size_t(ncclId.bytes));
          no.timeout = timeout;
          no.connectTimeout = connectTimeout;
          no.health = [watch = peerWatch.get()] { return watch->status(); };
          auto nccl = collectives::createNcclCommunicator(std::move(no));
          if (!nccl.hasValue()) TROUPE_SETUP_ERROR("worker {}: the workers' communicator: {}", rank, nccl.status().message());
          comm = std::move(*nccl);
        } else {
          collectives::RingOptions ro;
          ro.rank = int(rank);
          ro.nodes = std::move(workerNodes);
          ro.chunkBytes = size_t(positive(config, "collectives.chunk_kb")) << 10;
          ro.smallBytes = size_t(std::max<int64_t>(0, config.getInt("collectives.small_kb"))) << 10;
          ro.timeout = timeout;
          ro.connectTimeout = connectTimeout;
          ro.spin = std::chrono::microseconds(std::max<int64_t>(0, config.getInt("collectives.spin_us")));
          auto ring = collectives::RingCommunicator::create(**remote, ro);
          if (!ring.hasValue()) TROUPE_SETUP_ERROR("worker {}: the workers' communicator: {}", rank, ring.status().message());
          comm = std::move(*ring);
        }
        model.comm = comm;
        model.bucketBytes = positive(config, "train.bucket_kb") << 10;
        model.replicatedTables = mode == TrainMode::kAllReduce && model.kind == workers::ModelKind::kDlrm;
      }
      DataSources data = openData(config, threads);
      auto core = std::make_unique<workers::WorkerCore>(model);
      if (mode != TrainMode::kAllReduce) {
        workers::PsClientOptions co;
        co.worker = rank;
        for (int s = 0; s < servers; ++s) co.shards.push_back((*remote)->remoteActor(nodeIds[s], kShardActor));
        for (const auto& t : tableOptions(config, model)) co.dims.push_back(t.dim);
        co.denseSize = mode == TrainMode::kPs ? core->denseParameters() : 0;
        client = workers::spawnPsClient(system, co);
      } else if (core->hasTables()) {
        ps::TableHolderOptions ho;
        ho.tables = tableOptions(config, model);
        ho.kernels = kernels;
        client = ps::spawnTableHolder(system, ho);  // this rank's replica of the tables
      }
      const int prefetch = int(positive(config, "data.prefetch"));
      trainLoader = workers::spawnLoader(system, workers::everyNthBatch(data.train, rank, workers), prefetch);
      testLoader = workers::spawnLoader(system, data.test, prefetch);
      workers::WorkerOptions wo;
      wo.core = model;
      wo.epochs = positive(config, "train.epochs");
      wo.maxSteps = config.getInt("train.max_steps");
      wo.progressEverySteps = positive(config, "train.progress_every");
      wo.evaluateEachEpoch = false;
      wo.evalGate = coord;
      if (config.getInt("cluster.slow_worker") == rank) wo.stepDelay = std::chrono::milliseconds(config.getInt("cluster.slow_ms"));
      wo.onEvent = [coord, rank](const workers::WorkerEvent& e) {
        if (e.kind != workers::WorkerEvent::Kind::kProgress) return;
        caf::anon_send(coord, progress_atom::value, rank, e.epoch, e.step, e.epochRows, e.rowsPerEpoch, e.meanLoss,
                       e.samplesPerSec);
      };
      worker = workers::spawnWorker(system, wo, std::move(core), trainLoader, testLoader, client);
      workers::TrainReportPtr report;
      self->request(worker, caf::infinite, workers::run_atom::value)
          .receive([&](workers::TrainReportPtr r) { report = r; }, [&](caf::error& e) { error = caf::to_string(e); });
      self->wait_for(worker);  // its core (and its hold on the communicator) is gone
      if (report) {
        const bool evaluated = !report->evals.empty();
        const workers::EvalResult eval = evaluated ? report->evals.back() : workers::EvalResult{};
        self->request(coord, 60s, done_atom::value, rank, true, std::string(), report->steps, report->samples,
                      report->pushesAcked, report->pulledRows, report->trainSeconds, report->evalSeconds, evaluated,
                      eval.auc, eval.loss, eval.accuracy, eval.rows,
                      Tensor::copyOf(eval.labels.data(), eval.labels.size() * 4, DType::kFloat32),
                      Tensor::copyOf(eval.predictions.data(), eval.predictions.size() * 4, DType::kFloat32),
                      hashBytes(std::string_view(reinterpret_cast<const char*>(report->denseWeights.data()),
                                                 report->denseWeights.size() * 4),
                                0))
            .receive([](int64_t) {}, [&](caf::error& e) { log->warn("the coordinator did not take the report: {}", caf::to_string(e)); });
      } else {
        log->error("worker {} failed: {}", rank, error);
        status = 1;
        std::vector<float> none;
        self->send(coord, done_atom::value, rank, false, error, int64_t{0}, int64_t{0}, int64_t{0}, int64_t{0}, 0.0,
                   0.0, false, 0.0, 0.0, 0.0, int64_t{0}, Tensor::copyOf(nullptr, 0, DType::kFloat32),
                   Tensor::copyOf(nullptr, 0, DType::kFloat32), uint64_t{0});
      }
    }
  } catch (const SetupError& e) {
    log->error("{} {}: {}", options.role, rank, e.what());
    status = 2;
  }
  // Until the coordinator shuts the job down (or is lost).
  bool over = false;
  const auto deadline = std::chrono::steady_clock::now() + (status == 0 ? 24h : 30s);
  while (!over && std::chrono::steady_clock::now() < deadline) {
    self->receive(
        [&](caf::down_msg& dm) {
          if (dm.source == coord.address()) {
            if (status == 0 && options.role == "ps") {
              log->error("ps {}: lost the coordinator ({})", rank, caf::to_string(dm.reason));
              status = 1;
            }
          }
          over = true;
        },
        caf::after(1s) >> [] {});
  }
  for (const auto& a : {worker, trainLoader, testLoader, client, shard, proc}) {
    if (a) self->send_exit(a, caf::exit_reason::user_shutdown);
  }
  log->info("{} {} exits ({})", options.role, rank, status);
  return status;
}

}  // namespace troupe::apps
