#include "transport/remote_actors.h"

#include <array>
#include <atomic>
#include <map>
#include <tuple>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include <caf/actor_cast.hpp>
#include <caf/actor_config.hpp>
#include <caf/actor_proxy.hpp>
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/exit_reason.hpp>
#include <caf/mailbox_element.hpp>
#include <caf/make_actor.hpp>
#include <caf/message_id.hpp>
#include <caf/node_id.hpp>
#include <caf/sec.hpp>

#include "common/check.h"
#include "common/hash.h"
#include "common/logging.h"
#include "transport/message_codec.h"

namespace troupe::transport {
namespace {

std::shared_ptr<spdlog::logger> log() {
  static auto l = logger("transport");
  return l;
}

caf::node_id nodeIdOf(uint64_t peer) {
  caf::node_id::default_data::host_id_type host{};
  host[0] = 'T';
  for (int i = 0; i < 8; ++i) host[size_t(1 + i)] = uint8_t(peer >> (8 * i));
  return caf::make_node_id(uint32_t(peer), host);
}

// The key of a request in the pending table: its id without the response
// and answered flags (the priority bits stay, so the key is a request id).
uint64_t requestKey(caf::message_id mid) {
  return mid.integer_value() & ~(caf::message_id::response_flag_mask | caf::message_id::answered_flag_mask);
}

caf::message errorMessage(caf::sec code, std::string context) {
  return caf::make_message(caf::make_error(code, std::move(context)));
}

}  // namespace

std::optional<Departure> departureOf(const caf::error& reason) {
  if (!reason || reason.category() != kDepartureCategory) return std::nullopt;
  if (reason.code() < uint8_t(Departure::kLeft) || reason.code() > uint8_t(Departure::kShutdown)) return std::nullopt;
  return Departure(reason.code());
}

void addDepartureCategory(caf::actor_system_config& cfg) {
  cfg.add_error_category(kDepartureCategory, [](uint8_t code, caf::atom_value, const caf::message& context) {
    const bool known = code >= uint8_t(Departure::kLeft) && code <= uint8_t(Departure::kShutdown);
    std::string out = fmt::format("departure: {}", known ? departureName(Departure(code)) : "unknown");
    if (!context.empty()) {
      out += " (";
      out += context.match_elements<std::string>() ? context.get_as<std::string>(0) : caf::to_string(context);
      out += ")";
    }
    return out;
  });
}

uint64_t publishedActorId(const std::string& name) {
  return hashBytes(name, 0x7472707065727331ull) | (uint64_t{1} << 63);
}

class RemoteActorProxy;

class RemoteActors::Core final : public NodeHandler, public std::enable_shared_from_this<Core> {
 public:
  Core(caf::actor_system& system, WireTypes types) : system_(system), types_(std::move(types)) {}

  // NodeHandler (progress thread).
  void onFrame(uint64_t peer, DecodedFrame frame, std::shared_ptr<const void> owner) override;
  void onPeerDown(uint64_t peer, Departure how, const Status& why) override;

  // From a proxy: encode and send. Fails when the message cannot cross
  // processes or the node is gone.
  Status forward(uint64_t peer, uint64_t destId, const caf::strong_actor_ptr& sender, caf::message_id mid,
                 const caf::message& msg);

  caf::strong_actor_ptr proxyFor(uint64_t peer, uint64_t actorId, bool* bornDead);
  bool isDown(uint64_t peer) {
    std::lock_guard<std::mutex> lock(mutex_);
    return down_.count(peer) != 0;
  }
  Departure departureOfDown(uint64_t peer) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = down_.find(peer);
    return it == down_.end() ? Departure::kUnreachable : it->second;
  }
  // The actor published under `id` when `peer` is this node itself.
  caf::actor localNamed(uint64_t peer, uint64_t id) {
    std::lock_guard<std::mutex> nodeLock(nodeMutex_);
    if (!node_ || node_->id() != peer) return caf::actor();
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = named_.find(id);
    return it == named_.end() ? caf::actor() : it->second;
  }
  void publish(const caf::actor& actor, uint64_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    named_[id] = actor;
  }
  void shutdown();
  void sendRaw(uint64_t peer, Envelope e, std::vector<Tensor> tensors) {
    sendEnvelope(peer, std::move(e), std::move(tensors));
  }
  void attach(uint16_t kind, std::shared_ptr<FrameSink> sink) {
    std::lock_guard<std::mutex> lock(sinkMutex_);
    if (sink) {
      sinks_[kind] = std::move(sink);
    } else {
      sinks_.erase(kind);
    }
  }
  void detachIf(uint16_t kind, const FrameSink* sink) {
    std::lock_guard<std::mutex> lock(sinkMutex_);
    auto it = sinks_.find(kind);
    if (it != sinks_.end() && it->second.get() == sink) sinks_.erase(it);
  }

  caf::actor_system& system_;
  const WireTypes types_;
  std::unique_ptr<Node> node_;  // guarded by nodeMutex_ once running
  std::mutex nodeMutex_;
  struct {
    std::atomic<uint64_t> delivered{0}, undeliverable{0}, refused{0}, peersDown{0};
  } counters_;

 private:
  caf::strong_actor_ptr localActor(uint64_t id);
  void replyError(uint64_t peer, const Envelope& request, caf::sec code, const std::string& context);
  std::shared_ptr<FrameSink> sinkFor(uint16_t kind) {
    std::lock_guard<std::mutex> lock(sinkMutex_);
    auto it = sinks_.find(kind);
    return it == sinks_.end() ? nullptr : it->second;
  }
  std::vector<std::shared_ptr<FrameSink>> allSinks() {
    std::lock_guard<std::mutex> lock(sinkMutex_);
    std::vector<std::shared_ptr<FrameSink>> out;
    for (auto& [kind, sink] : sinks_) out.push_back(sink);
    return out;
  }
  void sendEnvelope(uint64_t peer, Envelope e, std::vector<Tensor> tensors) {
    std::lock_guard<std::mutex> lock(nodeMutex_);
    if (node_) node_->send(peer, std::move(e), std::move(tensors));
  }
  std::mutex sinkMutex_;
  std::map<uint16_t, std::shared_ptr<FrameSink>> sinks_;

  std::mutex mutex_;
  std::unordered_map<uint64_t, caf::actor> named_;
  std::unordered_map<uint64_t, caf::weak_actor_ptr> exported_;
  size_t exportedSweepAt_ = 1024;
  std::map<std::pair<uint64_t, uint64_t>, caf::strong_actor_ptr> proxies_;
  size_t proxiesSweepAt_ = 1024;
  // Requests sent through proxies and not yet answered, by (peer, requesting
  // actor, request id): request ids are per actor. Weak, so a requester that
  // gave up and died is not kept alive; swept when the table grows.
  struct Pending {
    caf::weak_actor_ptr sender;
    uint8_t traffic = 0;  // the request's label: its reply counts under label + "-reply"
  };
  std::map<std::tuple<uint64_t, uint64_t, uint64_t>, Pending> pending_;
  size_t pendingSweepAt_ = 4096;
  std::unordered_map<uint64_t, Departure> down_;  // and how each went
  std::atomic<bool> shuttingDown_{false};

 public:
  bool shuttingDown() const { return shuttingDown_.load(); }
  // Traffic labels: index -> name (index 0 unused), leading atoms -> index,
  // and the replies received to labelled requests.
  mutable std::mutex trafficMutex_;
  std::vector<std::string> labels_{std::string()};
  std::unordered_map<uint64_t, uint8_t> atomLabels_;
  std::array<std::atomic<uint64_t>, kTrafficLabels> replyFrames_{}, replyBytes_{};
};

class RemoteActorProxy final : public caf::actor_proxy {
 public:
  RemoteActorProxy(caf::actor_config& cfg, std::shared_ptr<RemoteActors::Core> core, uint64_t peer,
                   uint64_t remoteId)
      : caf::actor_proxy(cfg), core_(std::move(core)), peer_(peer), remoteId_(remoteId) {}

  const char* name() const override { return "remote_actor_proxy"; }

  void enqueue(caf::mailbox_element_ptr what, caf::execution_unit* ctx) override {
    if (!what) return;
    caf::strong_actor_ptr sender = what->sender;
    const caf::message_id mid = what->mid;
    if (dead_.load()) {
      bounce(sender, mid, caf::sec::request_receiver_down, "the remote actor's node is down", ctx);
      return;
    }
    caf::message msg = what->move_content_to_message();
    Status st = core_->forward(peer_, remoteId_, sender, mid, msg);
    if (!st.isOk()) {
      if (core_->shuttingDown()) {
        // A message (often a reply) in flight as this process's transport
        // closes: the job is ending (a requester still gets the error).
        log()->debug("cannot send {} to node {:x}: {}", caf::to_string(msg), peer_, st.message());
      } else {
        core_->counters_.refused++;
        log()->error("cannot send {} to node {:x}: {}", caf::to_string(msg), peer_, st.message());
      }
      bounce(sender, mid, caf::sec::invalid_argument, st.message(), ctx);
    }
  }

  bool add_backlink(caf::abstract_actor* x) override { return caf::monitorable_actor::add_backlink(x); }
  bool remove_backlink(caf::abstract_actor* x) override { return caf::monitorable_actor::remove_backlink(x); }

  void kill_proxy(caf::execution_unit* ctx, caf::error reason) override {
    dead_ = true;
    cleanup(std::move(reason), ctx);
  }

 private:
  void bounce(const caf::strong_actor_ptr& sender, caf::message_id mid, caf::sec code, std::string context,
              caf::execution_unit* ctx) {
    if (sender && mid.is_request()) {
      sender->enqueue(caf::make_mailbox_element(caf::strong_actor_ptr(ctrl()), mid.response_id(), {},
                                                errorMessage(code, std::move(context))),
                      ctx);
    }
  }

  std::shared_ptr<RemoteActors::Core> core_;
  const uint64_t peer_;
  const uint64_t remoteId_;
  std::atomic<bool> dead_{false};
};

Status RemoteActors::Core::forward(uint64_t peer, uint64_t destId, const caf::strong_actor_ptr& sender,
                                   caf::message_id mid, const caf::message& msg) {
  Envelope e;
  e.kind = kActorMessageKind;
  e.destActor = destId;
  e.requestId = mid.integer_value();
  std::vector<Tensor> tensors;
  Status st = encodeMessage(msg, &e.body, &tensors, &types_);
  if (!st.isOk()) return st;
  if (!mid.is_response() && !msg.empty() && msg.match_element<caf::atom_value>(0)) {
    std::lock_guard<std::mutex> lock(trafficMutex_);
    if (auto it = atomLabels_.find(uint64_t(msg.get_as<caf::atom_value>(0))); it != atomLabels_.end()) {
      e.traffic = it->second;
    }
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (sender && sender->node() == system_.node()) {
      e.sourceActor = sender->id();
      exported_[sender->id()] = caf::weak_actor_ptr(sender.get());
      if (exported_.size() >= exportedSweepAt_) {
        for (auto it = exported_.begin(); it != exported_.end();) {
          it = it->second.lock() ? std::next(it) : exported_.erase(it);
        }
        exportedSweepAt_ = std::max<size_t>(1024, exported_.size() * 2);
      }
      if (mid.is_request()) {
        pending_[{peer, sender->id(), requestKey(mid)}] = Pending{caf::weak_actor_ptr(sender.get()), e.traffic};
        if (pending_.size() >= pendingSweepAt_) {
          for (auto it = pending_.begin(); it != pending_.end();) {
            it = it->second.sender.lock() ? std::next(it) : pending_.erase(it);
          }
          pendingSweepAt_ = std::max<size_t>(4096, pending_.size() * 2);
        }
      }
    }
  }
  std::lock_guard<std::mutex> lock(nodeMutex_);
  if (!node_) return Status::unavailable("the transport is shut down");
  node_->send(peer, std::move(e), std::move(tensors));
  return Status::ok();
}

caf::strong_actor_ptr RemoteActors::Core::proxyFor(uint64_t peer, uint64_t actorId, bool* bornDead) {
  std::lock_guard<std::mutex> lock(mutex_);
  *bornDead = down_.count(peer) != 0;
  if (!*bornDead) {
    if (auto it = proxies_.find({peer, actorId}); it != proxies_.end()) return it->second;
  }
  if (proxies_.size() >= proxiesSweepAt_) {
    // Forget proxies nobody else holds (senders of finished requests): the
    // table would otherwise grow with every short-lived remote requester.
    for (auto it = proxies_.begin(); it != proxies_.end();) {
      it = it->second->strong_refs.load() == 1 ? proxies_.erase(it) : std::next(it);
    }
    proxiesSweepAt_ = std::max<size_t>(1024, proxies_.size() * 2);
  }
  caf::actor_config cfg;
  auto proxy = caf::make_actor<RemoteActorProxy, caf::strong_actor_ptr>(actorId, nodeIdOf(peer), &system_, cfg,
                                                                        shared_from_this(), peer, actorId);
  if (!*bornDead) proxies_[{peer, actorId}] = proxy;
  return proxy;
}

caf::strong_actor_ptr RemoteActors::Core::localActor(uint64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto it = named_.find(id); it != named_.end()) return caf::actor_cast<caf::strong_actor_ptr>(it->second);
  if (auto it = exported_.find(id); it != exported_.end()) {
    auto p = it->second.lock();
    if (!p) exported_.erase(it);
    return p;
  }
  return nullptr;
}

void RemoteActors::Core::replyError(uint64_t peer, const Envelope& request, caf::sec code, const std::string& context) {
  const caf::message_id mid(request.requestId);
  if (!mid.is_request() || request.sourceActor == 0) return;
  Envelope e;
  e.kind = kActorMessageKind;
  e.destActor = request.sourceActor;
  e.sourceActor = request.destActor;
  e.requestId = mid.response_id().integer_value();
  std::vector<Tensor> none;
  if (!encodeMessage(errorMessage(code, context), &e.body, &none).ok()) return;
  sendEnvelope(peer, std::move(e), {});
}

void RemoteActors::Core::onFrame(uint64_t peer, DecodedFrame frame, std::shared_ptr<const void> owner) {
  const Envelope& env = frame.envelope;
  if (env.kind != kActorMessageKind) {
    if (auto sink = sinkFor(env.kind)) {
      sink->onFrame(peer, std::move(frame), std::move(owner));
      return;
    }
    if (env.kind == kPeerWatchKind) return;  // carries nothing; the connection was the point
    counters_.undeliverable++;
    if (env.kind == kCollectiveKind) {
      // Expected: a peer's hello before this process formed the group (it
      // is repeated until answered, and no chunk is sent before the
      // answer), or a frame of a group this process has let go.
      log()->debug("dropped a collective frame from node {:x}: no group here takes it", peer);
      return;
    }
    log()->warn("dropped a message of unknown kind {} from node {:x}", env.kind, peer);
    return;
  }
  auto msg = decodeMessage(env.body, frame.tensors, owner, &types_);
  if (!msg.hasValue()) {
    const uint64_t n = ++counters_.undeliverable;
    if (n <= 10 || n % 1000 == 0) log()->warn("dropped a malformed actor message from node {:x}: {}", peer, msg.status().message());
    replyError(peer, env, caf::sec::invalid_argument, msg.status().message());
    return;
  }
  caf::strong_actor_ptr dest = localActor(env.destActor);
  if (!dest) {
    counters_.undeliverable++;
    log()->debug("no local actor {:x} for a message from node {:x}", env.destActor, peer);
    replyError(peer, env, caf::sec::request_receiver_down, "no such actor");
    return;
  }
  const caf::message_id mid(env.requestId);
  caf::strong_actor_ptr sender;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    down_.erase(peer);
    if (mid.is_response()) {
      if (auto it = pending_.find({peer, env.destActor, requestKey(mid)}); it != pending_.end()) {
        if (const uint8_t t = it->second.traffic; t != 0) {
          replyFrames_[t]++;
          replyBytes_[t] += frame.wireBytes;
        }
        pending_.erase(it);
      }
    }
  }
  if (env.sourceActor != 0) {
    bool bornDead = false;
    sender = proxyFor(peer, env.sourceActor, &bornDead);
  }
  counters_.delivered++;
  dest->enqueue(caf::make_mailbox_element(std::move(sender), mid, {}, std::move(*msg)), nullptr);
}

void RemoteActors::Core::onPeerDown(uint64_t peer, Departure how, const Status& why) {
  for (auto& sink : allSinks()) sink->onPeerDown(peer, how, why);
  std::vector<caf::strong_actor_ptr> proxies;
  std::vector<std::pair<uint64_t, caf::strong_actor_ptr>> failed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    down_.emplace(peer, how);  // the first departure seen is the one kept
    for (auto it = proxies_.lower_bound({peer, 0}); it != proxies_.end() && it->first.first == peer;) {
      proxies.push_back(std::move(it->second));
      it = proxies_.erase(it);
    }
    for (auto it = pending_.lower_bound({peer, 0, 0}); it != pending_.end() && std::get<0>(it->first) == peer;) {
      if (auto sender = it->second.sender.lock()) failed.emplace_back(std::get<2>(it->first), std::move(sender));
      it = pending_.erase(it);
    }
  }
  if (!proxies.empty() || !failed.empty()) {
    counters_.peersDown++;
    const bool quiet = failed.empty() && (shuttingDown_ || how == Departure::kLeft);
    log()->log(quiet ? spdlog::level::debug : spdlog::level::warn, "node {:x} is down ({}); {} proxies killed, {} pending requests failed", peer, why.message(),
                proxies.size(), failed.size());
  }
  for (auto& [requestId, sender] : failed) {
    const caf::message_id mid(requestId);
    sender->enqueue(caf::make_mailbox_element(nullptr, mid.response_id(), {},
                                              errorMessage(caf::sec::request_receiver_down, why.message())),
                    nullptr);
  }
  for (auto& p : proxies) {
    static_cast<RemoteActorProxy*>(caf::actor_cast<caf::abstract_actor*>(p))
        ->kill_proxy(nullptr, caf::make_error(how, why.message()));
  }
}

void RemoteActors::Core::shutdown() {
  shuttingDown_ = true;
  std::unique_ptr<Node> node;
  {
    std::lock_guard<std::mutex> lock(nodeMutex_);
    node = std::move(node_);  // sends fail from now on
  }
  node.reset();  // stops the progress thread (outside the lock its callbacks may want)
  std::vector<uint64_t> peers;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [key, p] : proxies_) peers.push_back(key.first);
    for (auto& [key, p] : pending_) peers.push_back(std::get<0>(key));
  }
  for (uint64_t peer : peers) {
    onPeerDown(peer, Departure::kShutdown, Status::unavailable(kShutdownWhy));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  named_.clear();
  exported_.clear();
}

// ---------------------------------------------------------------- RemoteActors

Expected<std::unique_ptr<RemoteActors>> RemoteActors::start(caf::actor_system& system, NodeOptions options,
                                                            WireTypes types) {
  auto core = std::make_shared<Core>(system, std::move(types));
  auto node = Node::start(std::move(options), core.get());
  if (!node.hasValue()) return node.status();
  {
    std::lock_guard<std::mutex> lock(core->nodeMutex_);  // the progress thread may already read it
    core->node_ = std::move(*node);
  }
  return std::unique_ptr<RemoteActors>(new RemoteActors(std::move(core)));
}

RemoteActors::RemoteActors(std::shared_ptr<Core> core) : core_(std::move(core)) {}

RemoteActors::~RemoteActors() { core_->shutdown(); }

Node& RemoteActors::node() { return *core_->node_; }

void RemoteActors::publish(const caf::actor& actor, const std::string& name) {
  core_->publish(actor, publishedActorId(name));
}

caf::actor RemoteActors::remoteActor(uint64_t peer, const std::string& name) {
  if (auto local = core_->localNamed(peer, publishedActorId(name))) return local;  // this very node
  bool bornDead = false;
  auto p = core_->proxyFor(peer, publishedActorId(name), &bornDead);
  if (bornDead) {
    static_cast<RemoteActorProxy*>(caf::actor_cast<caf::abstract_actor*>(p))
        ->kill_proxy(nullptr, caf::make_error(core_->departureOfDown(peer), "the node was already down"));
  }
  return caf::actor_cast<caf::actor>(p);
}

void RemoteActors::attachSink(uint16_t kind, std::shared_ptr<FrameSink> sink) {
  TROUPE_CHECK(kind != kActorMessageKind && kind >= kFirstUserKind, "attachSink: kind {} is not free", kind);
  core_->attach(kind, std::move(sink));
}

void RemoteActors::detachSink(uint16_t kind) { core_->attach(kind, nullptr); }

void RemoteActors::detachSink(uint16_t kind, const FrameSink* sink) { core_->detachIf(kind, sink); }

void RemoteActors::sendFrame(uint64_t peer, Envelope envelope, std::vector<Tensor> tensors) {
  core_->sendRaw(peer, std::move(envelope), std::move(tensors));
}

bool RemoteActors::peerDown(uint64_t peer) const { return core_->isDown(peer); }

uint8_t RemoteActors::trafficLabel(const std::string& label) {
  std::lock_guard<std::mutex> lock(core_->trafficMutex_);
  auto& labels = core_->labels_;
  for (size_t i = 1; i < labels.size(); ++i) {
    if (labels[i] == label) return uint8_t(i);
  }
  if (labels.size() >= kTrafficLabels) return 0;
  labels.push_back(label);
  return uint8_t(labels.size() - 1);
}

void RemoteActors::countMessages(caf::atom_value leading, const std::string& label) {
  const uint8_t index = trafficLabel(label);
  std::lock_guard<std::mutex> lock(core_->trafficMutex_);
  core_->atomLabels_[uint64_t(leading)] = index;
}

std::map<std::string, RemoteActors::TrafficCount> RemoteActors::traffic() const {
  NodeStats node;
  {
    std::lock_guard<std::mutex> lock(core_->nodeMutex_);
    if (core_->node_) node = core_->node_->stats();
  }
  std::map<std::string, TrafficCount> out;
  std::lock_guard<std::mutex> lock(core_->trafficMutex_);
  const auto& labels = core_->labels_;
  for (size_t i = 1; i < labels.size(); ++i) {
    out[labels[i]] = TrafficCount{node.framesSentByTraffic[i], node.bytesSentByTraffic[i]};
    const uint64_t frames = core_->replyFrames_[i];
    if (frames) out[labels[i] + "-reply"] = TrafficCount{frames, core_->replyBytes_[i]};
  }
  return out;
}

RemoteActorsStats RemoteActors::stats() const {
  RemoteActorsStats s;
  s.delivered = core_->counters_.delivered;
  s.undeliverable = core_->counters_.undeliverable;
  s.refused = core_->counters_.refused;
  s.peersDown = core_->counters_.peersDown;
  return s;
}

}  // namespace troupe::transport
