// UcxNode, the UCX implementation of Node, and its Impl, shared by node.cc (set-up, progress, endpoints, sending and
// receiving) and node_control.cc (handshake, heartbeat, goodbye and
// membership messages). Private to transport/.
//
// Threading: the private state is touched only with workerMutex_ held (by
// the progress thread, or by a sender that took it).
#pragma once

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include <ucp/api/ucp.h>

#include "common/check.h"
#include "common/logging.h"
#include "transport/buffer_pool.h"
#include "transport/handshake.h"
#include "transport/internal/control.h"
#include "transport/internal/frame_buffers.h"
#include "transport/internal/handshake_steps.h"
#include "transport/internal/links.h"
#include "transport/node.h"

namespace troupe::transport {
namespace internal {

using Clock = std::chrono::steady_clock;

constexpr unsigned kAmId = 7;
// A peer that has not finished the handshake may send only this much.
constexpr size_t kMaxUnauthenticatedFrame = 4096;

inline std::shared_ptr<spdlog::logger> log() {
  static auto l = logger("transport");
  return l;
}

inline std::string ucsError(ucs_status_t s) { return ucs_status_string(s); }

inline std::string sockaddrHost(const sockaddr_storage& ss) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (ss.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&ss)->sin_addr, host, sizeof(host));
  } else if (ss.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_addr, host, sizeof(host));
  }
  return host;
}

inline std::string sockaddrText(const sockaddr_storage& ss) {
  char host[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (ss.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    port = ntohs(in->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    const auto* in = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &in->sin6_addr, host, sizeof(host));
    port = ntohs(in->sin6_port);
  }
  return fmt::format("{}:{}", host, port);
}

// Whether `addr` belongs to this machine (loopback or one of its interfaces,
// as this network namespace sees them).
inline bool isLocalAddress(in_addr addr) {
  if ((ntohl(addr.s_addr) >> 24) == 127) return true;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return false;
  bool local = false;
  for (ifaddrs* i = list; i != nullptr && !local; i = i->ifa_next) {
    if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET) {
      local = reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr == addr.s_addr;
    }
  }
  freeifaddrs(list);
  return local;
}

inline Expected<sockaddr_in> ipv4Address(const std::string& host, uint16_t port) {
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_port = htons(port);
  const std::string h = host == "localhost" ? "127.0.0.1" : host;
  if (inet_pton(AF_INET, h.c_str(), &sin.sin_addr) != 1) {
    return Status::invalidArgument(fmt::format("'{}' is not an IPv4 address", host));
  }
  return sin;
}

}  // namespace internal

using namespace internal;

class UcxNode final : public Node {
 public:
  class Impl;
  explicit UcxNode(std::unique_ptr<Impl> impl);
  ~UcxNode() override;

  uint64_t id() const override;
  const std::string& role() const override;
  uint16_t port() const override;
  std::string address() const override;
  void send(uint64_t peer, Envelope envelope, std::vector<Tensor> tensors) override;
  void sendRawFrame(uint64_t peer, std::vector<std::byte> frame) override;
  std::vector<Member> members() const override;
  Status waitForMembers(size_t count, std::chrono::milliseconds timeout) const override;
  NodeStats stats() const override;
  Status setLinkFaults(std::shared_ptr<LinkFaults> faults) override;
  bool pollOnce() override;
  void beginPolling() override;
  void endPolling() override;
  void handBackProgress(bool now) override;

 private:
  std::unique_ptr<Impl> impl_;
};

class UcxNode::Impl {
 public:
  Impl(NodeOptions options, NodeHandler* handler) : options_(std::move(options)), handler_(handler) {}
  ~Impl() { shutdown(); }

  Status init();
  void shutdown();

  // --- public side (any thread) ---
  void post(std::function<void()> work) {
    TROUPE_CHECK(work != nullptr, "post of an empty function");  // (an empty one marks a send)
    Work w;
    w.fn = std::move(work);
    enqueue(std::move(w));
  }

  // Sends on the calling thread when it can take the worker at once and
  // nothing waits in the queue (saves a hand-off to the progress thread);
  // otherwise queues behind what waits, so one thread's sends stay in
  // order. The queue is not run here: what waits there may be a handler's
  // call (a peer down, new members), which must not run up the stack of a
  // caller's send (the caller may hold locks of its own; RemoteActors holds
  // its node's).
  void sendNowOrPost(uint64_t peer, Envelope e, std::vector<Tensor> t) {
    if (!t_polling && !queued_.load(std::memory_order_seq_cst) && workerMutex_.try_lock()) {
      std::unique_lock<std::mutex> lock(workerMutex_, std::adopt_lock);
      if (!queued_.load(std::memory_order_seq_cst)) {
        sendTo(peer, std::move(e), std::move(t));
        closeEndpoints();  // (a failed send closes its connection; this thread is not in progress)
        if (pendingSends_.load() > 0 && sleeping_.load(std::memory_order_seq_cst)) wake();
        return;
      }
    }
    // (A send waits as itself, not in a closure: no allocation per send.)
    Work w;
    w.peer = peer;
    w.envelope = std::move(e);
    w.tensors = std::move(t);
    enqueue(std::move(w));
  }
  // A frame as it is (Node::sendRawFrame), or, with `flips`, a frame a
  // fault plan corrupts: guarded as the connection's frames are, then
  // those bits flipped.
  void sendRawBytes(uint64_t peer, std::vector<std::byte> bytes, const std::vector<uint64_t>* flips = nullptr);
  bool pollOnce();
  void beginPolling() { pollers_.fetch_add(1, std::memory_order_acq_rel); }
  void endPolling() {
    // A caller that found its frame will likely poll again soon (the next
    // step of a collective): the progress thread stays backed off a while.
    lastPolled_.store(Clock::now().time_since_epoch().count(), std::memory_order_release);
    pollers_.fetch_sub(1, std::memory_order_acq_rel);
  }
  void handBackProgress(bool now) {
    lastPolled_.store(0, std::memory_order_release);
    if (now && pollers_.load(std::memory_order_acquire) == 0 && sleeping_.load(std::memory_order_seq_cst)) wake();
  }
  // Whether a caller drives progress now or did within the last `window`.
  bool callerPolling(Clock::time_point now, std::chrono::microseconds window) const {
    if (pollers_.load(std::memory_order_acquire) > 0) return true;
    const int64_t last = lastPolled_.load(std::memory_order_acquire);
    return last != 0 && now.time_since_epoch().count() - last < std::chrono::duration_cast<Clock::duration>(window).count();
  }
  void wake() {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(eventFd_, &one, sizeof(one));
  }

  NodeOptions options_;
  NodeHandler* handler_;
  uint16_t port_ = 0;

  mutable std::mutex membersMutex_;
  mutable std::condition_variable membersChanged_;
  std::vector<Member> members_;
  Status bootstrapError_;  // why joining the coordinator failed, if it did

  struct Counters {
    std::atomic<uint64_t> framesSent{0}, framesReceived{0}, bytesSent{0}, bytesReceived{0}, malformed{0},
        unauthenticated{0}, refused{0}, heartbeats{0}, peersDown{0}, handshakesTimedOut{0}, idleClosed{0},
        handshakesAbandoned{0}, connectionRequests{0}, sealsRefused{0},
        unsealedRefused{0}, framesHandedOver{0};
    std::array<std::atomic<uint64_t>, kTrafficLabels> trafficFrames{}, trafficBytes{};
  } counters_;

 private:
  enum class State { kHelloSent, kProofSent, kAwaitHello, kAwaitProof, kReady, kClosed };

  struct Incoming {
    std::shared_ptr<uint64_t[]> storage;  // 8-byte aligned, not zeroed
    size_t bytes = 0;
    bool complete = false;
  };

  struct Connection {
    ucp_ep_h ep = nullptr;
    State state = State::kHelloSent;
    bool outgoing = false;
    std::string address;    // the far side, for logs
    std::string host;       // the far side's address without its port (accepted connections)
    uint64_t peerId = 0;    // known after the hello
    bool refused = false;   // a handshake refusal, either way: no retry
    bool sameHost = false;  // the far side is on this machine
    bool left = false;      // the far side said goodbye
    bool goodbyeSent = false;  // this side said goodbye (it is leaving)
    bool saidGoodbye = false;  // ... and waits for the answer (the peer is not down)
    bool inFarewell = false;   // counted in farewellsOpen_
    uint64_t serial = 0;    // unique per connection of this node
    std::optional<Clock::time_point> closeAt;  // a refusal: force-close then
    Status closeWhy;  // what closing then says (ok: nothing; a refusal this side made as a client: why)
    std::optional<ClientHandshake> client;  // outgoing: this side's handshake
    std::optional<ServerHandshake> server;  // accepted: after its hello
    Clock::time_point opened, lastReceived, lastSent;
    std::deque<std::shared_ptr<Incoming>> inbox;  // in arrival order
    std::vector<std::pair<Envelope, std::vector<Tensor>>> outbox;  // until ready
    std::vector<std::pair<std::vector<std::byte>, std::vector<uint64_t>>> rawOutbox;  // corrupted frames (a fault)
                                                                                       // and their flips, until ready
    // integrity = hmac: this connection's keys (set in the handshake: the
    // client's receive key when it makes its proof and its send key once
    // the proof is sent; the server's both when the proof verified, or its
    // send key alone to seal a refusal of the proof), the number of the
    // last frame sealed, and those received.
    std::unique_ptr<FrameMac> sendMac, recvMac;
    uint64_t sealed = 0;
    SealWindow seals;
  };

  // How this node guards the next frame it sends on `c`: the hello,
  // challenge, proof and a refusal before the proof carry a CRC; later
  // frames what transport.integrity says (hmac: sealed once this side holds
  // its send key: from the server's welcome, or its refusal of a proof, and
  // the client's first frame after its proof).
  Integrity sendGuard(const Connection* c) const {
    if (c->sendMac) return Integrity::kHmac;
    return c->state == State::kReady ? options_.integrity : Integrity::kCrc32c;
  }

  struct OutFrame {
    Impl* self = nullptr;
    std::vector<std::byte> head;
    std::vector<Tensor> tensors;
    std::vector<ucp_dt_iov_t> iov;
    std::array<std::byte, kSealBytes> seal{};
  };
  // A sent frame's storage is kept for the next send once UCX is done with
  // it (its vectors keep their capacity: no allocation per send), up to
  // kSpareFrames of them; one whose head is over kSpareHeadBytes, or that
  // held more than kSpareTensors tensors, is not kept.
  static constexpr size_t kSpareFrames = 64;
  static constexpr size_t kSpareHeadBytes = size_t{64} << 10;
  static constexpr size_t kSpareTensors = 16;
  std::unique_ptr<OutFrame> takeOutFrame() {
    if (spareFrames_.empty()) {
      auto out = std::make_unique<OutFrame>();
      out->self = this;
      return out;
    }
    auto out = std::move(spareFrames_.back());
    spareFrames_.pop_back();
    return out;
  }
  void giveBack(std::unique_ptr<OutFrame> out) {
    out->tensors.clear();  // their buffers go now, as before
    if (spareFrames_.size() >= kSpareFrames || out->head.capacity() > kSpareHeadBytes ||
        out->tensors.capacity() > kSpareTensors || out->iov.capacity() > 2 * kSpareTensors + 2) {
      return;
    }
    out->iov.clear();
    spareFrames_.push_back(std::move(out));
  }

  struct RecvOp {
    Impl* self;
    ucp_ep_h ep;
    uint64_t serial;  // UCX may reuse a closed endpoint's handle
    std::shared_ptr<Incoming> incoming;
  };

  void run();
  bool drainQueue();
  void onTimer(Clock::time_point now);

  Connection* connectionOf(ucp_ep_h ep) {
    auto it = connections_.find(ep);
    return it == connections_.end() ? nullptr : it->second.get();
  }
  // Runs a call of the handler on a polling thread: here if this is one,
  // else posted (never up the stack of a send from a caller that may hold
  // its own locks).
  void onPollingSide(std::function<void()> call) {
    if (t_polling) {
      call();
    } else {
      post(std::move(call));
    }
  }
  // The handler's onPeerDown, on a polling thread.
  void notifyPeerDown(uint64_t peer, Departure how, const Status& why) {
    onPollingSide([this, peer, how, why] { handler_->onPeerDown(peer, how, why); });
  }
  Status createEndpoint(const ucp_ep_params_t& params, Connection* c);
  void openConnection(const std::string& host, uint16_t port, uint64_t expectPeer);
  void sendRaw(Connection* c, Envelope envelope, std::vector<Tensor> tensors);
  void sendControl(Connection* c, uint16_t kind, std::string body);
  void sendTo(uint64_t peer, Envelope envelope, std::vector<Tensor> tensors);
  // sendTo's second half: over the peer's connection, or after connecting.
  void routeTo(uint64_t peer, Envelope envelope, std::vector<Tensor> tensors);
  void sendWire(Links::Wire w);
  bool isMember(uint64_t peer) const;
  // The next timer no later than the links' next due work (an ack, a
  // resend request, a delayed frame): with the worker mutex held.
  void clampTimer() {
    if (!links_) return;
    if (auto due = links_->nextDue()) {
      nextTimer_ = std::max(Clock::now() + std::chrono::microseconds(200), std::min(nextTimer_, *due));
    }
  }
  void closeConnection(Connection* c, const Status& why, bool peerDown);
  void refuse(Connection* c, const std::string& reason);
  bool isCoordinatorAddress(const std::string& address) const {
    return !coordinatorAddress_.empty() && address == coordinatorAddress_;
  }
  // options_.coordinator, parsed once at start ("host:port" as connections name it).
  std::string coordinatorHost_, coordinatorAddress_;
  uint16_t coordinatorPort_ = 0;
  void pumpInbox(Connection* c);
  void handleFrame(Connection* c, const std::shared_ptr<Incoming>& in);
  void handleControl(Connection* c, const DecodedFrame& frame);
  void becomeReady(Connection* c);
  // Says goodbye on `c` as this node leaves, and counts it as awaiting its answer.
  void sayGoodbye(Connection* c);
  // `c` in or out of farewellsOpen_ (each at most once).
  void holdFarewell(Connection* c) {
    if (c->inFarewell) return;
    c->inFarewell = true;
    farewellsOpen_++;
  }
  void releaseFarewell(Connection* c) {
    if (!c->inFarewell) return;
    c->inFarewell = false;
    farewellsOpen_--;
  }
  void broadcastMembers();
  void setMembers(std::vector<Member> members);
  void dropMalformed(Connection* c, const std::string& why);

  static ucs_status_t onAm(void* arg, const void* header, size_t headerLength, void* data, size_t length,
                           const ucp_am_recv_param_t* param);
  static void onRecvDone(void* request, ucs_status_t status, size_t length, void* user);
  static void onSendDone(void* request, ucs_status_t status, void* user);
  static void onEpError(void* arg, ucp_ep_h ep, ucs_status_t status);
  static void onConnRequest(ucp_conn_request_h request, void* arg);

  // Guards the UCX worker and every connection. The progress thread holds it
  // while it progresses and releases it while it sleeps; other threads take
  // it only to send.
  std::mutex workerMutex_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  ucp_listener_h listener_ = nullptr;
  int epollFd_ = -1, eventFd_ = -1, workerFd_ = -1;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> pendingSends_{0};  // sends UCX has not finished
  // Connections a leaving node waits for: said goodbye on and not yet
  // answered, or still in their handshake with frames held for them.
  std::atomic<int64_t> farewellsOpen_{0};
  bool leaving_ = false;  // shutdown has said goodbye (progress thread only)
  // Their requests: at shutdown those that never finish (a peer cut off:
  // TCP holds them) are cancelled before the worker goes, which UCX
  // requires of every endpoint it destroys.
  std::mutex inflightMutex_;
  std::unordered_set<void*> inflight_;
  void sent(void* request) {
    pendingSends_++;
    std::lock_guard<std::mutex> lock(inflightMutex_);
    inflight_.insert(request);
  }
  std::atomic<bool> sleeping_{false};
  std::atomic<int> pollers_{0};  // callers between beginPolling and endPolling
  std::atomic<int64_t> lastPolled_{0};  // Clock ticks of the last endPolling(false); 0: handed back
  // Set while this thread holds workerMutex_ to progress (the progress
  // thread or a caller in pollOnce): handler callbacks run here, and their
  // sends are queued instead of taking the mutex again.
  static thread_local bool t_polling;
  struct PollingScope {
    PollingScope() { t_polling = true; }
    ~PollingScope() { t_polling = false; }
  };
  std::atomic<bool> queued_{false};
  // Work for the progress side: a function, or (none) a send.
  struct Work {
    std::function<void()> fn;
    uint64_t peer = 0;
    Envelope envelope;
    std::vector<Tensor> tensors;
  };
  void enqueue(Work w) {
    {
      std::lock_guard<std::mutex> lock(queueMutex_);
      queue_.push_back(std::move(w));
      queued_.store(true, std::memory_order_seq_cst);
    }
    if (sleeping_.load(std::memory_order_seq_cst)) wake();
  }
  std::mutex queueMutex_;
  std::vector<Work> queue_;
  // What drainQueue runs, swapped with queue_ and emptied after (both keep
  // their capacity). Touched with workerMutex_ held, and drainQueue does not
  // nest: each of its callers first takes the worker.
  std::vector<Work> draining_;
  static constexpr size_t kKeptWork = 256;  // draining_'s capacity kept past a flood

  // Progress-thread state.
  std::unordered_map<ucp_ep_h, std::unique_ptr<Connection>> connections_;
  std::unordered_map<uint64_t, Connection*> byPeer_;      // the connection used to send to a peer
  // Outgoing, handshake in flight, holding what is sent to the peer
  // meanwhile; while no connection to the peer is ready (becomeReady: one
  // still in its handshake once another is ready is a spare, in neither map).
  std::unordered_map<uint64_t, Connection*> connecting_;
  std::unordered_map<uint64_t, Departure> downPeers_;  // and how each went
  // A peer was lost to silence (a partition, a stopped process): its
  // endpoint may hold requests UCX never finishes, and UCX 1.13 aborts
  // destroying such an endpoint (ucp_ep.c: proto_reqs not empty), so the
  // worker is then left to the process's exit.
  bool silentPeer_ = false;
  std::vector<void*> closing_;  // ucp_ep_close requests in flight
  // Endpoints whose connection closeConnection closed, handed to UCX by
  // closeEndpoints once ucp_worker_progress has returned: a connection is
  // often closed from inside progress (a frame's handler, a failed
  // receive, an endpoint error), in the middle of UCX's own handling of a
  // batch of socket events. (The abort seen under load, tcp_iface.c
  // "ep->conn_state != UCT_TCP_EP_CONN_STATE_CLOSED", is UCX marking an
  // endpoint failed while its batch still holds an event for it; init()
  // caps UCX's TCP batch at one event for that.) A forced close of an
  // endpoint without peer error handling (one host) does nothing in UCX
  // 1.13: those go with the worker.
  std::vector<ucp_ep_h> toClose_;
  void closeEndpoints();
  bool closingEndpoint(ucp_ep_h ep) const {
    return std::find(toClose_.begin(), toClose_.end(), ep) != toClose_.end();
  }
  // Closed connections live until the next progress pass, so a caller up the
  // stack that still holds one reads a closed connection, not freed memory.
  std::vector<std::unique_ptr<Connection>> graveyard_;
  uint64_t nextSerial_ = 1;
  // Makes room for a connection accepted from `host` (NodeOptions::
  // maxHandshaking): false when there is none to make.
  bool makeHandshakeRoom(const std::string& host);
  // A warning about `host` at most once a minute per host (pre-handshake
  // trouble: refusals, timeouts, closed idle connections); the rest are
  // counted, and the next warning says how many were not logged.
  void warnAboutHost(const std::string& host, const std::string& what);
  std::unordered_map<std::string, std::pair<Clock::time_point, uint64_t>> hostWarnings_;
  Clock::time_point hostWarningsSwept_{};
  std::map<uint64_t, Member> membership_;  // coordinator: the job's members
  uint64_t membersEpoch_ = 0;
  Clock::time_point nextTimer_{};
  Clock::time_point joinDeadline_{};
  std::optional<Clock::time_point> retryJoinAt_;
  size_t maxAmHeader_ = 0;  // the largest envelope sent as an AM header
  std::vector<std::unique_ptr<OutFrame>> spareFrames_;  // (takeOutFrame)
  std::vector<TensorView> sendViews_;                    // sendRaw's, kept for its capacity
  std::shared_ptr<BufferPool> buffers_ = std::make_shared<BufferPool>();  // frames over FrameBuffers::kMaxBytes
  FrameBuffers frameBuffers_;  // the smaller ones

 public:
  std::unique_ptr<Links> links_;  // reliable links, when asked for
};

}  // namespace troupe::transport
