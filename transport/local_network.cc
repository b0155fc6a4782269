#include "transport/local_network.h"

#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "common/check.h"
#include "common/logging.h"
#include "transport/handshake.h"
#include "transport/internal/handshake_steps.h"
#include "transport/internal/control.h"
#include "transport/internal/links.h"
#include "transport/link_faults.h"

namespace troupe::transport {
namespace {

using Clock = std::chrono::steady_clock;
using namespace internal;

std::shared_ptr<spdlog::logger> log() {
  static auto l = logger("transport");
  return l;
}

using Bytes = std::shared_ptr<const std::vector<std::byte>>;

// One thing for a station's thread: a frame from a peer, a peer gone, or
// work posted by the station itself (a notice that must not run up a
// sender's stack).
struct Item {
  enum Type { kFrame, kDown, kWork } type = kFrame;
  uint64_t peer = 0;
  Bytes bytes;
  Departure how = Departure::kCrashed;
  Status why;
  std::function<void()> work;
};

struct Link {
  Clock::time_point lastReceived, lastSent;
};

thread_local bool t_delivering = false;

}  // namespace

// One node of the network: its state, its inbox and its thread.
class Station final : public std::enable_shared_from_this<Station> {
 public:
  Station(NodeOptions options, NodeHandler* handler, std::shared_ptr<LocalNetwork::Shared> net)
      : options_(std::move(options)), handler_(handler), net_(std::move(net)) {}

  Status init();
  void shutdown();

  uint64_t id() const { return options_.nodeId; }
  const NodeOptions& options() const { return options_; }
  uint16_t port() const { return port_; }
  std::string address() const { return fmt::format("{}:{}", options_.listenHost, port_); }

  void send(uint64_t peer, Envelope envelope, const std::vector<Tensor>& tensors) {
    envelope.sourceNode = options_.nodeId;
    bool gone;
    {
      std::lock_guard<std::mutex> lock(mu_);
      gone = down_.count(peer) != 0 || crashed_;
    }
    std::vector<TensorView> views;
    views.reserve(tensors.size());
    for (const Tensor& t : tensors) views.push_back(TensorView{t.data, t.bytes, t.dtype});
    if (envelope.traffic && envelope.traffic < kTrafficLabels && !gone) {
      // As the UCX node counts: the envelope part and the padded tensors.
      uint64_t total = encodeEnvelope(envelope, views).size();
      for (const Tensor& t : tensors) total += paddedTensorBytes(t.bytes);
      counters_.trafficFrames[envelope.traffic]++;
      counters_.trafficBytes[envelope.traffic] += total;
    }
    if (links_ && !gone) {  // (a frame for a peer that is gone is not kept)
      std::vector<Links::Wire> wires;
      links_->send(peer, std::move(envelope), tensors, true, Clock::now(), &wires);
      transmitWires(std::move(wires), true);
      return;
    }
    transmit(peer, std::make_shared<const std::vector<std::byte>>(encodeFrame(envelope, views)), true);
  }
  void sendRaw(uint64_t peer, std::vector<std::byte> frame) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!peers_.count(peer)) return;  // only over a link that exists
    }
    transmit(peer, std::make_shared<const std::vector<std::byte>>(std::move(frame)), false);
  }

  // Called by the network, holding its mutex (never the other way round).
  bool enqueue(Item item) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_ || (crashed_ && item.type == Item::kFrame)) return false;
      inbox_.push_back(std::move(item));
    }
    cv_.notify_one();
    return true;
  }
  void addLink(uint64_t peer) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = Clock::now();
    peers_.try_emplace(peer, Link{now, now});
  }
  bool linkedTo(uint64_t peer) {
    std::lock_guard<std::mutex> lock(mu_);
    return peers_.count(peer) != 0;
  }
  // crash(): drops what waits, tells its own handler every link went.
  std::vector<uint64_t> crash() {
    std::vector<uint64_t> peers;
    {
      std::lock_guard<std::mutex> lock(mu_);
      crashed_ = true;
      frozen_ = false;
      held_.clear();
      std::deque<Item> keep;
      for (auto& i : inbox_) {
        if (i.type != Item::kFrame) keep.push_back(std::move(i));
      }
      inbox_.swap(keep);
      for (auto& [p, l] : peers_) peers.push_back(p);
      for (uint64_t p : peers) {
        inbox_.push_back(Item{Item::kDown, p, nullptr, Departure::kCrashed,
                              Status::unavailable("this node crashed: its network is gone"), {}});
      }
    }
    cv_.notify_one();
    return peers;
  }
  void setFrozen(bool frozen) {
    std::vector<std::pair<uint64_t, Bytes>> held;
    {
      std::lock_guard<std::mutex> lock(mu_);
      frozen_ = frozen;
      if (!frozen) held.swap(held_);
    }
    cv_.notify_one();
    for (auto& [peer, bytes] : held) transmit(peer, std::move(bytes), true);
  }

  bool pollOnce();
  std::vector<Member> members() const {
    std::lock_guard<std::mutex> lock(membersMutex_);
    return members_;
  }
  Status waitForMembers(size_t count, std::chrono::milliseconds timeout) const {
    std::unique_lock<std::mutex> lock(membersMutex_);
    if (!membersChanged_.wait_for(lock, timeout,
                                  [&] { return members_.size() >= count || !bootstrapError_.isOk(); })) {
      return Status::timeout(
          fmt::format("{} of {} members joined within {} ms", members_.size(), count, timeout.count()));
    }
    if (members_.size() >= count) return Status::ok();
    return bootstrapError_;
  }
  NodeStats stats() const {
    NodeStats s;
    s.framesSent = counters_.framesSent;
    s.framesReceived = counters_.framesReceived;
    s.bytesSent = counters_.bytesSent;
    s.bytesReceived = counters_.bytesReceived;
    s.malformedDropped = counters_.malformed;
    s.unauthenticatedDropped = counters_.unauthenticated;
    s.handshakesRefused = counters_.refused;
    s.heartbeatsSent = counters_.heartbeats;
    s.peersDown = counters_.peersDown;
    for (size_t i = 0; i < kTrafficLabels; ++i) {
      s.framesSentByTraffic[i] = counters_.trafficFrames[i];
      s.bytesSentByTraffic[i] = counters_.trafficBytes[i];
    }
    if (links_) addLinkStats(links_->stats(), &s);
    return s;
  }
  void countRefusal() { counters_.refused++; }
  Status setLinkFaults(std::shared_ptr<LinkFaults> faults) {
    if (!links_) return Status::invalidArgument("message faults need reliable links (transport.reliable_links = true)");
    links_->setFaults(std::move(faults));
    return Status::ok();
  }

 private:
  void run();
  // Hands `bytes` to `peer` (a user frame when `user`): links first, holds
  // it while frozen, reports an undeliverable one as the peer going down.
  void transmit(uint64_t peer, Bytes bytes, bool user);
  void transmitWires(std::vector<Links::Wire> wires, bool user) {
    for (auto& w : wires) {
      if (w.raw) {
        flipFrameBits(&w.bytes, w.flipBits);
        transmit(w.peer, std::make_shared<const std::vector<std::byte>>(std::move(w.bytes)), user);
        continue;
      }
      std::vector<TensorView> views;
      views.reserve(w.tensors.size());
      for (const Tensor& t : w.tensors) views.push_back(TensorView{t.data, t.bytes, t.dtype});
      const bool isUser = user && w.envelope.kind >= kFirstUserKind;
      transmit(w.peer, std::make_shared<const std::vector<std::byte>>(encodeFrame(w.envelope, views)), isUser);
    }
  }
  // A decoded frame, in order: the transport's own, or the handler's.
  void dispatch(uint64_t peer, DecodedFrame frame, const std::shared_ptr<const void>& owner, size_t bytes);
  void post(std::function<void()> work) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      inbox_.push_back(Item{Item::kWork, 0, nullptr, Departure::kCrashed, Status::ok(), std::move(work)});
    }
    cv_.notify_one();
  }
  void notifyDown(uint64_t peer, Departure how, Status why) {
    post([this, peer, how, why] { handler_->onPeerDown(peer, how, why); });
  }
  void handle(Item& item);
  void handleFrame(uint64_t peer, const Bytes& bytes);
  void handleControl(uint64_t peer, const DecodedFrame& frame);
  // `peer` is gone: once, on the station's thread.
  void peerDown(uint64_t peer, Departure how, const Status& why);
  void onTimer(Clock::time_point now);
  void linkTimer(Clock::time_point now);
  void tryJoin(Clock::time_point now);
  void sendControl(uint64_t peer, uint16_t kind, std::string body) {
    Envelope e;
    e.kind = kind;
    e.body = std::move(body);
    e.sourceNode = options_.nodeId;
    if (links_) {
      std::vector<Links::Wire> wires;
      links_->send(peer, std::move(e), {}, linkSequenced(kind), Clock::now(), &wires);
      transmitWires(std::move(wires), false);
      return;
    }
    transmit(peer, std::make_shared<const std::vector<std::byte>>(encodeFrame(e, {})), false);
  }
  void broadcastMembers();
  void setMembers(std::vector<Member> members) {
    {
      std::lock_guard<std::mutex> lock(membersMutex_);
      members_ = members;
    }
    membersChanged_.notify_all();
    handler_->onMembers(members);
  }
  void failBootstrap(Status why) {
    {
      std::lock_guard<std::mutex> lock(membersMutex_);
      bootstrapError_ = std::move(why);
    }
    membersChanged_.notify_all();
  }
  void dropMalformed(uint64_t peer, const std::string& why) {
    const uint64_t n = ++counters_.malformed;
    if (n <= 10 || n % 1000 == 0) log()->warn("dropped malformed message #{} from node {:x}: {}", n, peer, why);
  }

  NodeOptions options_;
  NodeHandler* handler_;
  std::shared_ptr<LocalNetwork::Shared> net_;
  uint16_t port_ = 0;

  // Guards the inbox, the links and the flags.
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> inbox_;
  std::map<uint64_t, Link> peers_;
  std::unique_ptr<Links> links_;  // reliable links, when asked for
  std::map<uint64_t, Departure> down_;
  std::vector<std::pair<uint64_t, Bytes>> held_;  // sent while frozen
  bool stop_ = false, crashed_ = false, frozen_ = false;
  // Held while the handler is called (the thread, or pollOnce), so frames
  // are handled one at a time and in order.
  std::mutex deliver_;
  std::thread thread_;

  // Station-thread state.
  uint64_t coordinatorId_ = 0;
  std::map<uint64_t, Member> membership_;  // coordinator
  Clock::time_point nextTimer_{}, joinDeadline_{}, nextJoin_{};
  bool joining_ = false;

  mutable std::mutex membersMutex_;
  mutable std::condition_variable membersChanged_;
  std::vector<Member> members_;
  Status bootstrapError_;

  struct Counters {
    std::atomic<uint64_t> framesSent{0}, framesReceived{0}, bytesSent{0}, bytesReceived{0}, malformed{0},
        unauthenticated{0}, refused{0}, heartbeats{0}, peersDown{0};
    std::array<std::atomic<uint64_t>, kTrafficLabels> trafficFrames{}, trafficBytes{};
  } counters_;
};

// The network's registry of stations.
class LocalNetwork::Shared {
 public:
  std::mutex mu;
  std::map<uint64_t, std::shared_ptr<Station>> stations;
  std::map<std::string, uint64_t> byAddress;
  uint16_t nextPort = 40000;

  std::shared_ptr<Station> find(uint64_t id) {
    auto it = stations.find(id);
    return it == stations.end() ? nullptr : it->second;
  }

  // Registers `s` at its address; returns the port it got.
  Expected<uint16_t> add(const std::shared_ptr<Station>& s, const std::string& host, uint16_t port) {
    std::lock_guard<std::mutex> lock(mu);
    if (stations.count(s->id())) return Status::invalidArgument(fmt::format("node id {:x} is taken", s->id()));
    if (port == 0) {
      for (int i = 0; i < 65536 && byAddress.count(fmt::format("{}:{}", host, nextPort)); ++i) {
        nextPort = nextPort == 65535 ? 40000 : nextPort + 1;
      }
      port = nextPort;
      nextPort = nextPort == 65535 ? 40000 : nextPort + 1;
    }
    const std::string address = fmt::format("{}:{}", host, port);
    if (byAddress.count(address)) {
      return Status::unavailable(fmt::format("transport: cannot listen on {}: the address is in use", address));
    }
    byAddress[address] = s->id();
    stations[s->id()] = s;
    return port;
  }
  void remove(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = stations.find(id);
    if (it == stations.end()) return;
    byAddress.erase(it->second->address());
    stations.erase(it);
  }

  // A link between a and b, both ways, after the token check (the
  // handshake's outcome without its messages).
  Status link(Station& a, uint64_t b, Departure* how) {
    std::lock_guard<std::mutex> lock(mu);
    auto other = find(b);
    if (!other) {
      *how = Departure::kUnreachable;
      return Status::notFound(fmt::format("node {:x} is not a member of the job", b));
    }
    // The node's own handshake, its messages handed across in memory.
    internal::ClientHandshake client(a.options().token, a.id(), randomNonce());
    internal::ServerHandshake server(other->options().token, b, randomNonce());
    auto challenge = server.challenge(client.hello());
    auto proof = challenge.hasValue() ? client.proof(*challenge) : Expected<std::string>(challenge.status());
    if (!proof.hasValue() || !server.verify(*proof).isOk()) {
      other->countRefusal();
      *how = Departure::kRefused;
      return Status::unavailable(fmt::format("node {:x} does not hold the job token", b));
    }
    a.addLink(b);
    other->addLink(a.id());
    return Status::ok();
  }

  bool push(uint64_t to, Item item) {
    std::lock_guard<std::mutex> lock(mu);
    auto s = find(to);
    return s && s->enqueue(std::move(item));
  }

  std::shared_ptr<Station> at(const std::string& address) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = byAddress.find(address);
    return it == byAddress.end() ? nullptr : find(it->second);
  }
};

// ---------------------------------------------------------------- Station

Status Station::init() {
  if (Status st = checkNodeOptions(&options_); !st.isOk()) return st;
  if (options_.listenHost.empty()) return Status::invalidArgument("transport: the listen host is empty");
  if (options_.reliableLinks || options_.linkFaults) {
    links_ = std::make_unique<Links>(options_.nodeId, Links::Options{}, options_.linkFaults);
  }
  if (!options_.coordinator.empty()) {
    auto hp = parseHostPort(options_.coordinator);
    if (!hp.hasValue()) return Status::invalidArgument(fmt::format("transport coordinator: {}", hp.status().message()));
    options_.coordinator = fmt::format("{}:{}", hp->first, hp->second);
  }
  auto port = net_->add(shared_from_this(), options_.listenHost, options_.listenPort);
  if (!port.hasValue()) return port.status();
  port_ = *port;
  if (options_.isCoordinator) {
    membership_[options_.nodeId] = Member{options_.nodeId, options_.role, options_.listenHost, port_};
    std::lock_guard<std::mutex> lock(membersMutex_);
    members_ = {membership_[options_.nodeId]};
  }
  if (!options_.coordinator.empty()) {
    joining_ = true;
    joinDeadline_ = Clock::now() + options_.joinTimeout;
  }
  log()->debug("node {:x} ({}) in the in-process network at {}", options_.nodeId, options_.role, address());
  thread_ = std::thread([this] { run(); });
  return Status::ok();
}

void Station::shutdown() {
  if (!thread_.joinable()) return;
  std::vector<uint64_t> peers;
  bool crashed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    crashed = crashed_;
    for (auto& [p, l] : peers_) peers.push_back(p);
  }
  if (!crashed) {
    for (uint64_t p : peers) sendControl(p, kGoodbye, encodeEmpty());
  }
  net_->remove(options_.nodeId);
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

void Station::transmit(uint64_t peer, Bytes bytes, bool user) {
  bool linked;
  std::optional<Departure> gone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (crashed_ || stop_) return;
    if (auto d = down_.find(peer); d != down_.end()) {
      gone = d->second;
    } else if (frozen_) {
      held_.emplace_back(peer, std::move(bytes));
      return;
    }
    linked = peers_.count(peer) != 0;
  }
  if (gone) {
    if (user) {
      notifyDown(peer, *gone,
                 Status::unavailable(fmt::format("node {:x} is down ({})", peer, departureName(*gone))));
    }
    return;
  }
  if (!linked) {
    Departure how = Departure::kUnreachable;
    Status st = peer == options_.nodeId ? Status::notFound(fmt::format("node {:x} is this node", peer))
                                        : net_->link(*this, peer, &how);
    if (!st.isOk()) {
      if (how == Departure::kRefused) counters_.refused++;
      log()->warn("node {:x}: cannot reach node {:x}: {}", options_.nodeId, peer, st.message());
      {
        std::lock_guard<std::mutex> lock(mu_);
        down_[peer] = how;
      }
      notifyDown(peer, how, st);
      return;
    }
  }
  const size_t size = bytes->size();
  if (!net_->push(peer, Item{Item::kFrame, options_.nodeId, std::move(bytes), {}, {}, {}})) {
    // Gone between the link and now: as an endpoint error would say.
    std::lock_guard<std::mutex> lock(mu_);
    inbox_.push_back(Item{Item::kDown, peer, nullptr, Departure::kCrashed,
                          Status::unavailable(fmt::format("send to node {:x} failed: it is gone", peer)), {}});
    cv_.notify_one();
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto l = peers_.find(peer); l != peers_.end()) l->second.lastSent = Clock::now();
  }
  if (user) {
    counters_.framesSent++;
    counters_.bytesSent += size;
  }
}

void Station::run() {
  while (true) {
    std::unique_lock<std::mutex> lock(mu_);
    Clock::duration wait = std::max(std::chrono::milliseconds(1), options_.heartbeatInterval / 4);
    if (joining_) wait = std::min<Clock::duration>(wait, std::chrono::milliseconds(20));
    if (links_ && !frozen_) {  // (frozen, nothing is due)
      if (auto due = links_->nextDue()) {
        wait = std::min<Clock::duration>(wait, std::max<Clock::duration>(*due - Clock::now(), Clock::duration(0)));
      }
    }
    cv_.wait_for(lock, wait, [&] { return stop_ || (!frozen_ && !inbox_.empty()); });
    if (stop_) return;
    if (frozen_) continue;
    lock.unlock();
    std::lock_guard<std::mutex> delivering(deliver_);
    t_delivering = true;
    for (int n = 0; n < 64; ++n) {
      Item item;
      {
        std::lock_guard<std::mutex> l(mu_);
        if (inbox_.empty() || frozen_ || stop_) break;
        item = std::move(inbox_.front());
        inbox_.pop_front();
      }
      handle(item);
    }
    const auto now = Clock::now();
    if (joining_ && now >= nextJoin_) tryJoin(now);
    if (now >= nextTimer_) {
      onTimer(now);
    } else if (links_) {
      if (auto due = links_->nextDue(); due && *due <= now) linkTimer(now);
    }
    t_delivering = false;
  }
}

bool Station::pollOnce() {
  if (t_delivering || !deliver_.try_lock()) return false;
  std::lock_guard<std::mutex> delivering(deliver_, std::adopt_lock);
  t_delivering = true;
  bool worked = false;
  for (int n = 0; n < 64; ++n) {
    Item item;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (inbox_.empty() || frozen_ || stop_) break;
      item = std::move(inbox_.front());
      inbox_.pop_front();
    }
    handle(item);
    worked = true;
  }
  t_delivering = false;
  return worked;
}

void Station::handle(Item& item) {
  switch (item.type) {
    case Item::kWork:
      item.work();
      return;
    case Item::kDown: {
      bool known;
      {
        std::lock_guard<std::mutex> lock(mu_);
        known = peers_.count(item.peer) != 0 || !down_.count(item.peer);
      }
      if (known) peerDown(item.peer, item.how, item.why);
      return;
    }
    case Item::kFrame:
      handleFrame(item.peer, item.bytes);
      return;
  }
}

void Station::handleFrame(uint64_t peer, const Bytes& bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (crashed_ || down_.count(peer)) return;  // it is gone for us
    auto l = peers_.find(peer);
    if (l == peers_.end()) {
      counters_.unauthenticated++;
      return;
    }
    l->second.lastReceived = Clock::now();
  }
  if (bytes->size() > options_.maxFrameBytes) {
    dropMalformed(peer, fmt::format("a message of {} bytes is over the limit of {} (transport.max_message_mb)",
                                    bytes->size(), options_.maxFrameBytes));
    return;
  }
  auto decoded = decodeFrame(bytes->data(), bytes->size());
  if (!decoded.hasValue()) {
    dropMalformed(peer, decoded.status().message());
    return;
  }
  if (links_) {
    std::vector<Links::Delivery> deliveries;
    std::vector<Links::Wire> wires;
    links_->receive(peer, std::move(*decoded), bytes, Clock::now(), &deliveries, &wires);
    transmitWires(std::move(wires), false);
    for (auto& d : deliveries) dispatch(peer, std::move(d.frame), d.owner, bytes->size());
    return;
  }
  dispatch(peer, std::move(*decoded), bytes, bytes->size());
}

void Station::dispatch(uint64_t peer, DecodedFrame frame, const std::shared_ptr<const void>& owner, size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (crashed_ || down_.count(peer)) return;  // it went while this frame waited
  }
  if (frame.envelope.kind < kFirstUserKind) {
    handleControl(peer, frame);
    return;
  }
  if (frame.envelope.sourceNode != peer) {
    dropMalformed(peer, fmt::format("claims to come from node {:x}", frame.envelope.sourceNode));
    return;
  }
  counters_.framesReceived++;
  counters_.bytesReceived += bytes;
  frame.wireBytes = bytes;
  handler_->onFrame(peer, std::move(frame), owner);
}

void Station::handleControl(uint64_t peer, const DecodedFrame& frame) {
  const std::string& body = frame.envelope.body;
  switch (frame.envelope.kind) {
    case kHeartbeat:
      return;  // lastReceived is set
    case kGoodbye:
      return peerDown(peer, Departure::kLeft, Status::unavailable(fmt::format("node {:x} left the job", peer)));
    case kJoin: {
      if (!options_.isCoordinator) return dropMalformed(peer, "join sent to a node that is not the coordinator");
      auto member = decodeJoin(body);
      if (!member.hasValue()) return dropMalformed(peer, member.status().message());
      if (member->nodeId != peer) return dropMalformed(peer, fmt::format("join for node {:x}", member->nodeId));
      membership_[peer] = *member;
      log()->info("node {:x} ({}) joined from {}:{}", peer, member->role, member->host, member->port);
      return broadcastMembers();
    }
    case kMembers: {
      if (peer != coordinatorId_) return dropMalformed(peer, "member list from a node that is not the coordinator");
      auto list = decodeMembers(body);
      if (!list.hasValue()) return dropMalformed(peer, list.status().message());
      return setMembers(std::move(list->members));
    }
    default:
      return dropMalformed(peer, fmt::format("unexpected control kind {}", frame.envelope.kind));
  }
}

void Station::peerDown(uint64_t peer, Departure how, const Status& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (down_.count(peer)) return;
    down_[peer] = how;
    peers_.erase(peer);
  }
  if (links_) links_->forget(peer);
  counters_.peersDown++;
  if (how == Departure::kLeft) {
    log()->info("node {:x}: node {:x} left the job", options_.nodeId, peer);
  } else {
    log()->warn("node {:x}: node {:x} is down: {}", options_.nodeId, peer, why.message());
  }
  if (options_.isCoordinator && membership_.erase(peer)) broadcastMembers();
  if (peer == coordinatorId_ && joining_) {
    joining_ = false;
    failBootstrap(Status::unavailable(fmt::format("could not join the coordinator at {}: {}", options_.coordinator,
                                                  why.message())));
  }
  handler_->onPeerDown(peer, how, why);
}

void Station::onTimer(Clock::time_point now) {
  nextTimer_ = now + std::max(std::chrono::milliseconds(1), options_.heartbeatInterval / 4);
  std::vector<uint64_t> beat;
  std::vector<std::pair<uint64_t, int64_t>> silent;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (crashed_) return;
    for (auto& [peer, l] : peers_) {
      if (now - l.lastReceived > options_.heartbeatTimeout) {
        silent.emplace_back(peer, std::chrono::duration_cast<std::chrono::milliseconds>(now - l.lastReceived).count());
      } else if (now - l.lastSent >= options_.heartbeatInterval) {
        beat.push_back(peer);
      }
    }
  }
  for (uint64_t peer : beat) {
    sendControl(peer, kHeartbeat, encodeEmpty());
    counters_.heartbeats++;
  }
  linkTimer(now);
  for (auto [peer, ms] : silent) {
    // It will find the link closed, as a UCX endpoint closed under it.
    net_->push(peer, Item{Item::kDown, options_.nodeId, nullptr, Departure::kCrashed,
                          Status::unavailable(fmt::format("node {:x} closed the link", options_.nodeId)), {}});
    peerDown(peer, Departure::kTimedOut,
             Status::timeout(fmt::format("no message or heartbeat from node {:x} for {} ms", peer, ms)));
  }
}

void Station::linkTimer(Clock::time_point now) {
  if (!links_) return;
  std::vector<Links::Wire> wires;
  std::vector<std::pair<uint64_t, Status>> lost;
  links_->tick(now, &wires, &lost);
  transmitWires(std::move(wires), true);
  for (auto& [peer, why] : lost) {
    net_->push(peer, Item{Item::kDown, options_.nodeId, nullptr, Departure::kCrashed,
                          Status::unavailable(fmt::format("node {:x} closed the link", options_.nodeId)), {}});
    peerDown(peer, Departure::kCrashed, why);
  }
}

void Station::tryJoin(Clock::time_point now) {
  nextJoin_ = now + std::chrono::milliseconds(20);
  auto coord = net_->at(options_.coordinator);
  if (!coord) {
    if (now >= joinDeadline_) {
      joining_ = false;
      failBootstrap(Status::unavailable(fmt::format("could not join the coordinator at {}: nobody listens there",
                                                    options_.coordinator)));
    }
    return;
  }
  joining_ = false;
  Departure how = Departure::kUnreachable;
  Status st = net_->link(*this, coord->id(), &how);
  if (!st.isOk()) {
    if (how == Departure::kRefused) log()->error("refused by {}: wrong job token", options_.coordinator);
    failBootstrap(Status::unavailable(
        fmt::format("could not join the coordinator at {}: refused by {}: {}", options_.coordinator,
                    options_.coordinator, how == Departure::kRefused ? "wrong job token" : st.message())));
    return;
  }
  coordinatorId_ = coord->id();
  sendControl(coordinatorId_, kJoin, encodeJoin(Member{options_.nodeId, options_.role, options_.listenHost, port_}));
}

void Station::broadcastMembers() {
  MemberList list;
  for (auto& [id, m] : membership_) list.members.push_back(m);
  setMembers(list.members);
  const std::string body = encodeMembers(list);
  for (const Member& m : list.members) {
    if (m.nodeId != options_.nodeId && linkedTo(m.nodeId)) sendControl(m.nodeId, kMembers, body);
  }
}

// ---------------------------------------------------------------- LocalNode

namespace {

class LocalNode final : public Node {
 public:
  explicit LocalNode(std::shared_ptr<Station> s) : s_(std::move(s)) {}
  ~LocalNode() override { s_->shutdown(); }

  uint64_t id() const override { return s_->id(); }
  const std::string& role() const override { return s_->options().role; }
  uint16_t port() const override { return s_->port(); }
  std::string address() const override { return s_->address(); }
  void send(uint64_t peer, Envelope envelope, std::vector<Tensor> tensors) override {
    s_->send(peer, std::move(envelope), tensors);
  }
  void sendRawFrame(uint64_t peer, std::vector<std::byte> frame) override { s_->sendRaw(peer, std::move(frame)); }
  std::vector<Member> members() const override { return s_->members(); }
  Status waitForMembers(size_t count, std::chrono::milliseconds timeout) const override {
    return s_->waitForMembers(count, timeout);
  }
  NodeStats stats() const override { return s_->stats(); }
  Status setLinkFaults(std::shared_ptr<LinkFaults> faults) override { return s_->setLinkFaults(std::move(faults)); }
  bool pollOnce() override { return s_->pollOnce(); }
  void beginPolling() override {}
  void endPolling() override {}
  void handBackProgress(bool) override {}

 private:
  std::shared_ptr<Station> s_;
};

}  // namespace

Expected<std::unique_ptr<Node>> startLocalNode(NodeOptions options, NodeHandler* handler) {
  TROUPE_CHECK(handler != nullptr && options.network != nullptr, "startLocalNode needs a handler and a network");
  if (options.integrity != Integrity::kCrc32c) {
    return Status::invalidArgument(fmt::format(
        "transport.integrity = {}: the in-process network carries frames in memory and checks a CRC32C only",
        integrityName(options.integrity)));
  }
  auto shared = options.network->shared_;
  options.network.reset();  // a node must not keep its network alive through itself
  auto station = std::make_shared<Station>(std::move(options), handler, shared);
  Status st = station->init();
  if (!st.isOk()) return st;
  return std::unique_ptr<Node>(new LocalNode(std::move(station)));
}

// ---------------------------------------------------------------- LocalNetwork

LocalNetwork::LocalNetwork() : shared_(std::make_shared<Shared>()) {}
LocalNetwork::~LocalNetwork() = default;

std::shared_ptr<LocalNetwork> LocalNetwork::create() { return std::shared_ptr<LocalNetwork>(new LocalNetwork()); }

bool LocalNetwork::crash(uint64_t node) {
  std::lock_guard<std::mutex> lock(shared_->mu);
  auto s = shared_->find(node);
  if (!s) return false;
  log()->warn("in-process network: node {:x} crashes", node);
  shared_->byAddress.erase(s->address());
  shared_->stations.erase(node);
  for (uint64_t peer : s->crash()) {
    if (auto p = shared_->find(peer)) {
      p->enqueue(Item{Item::kDown, node, nullptr, Departure::kCrashed,
                      Status::unavailable(fmt::format("endpoint to node {:x} failed: it crashed", node)), {}});
    }
  }
  // The crashed station lives on (its node object owns it) only to tell its
  // own handler; nobody reaches it any more.
  return true;
}

bool LocalNetwork::freeze(uint64_t node) { return setFrozen(node, true); }

bool LocalNetwork::thaw(uint64_t node) { return setFrozen(node, false); }

bool LocalNetwork::setFrozen(uint64_t node, bool frozen) {
  std::shared_ptr<Station> s;
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    s = shared_->find(node);
  }
  if (!s) return false;
  s->setFrozen(frozen);  // (outside the network's lock: a thaw sends what waited)
  return true;
}

std::vector<uint64_t> LocalNetwork::nodes() const {
  std::lock_guard<std::mutex> lock(shared_->mu);
  std::vector<uint64_t> ids;
  for (auto& [id, s] : shared_->stations) ids.push_back(id);
  return ids;
}

}  // namespace troupe::transport
