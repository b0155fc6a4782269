#include "transport/node.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

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

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>
#include <ucp/api/ucp.h>

#include "common/check.h"
#include "common/logging.h"
#include "transport/handshake.h"
#include "transport/internal/buffer_pool.h"
#include "transport/internal/control.capnp.h"

namespace troupe::transport {
namespace {

using Clock = std::chrono::steady_clock;

enum ControlKind : uint16_t {
  kHello = 1,
  kChallenge = 2,
  kProof = 3,
  kHeartbeat = 4,
  kJoin = 5,
  kMembers = 6,
  kWelcome = 7,
  kRefused = 8,
  kGoodbye = 9,
};

constexpr unsigned kAmId = 7;
// A peer that has not finished the handshake may send only this much.
constexpr size_t kMaxUnauthenticatedFrame = 4096;
const std::byte kPadding[8] = {};

std::shared_ptr<spdlog::logger> log() {
  static auto l = logger("transport");
  return l;
}

std::string bodyOf(capnp::MallocMessageBuilder& message) {
  kj::Array<capnp::word> words = capnp::messageToFlatArray(message);
  return std::string(reinterpret_cast<const char*>(words.begin()), words.size() * sizeof(capnp::word));
}

// Reads a control body with limits; throws kj::Exception on garbage (the
// caller catches).
struct ControlReader {
  explicit ControlReader(const std::string& body)
      : words(kj::heapArray<capnp::word>(body.size() / sizeof(capnp::word))) {
    if (body.empty() || body.size() % sizeof(capnp::word) != 0) {
      KJ_FAIL_REQUIRE("control body length is not a non-zero multiple of 8");
    }
    std::memcpy(words.begin(), body.data(), body.size());
    capnp::ReaderOptions options;
    options.traversalLimitInWords = 4 * words.size() + 64;  // fields may be read more than once
    options.nestingLimit = 8;
    reader.emplace(words.asPtr(), options);
  }
  kj::Array<capnp::word> words;
  std::optional<capnp::FlatArrayMessageReader> reader;
};

std::string ucsError(ucs_status_t s) { return ucs_status_string(s); }

std::string sockaddrText(const sockaddr_storage& ss) {
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
bool isLocalAddress(in_addr addr) {
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

Expected<sockaddr_in> ipv4Address(const std::string& host, uint16_t port) {
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_port = htons(port);
  const std::string h = host == "localhost" ? "127.0.0.1" : host;
  if (inet_pton(AF_INET, h.c_str(), &sin.sin_addr) != 1) {
    return Status::invalidArgument(fmt::format("'{}' is not an IPv4 address", host));
  }
  return sin;
}

}  // namespace

Expected<std::pair<std::string, uint16_t>> parseHostPort(const std::string& text) {
  const auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) {
    return Status::invalidArgument(fmt::format("'{}' is not host:port", text));
  }
  const std::string host = text.substr(0, colon);
  const std::string portText = text.substr(colon + 1);
  char* end = nullptr;
  const unsigned long port = std::strtoul(portText.c_str(), &end, 10);
  if (*end != '\0' || port == 0 || port > 65535) {
    return Status::invalidArgument(fmt::format("'{}': port '{}' is not 1..65535", text, portText));
  }
  auto addr = ipv4Address(host, uint16_t(port));
  if (!addr.hasValue()) return Status::invalidArgument(fmt::format("'{}': {}", text, addr.status().message()));
  return std::make_pair(host == "localhost" ? std::string("127.0.0.1") : host, uint16_t(port));
}

class Node::Impl {
 public:
  Impl(NodeOptions options, NodeHandler* handler) : options_(std::move(options)), handler_(handler) {}
  ~Impl() { shutdown(); }

  Status init();
  void shutdown();

  // --- public side (any thread) ---
  void post(std::function<void()> work) {
    {
      std::lock_guard<std::mutex> lock(queueMutex_);
      queue_.push_back(std::move(work));
      queued_.store(true, std::memory_order_seq_cst);
    }
    if (sleeping_.load(std::memory_order_seq_cst)) wake();
  }
  void sendToPublic(uint64_t peer, Envelope e, std::vector<Tensor> t) { sendTo(peer, std::move(e), std::move(t)); }

  // Sends on the calling thread when it can take the worker at once (saves
  // a hand-off to the progress thread); otherwise queues. Earlier queued
  // work goes first, so one thread's sends stay in order.
  void sendNowOrPost(uint64_t peer, Envelope e, std::vector<Tensor> t) {
    if (std::this_thread::get_id() != progressThread_ && workerMutex_.try_lock()) {
      std::lock_guard<std::mutex> lock(workerMutex_, std::adopt_lock);
      drainQueue();
      sendTo(peer, std::move(e), std::move(t));
      if (pendingSends_.load() > 0 && sleeping_.load(std::memory_order_seq_cst)) wake();
      return;
    }
    post([this, peer, e = std::move(e), t = std::move(t)]() mutable { sendTo(peer, std::move(e), std::move(t)); });
  }
  void openPublic(const std::string& host, uint16_t port) { openConnection(host, port, 0); }
  void sendRawBytes(uint64_t peer, std::vector<std::byte> bytes);
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
        unauthenticated{0}, refused{0}, heartbeats{0}, peersDown{0};
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
    uint64_t peerId = 0;    // known after the hello
    bool refused = false;   // a handshake refusal, either way: no retry
    bool sameHost = false;  // the far side is on this machine
    bool flushOnClose = false;  // let queued messages (a refusal, a goodbye) leave first
    bool left = false;      // the far side said goodbye
    Nonce clientNonce{}, serverNonce{};
    Clock::time_point opened, lastReceived, lastSent;
    std::deque<std::shared_ptr<Incoming>> inbox;  // in arrival order
    std::vector<std::pair<Envelope, std::vector<Tensor>>> outbox;  // until ready
  };

  struct OutFrame {
    Impl* self = nullptr;
    std::vector<std::byte> head;
    std::vector<Tensor> tensors;
    std::vector<ucp_dt_iov_t> iov;
  };

  struct RecvOp {
    Impl* self;
    ucp_ep_h ep;
    std::shared_ptr<Incoming> incoming;
  };

  void run();
  bool drainQueue();
  void onTimer(Clock::time_point now);

  Connection* connectionOf(ucp_ep_h ep) {
    auto it = connections_.find(ep);
    return it == connections_.end() ? nullptr : it->second.get();
  }
  Status createEndpoint(const ucp_ep_params_t& params, Connection* c);
  void openConnection(const std::string& host, uint16_t port, uint64_t expectPeer);
  void sendRaw(Connection* c, Envelope envelope, std::vector<Tensor> tensors);
  void sendControl(Connection* c, uint16_t kind, capnp::MallocMessageBuilder& body);
  void sendTo(uint64_t peer, Envelope envelope, std::vector<Tensor> tensors);
  void closeConnection(Connection* c, const Status& why, bool peerDown);
  void refuse(Connection* c, const std::string& reason);
  bool isCoordinatorAddress(const std::string& address) const;
  void pumpInbox(Connection* c);
  void handleFrame(Connection* c, const std::shared_ptr<Incoming>& in);
  void handleControl(Connection* c, const DecodedFrame& frame);
  void becomeReady(Connection* c);
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
  std::atomic<std::thread::id> progressThread_{};
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> pendingSends_{0};  // sends UCX has not finished
  std::atomic<bool> sleeping_{false};
  std::atomic<bool> queued_{false};
  std::mutex queueMutex_;
  std::vector<std::function<void()>> queue_;

  // Progress-thread state.
  std::unordered_map<ucp_ep_h, std::unique_ptr<Connection>> connections_;
  std::unordered_map<uint64_t, Connection*> byPeer_;      // the connection used to send to a peer
  std::unordered_map<uint64_t, Connection*> connecting_;  // outgoing, handshake in flight
  std::unordered_set<uint64_t> downPeers_;
  std::vector<void*> closing_;  // ucp_ep_close requests in flight
  std::map<uint64_t, Member> membership_;  // coordinator: the job's members
  uint64_t membersEpoch_ = 0;
  Clock::time_point nextTimer_{};
  Clock::time_point joinDeadline_{};
  std::optional<Clock::time_point> retryJoinAt_;
  size_t maxAmHeader_ = 0;  // the largest envelope sent as an AM header
  std::shared_ptr<internal::BufferPool> buffers_ = std::make_shared<internal::BufferPool>();
  uint64_t tokenFingerprint_ = 0;
};

// ---------------------------------------------------------------- set-up

Status Node::Impl::init() {
  if (options_.token.empty()) return Status::invalidArgument("transport: the job token is empty");
  if (options_.nodeId == 0) {
    const Nonce n = randomNonce();
    std::memcpy(&options_.nodeId, n.data(), sizeof(options_.nodeId));
    if (options_.nodeId == 0) options_.nodeId = 1;
  }
  if (options_.heartbeatInterval.count() <= 0 || options_.heartbeatTimeout <= options_.heartbeatInterval) {
    return Status::invalidArgument(
        fmt::format("transport: heartbeat timeout ({} ms) must exceed the heartbeat interval ({} ms) > 0",
                    options_.heartbeatTimeout.count(), options_.heartbeatInterval.count()));
  }
  auto listenAddr = ipv4Address(options_.listenHost, options_.listenPort);
  if (!listenAddr.hasValue()) return Status::invalidArgument(fmt::format("transport listen address: {}", listenAddr.status().message()));
  if (listenAddr->sin_addr.s_addr == htonl(INADDR_ANY)) {
    return Status::invalidArgument("transport: listen on a concrete address peers can reach, not 0.0.0.0");
  }
  tokenFingerprint_ = tokenFingerprint(options_.token);

  ucp_config_t* config = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
  if (s != UCS_OK) return Status::internal("ucp_config_read: " + ucsError(s));
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  s = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (s != UCS_OK) return Status::internal("ucp_init: " + ucsError(s));

  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;  // workerMutex_ serializes every call
  s = ucp_worker_create(context_, &wp, &worker_);
  if (s != UCS_OK) return Status::internal("ucp_worker_create: " + ucsError(s));

  ucp_am_handler_param_t ah{};
  ah.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG |
                  UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
  ah.id = kAmId;
  ah.cb = &Impl::onAm;
  ah.arg = this;
  ah.flags = UCP_AM_FLAG_WHOLE_MSG;
  s = ucp_worker_set_am_recv_handler(worker_, &ah);
  if (s != UCS_OK) return Status::internal("ucp_worker_set_am_recv_handler: " + ucsError(s));
  ucp_worker_attr_t wa{};
  wa.field_mask = UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER;
  if (ucp_worker_query(worker_, &wa) == UCS_OK) maxAmHeader_ = std::min<size_t>(wa.max_am_header, 4096);

  ucp_listener_params_t lp{};
  lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&*listenAddr);
  lp.sockaddr.addrlen = sizeof(sockaddr_in);
  lp.conn_handler.cb = &Impl::onConnRequest;
  lp.conn_handler.arg = this;
  s = ucp_listener_create(worker_, &lp, &listener_);
  if (s != UCS_OK) {
    return Status::unavailable(fmt::format("transport: cannot listen on {}:{}: {}", options_.listenHost,
                                           options_.listenPort, ucsError(s)));
  }
  ucp_listener_attr_t la{};
  la.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  s = ucp_listener_query(listener_, &la);
  if (s != UCS_OK) return Status::internal("ucp_listener_query: " + ucsError(s));
  port_ = ntohs(reinterpret_cast<const sockaddr_in*>(&la.sockaddr)->sin_port);

  s = ucp_worker_get_efd(worker_, &workerFd_);
  if (s != UCS_OK) return Status::internal("ucp_worker_get_efd: " + ucsError(s));
  eventFd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  epollFd_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (eventFd_ < 0 || epollFd_ < 0) return Status::ioError(fmt::format("eventfd/epoll: {}", std::strerror(errno)));
  for (int fd : {workerFd_, eventFd_}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (::epoll_ctl(epollFd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      return Status::ioError(fmt::format("epoll_ctl: {}", std::strerror(errno)));
    }
  }

  if (options_.isCoordinator) {
    membership_[options_.nodeId] = Member{options_.nodeId, options_.role, options_.listenHost, port_};
    setMembers({membership_[options_.nodeId]});
  }
  log()->debug("node {:x} ({}) listening on {}:{}", options_.nodeId, options_.role, options_.listenHost, port_);
  thread_ = std::thread([this] {
    progressThread_ = std::this_thread::get_id();
    run();
  });
  progressThread_ = thread_.get_id();
  if (!options_.coordinator.empty()) {
    auto hp = parseHostPort(options_.coordinator);
    if (!hp.hasValue()) return Status::invalidArgument(fmt::format("transport coordinator: {}", hp.status().message()));
    const std::string host = hp->first;
    const uint16_t port = hp->second;
    joinDeadline_ = Clock::now() + options_.joinTimeout;
    post([this, host, port] { openConnection(host, port, 0); });
  }
  return Status::ok();
}

void Node::Impl::shutdown() {
  if (thread_.joinable()) {
    // Close every endpoint on the progress thread, then stop it.
    std::atomic<bool> closed{false};
    post([this, &closed] {
      std::vector<Connection*> all;
      for (auto& [ep, c] : connections_) all.push_back(c.get());
      for (Connection* c : all) {
        if (c->state == State::kReady) {
          capnp::MallocMessageBuilder m;
          m.initRoot<wire::Proof>();
          sendControl(c, kGoodbye, m);
          c->flushOnClose = true;
        }
        closeConnection(c, Status::ok(), false);
      }
      closed = true;
    });
    const auto deadline = Clock::now() + std::chrono::seconds(2);
    while (!closed && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    // Let the close requests finish (bounded).
    const auto closeDeadline = Clock::now() + std::chrono::milliseconds(500);
    std::atomic<bool> drained{false};
    while (!drained && Clock::now() < closeDeadline) {
      post([this, &drained] { drained = closing_.empty(); });
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    stop_ = true;
    wake();
    thread_.join();
  }
  for (void* r : closing_) ucp_request_free(r);
  closing_.clear();
  connections_.clear();
  if (listener_) ucp_listener_destroy(listener_);
  if (worker_) ucp_worker_destroy(worker_);
  if (context_) ucp_cleanup(context_);
  listener_ = nullptr;
  worker_ = nullptr;
  context_ = nullptr;
  if (epollFd_ >= 0) ::close(epollFd_);
  if (eventFd_ >= 0) ::close(eventFd_);
  epollFd_ = eventFd_ = -1;
}

// ---------------------------------------------------------------- progress

void Node::Impl::run() {
  auto lastWork = Clock::now();
  while (!stop_.load(std::memory_order_relaxed)) {
    bool worked = false;
    auto now = Clock::now();
    {
      std::lock_guard<std::mutex> lock(workerMutex_);
      worked = drainQueue();
      while (ucp_worker_progress(worker_) != 0) worked = true;
      now = Clock::now();
      if (now >= nextTimer_) onTimer(now);
      // Finished close requests.
      for (size_t i = 0; i < closing_.size();) {
        if (ucp_request_check_status(closing_[i]) != UCS_INPROGRESS) {
          ucp_request_free(closing_[i]);
          closing_[i] = closing_.back();
          closing_.pop_back();
        } else {
          ++i;
        }
      }
    }
    if (worked) {
      lastWork = now;
      continue;
    }
    if (now - lastWork < options_.spinBeforeSleep) continue;
    sleeping_.store(true, std::memory_order_seq_cst);
    if (queued_.load(std::memory_order_seq_cst) || pendingSends_.load() > 0) {
      sleeping_.store(false);
      if (pendingSends_.load() > 0) std::this_thread::yield();
      continue;
    }
    ucs_status_t armed;
    int timeoutMs;
    {
      std::lock_guard<std::mutex> lock(workerMutex_);
      armed = ucp_worker_arm(worker_);
      timeoutMs = int(std::chrono::duration_cast<std::chrono::milliseconds>(nextTimer_ - Clock::now()).count()) + 1;
      if (!closing_.empty()) timeoutMs = 1;
    }
    if (armed == UCS_ERR_BUSY) {
      sleeping_.store(false);
      continue;
    }
    timeoutMs = std::max(0, std::min(timeoutMs, 1000));
    epoll_event events[4];
    const int n = ::epoll_wait(epollFd_, events, 4, timeoutMs);
    sleeping_.store(false, std::memory_order_seq_cst);
    for (int i = 0; i < n; ++i) {
      if (events[i].data.fd == eventFd_) {
        uint64_t v;
        while (::read(eventFd_, &v, sizeof(v)) > 0) {
        }
      }
    }
    lastWork = Clock::now();
  }
}

bool Node::Impl::drainQueue() {
  if (!queued_.load(std::memory_order_seq_cst)) return false;
  std::vector<std::function<void()>> work;
  {
    std::lock_guard<std::mutex> lock(queueMutex_);
    work.swap(queue_);
    queued_.store(false, std::memory_order_seq_cst);
  }
  for (auto& w : work) w();
  return !work.empty();
}

void Node::Impl::onTimer(Clock::time_point now) {
  nextTimer_ = now + std::max(std::chrono::milliseconds(1), options_.heartbeatInterval / 4);
  if (retryJoinAt_ && now >= *retryJoinAt_) {
    retryJoinAt_.reset();
    auto hp = parseHostPort(options_.coordinator);
    if (hp.hasValue()) openConnection(hp->first, hp->second, 0);
  }
  std::vector<std::pair<Connection*, Status>> dead;
  for (auto& [ep, cp] : connections_) {
    Connection* c = cp.get();
    if (c->state == State::kReady) {
      if (now - c->lastReceived > options_.heartbeatTimeout) {
        dead.emplace_back(c, Status::timeout(fmt::format(
                                 "no message or heartbeat from node {:x} ({}) for {} ms", c->peerId, c->address,
                                 std::chrono::duration_cast<std::chrono::milliseconds>(now - c->lastReceived).count())));
      } else if (now - c->lastSent >= options_.heartbeatInterval) {
        capnp::MallocMessageBuilder empty;
        empty.initRoot<wire::Proof>();  // any small struct; heartbeats carry nothing
        sendControl(c, kHeartbeat, empty);
        counters_.heartbeats++;
      }
    } else if (c->state != State::kClosed && now - c->opened > options_.handshakeTimeout) {
      dead.emplace_back(c, Status::timeout(fmt::format("handshake with {} did not finish in {} ms", c->address,
                                                       options_.handshakeTimeout.count())));
    }
  }
  for (auto& [c, why] : dead) closeConnection(c, why, true);
}

// ---------------------------------------------------------------- endpoints

Status Node::Impl::createEndpoint(const ucp_ep_params_t& base, Connection* c) {
  ucp_ep_params_t params = base;
  params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  // UCX offers its shared-memory transports only without peer error
  // handling. On one host we take shared memory and detect a dead peer by
  // heartbeats and the wire-up lane's socket; across hosts, UCX reports it.
  params.err_mode = c->sameHost ? UCP_ERR_HANDLING_MODE_NONE : UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &Impl::onEpError;
  params.err_handler.arg = this;
  ucp_ep_h ep = nullptr;
  const ucs_status_t s = ucp_ep_create(worker_, &params, &ep);
  if (s != UCS_OK) return Status::unavailable(fmt::format("ucp_ep_create to {}: {}", c->address, ucsError(s)));
  c->ep = ep;
  c->opened = c->lastReceived = c->lastSent = Clock::now();
  return Status::ok();
}

void Node::Impl::openConnection(const std::string& host, uint16_t port, uint64_t expectPeer) {
  auto addr = ipv4Address(host, port);
  auto c = std::make_unique<Connection>();
  c->outgoing = true;
  c->address = fmt::format("{}:{}", host, port);
  c->peerId = expectPeer;
  c->state = State::kHelloSent;
  if (!addr.hasValue()) {
    log()->error("cannot connect to {}: {}", c->address, addr.status().message());
    if (expectPeer) handler_->onPeerDown(expectPeer, addr.status());
    return;
  }
  c->sameHost = options_.sharedMemory && isLocalAddress(addr->sin_addr);
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
  params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&*addr);
  params.sockaddr.addrlen = sizeof(sockaddr_in);
  Status st = createEndpoint(params, c.get());
  if (!st.isOk()) {
    log()->error("{}", st.message());
    if (expectPeer) {
      downPeers_.insert(expectPeer);
      handler_->onPeerDown(expectPeer, st);
    }
    return;
  }
  Connection* raw = c.get();
  connections_[raw->ep] = std::move(c);
  if (expectPeer) connecting_[expectPeer] = raw;
  raw->clientNonce = randomNonce();
  capnp::MallocMessageBuilder hello;
  auto h = hello.initRoot<wire::Hello>();
  h.setNodeId(options_.nodeId);
  h.setNonce(kj::arrayPtr(raw->clientNonce.data(), raw->clientNonce.size()));
  h.setJobHash(tokenFingerprint_);
  sendControl(raw, kHello, hello);
}

void Node::Impl::onConnRequest(ucp_conn_request_h request, void* arg) {
  auto* self = static_cast<Impl*>(arg);
  auto c = std::make_unique<Connection>();
  c->outgoing = false;
  c->state = State::kAwaitHello;
  ucp_conn_request_attr_t attr{};
  attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
  const bool known = ucp_conn_request_query(request, &attr) == UCS_OK;
  c->address = known ? sockaddrText(attr.client_address) : "?";
  c->sameHost = self->options_.sharedMemory && known && attr.client_address.ss_family == AF_INET &&
                isLocalAddress(reinterpret_cast<const sockaddr_in*>(&attr.client_address)->sin_addr);
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST;
  params.conn_request = request;
  Status st = self->createEndpoint(params, c.get());
  if (!st.isOk()) {
    log()->warn("refused a connection: {}", st.message());
    return;
  }
  Connection* raw = c.get();
  self->connections_[raw->ep] = std::move(c);
}

void Node::Impl::onEpError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* self = static_cast<Impl*>(arg);
  Connection* c = self->connectionOf(ep);
  if (c == nullptr || c->state == State::kClosed) return;
  self->closeConnection(
      c, Status::unavailable(fmt::format("endpoint to node {:x} ({}) failed: {}", c->peerId, c->address, ucsError(status))),
      true);
}

void Node::Impl::closeConnection(Connection* c, const Status& why, bool peerDown) {
  if (c->state == State::kClosed) return;
  const State was = c->state;
  c->state = State::kClosed;
  const uint64_t peer = c->peerId;
  const bool wasSender = peer != 0 && ((byPeer_.count(peer) && byPeer_[peer] == c) ||
                                       (connecting_.count(peer) && connecting_[peer] == c));
  if (peer) {
    if (byPeer_.count(peer) && byPeer_[peer] == c) byPeer_.erase(peer);
    if (connecting_.count(peer) && connecting_[peer] == c) connecting_.erase(peer);
  }
  ucp_request_param_t rp{};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  // A refusal is flushed so the refused side reads why; everything else goes now.
  rp.flags = ((c->refused && !c->outgoing) || c->flushOnClose) ? 0 : UCP_EP_CLOSE_FLAG_FORCE;
  void* req = ucp_ep_close_nbx(c->ep, &rp);
  if (UCS_PTR_IS_PTR(req)) closing_.push_back(req);
  const ucp_ep_h ep = c->ep;
  auto owned = std::move(connections_[ep]);
  connections_.erase(ep);

  if (peerDown && peer != 0 && wasSender) {
    downPeers_.insert(peer);
    counters_.peersDown++;
    if (owned->left) {
      log()->info("node {:x} left the job", peer);
    } else {
      log()->warn("node {:x} is down: {}", peer, why.message());
    }
    if (options_.isCoordinator && membership_.erase(peer)) broadcastMembers();
    handler_->onPeerDown(peer, why);
  } else if (peerDown && was != State::kReady && !why.isOk()) {
    log()->warn("connection with {} closed before the handshake finished: {}", owned->address, why.message());
  }
  if (owned->outgoing && was != State::kReady && isCoordinatorAddress(owned->address) && !stop_) {
    const bool retry = !owned->refused && Clock::now() < joinDeadline_ && !why.isOk();
    if (retry) {
      log()->debug("coordinator at {} not reachable yet ({}); retrying", owned->address, why.message());
      retryJoinAt_ = Clock::now() + std::chrono::milliseconds(200);
    } else {
      {
        std::lock_guard<std::mutex> lock(membersMutex_);
        bootstrapError_ = Status::unavailable(fmt::format(
            "could not join the coordinator at {}: {}", owned->address,
            why.isOk() ? std::string("connection closed during the handshake") : why.message()));
      }
      membersChanged_.notify_all();
    }
  }
}

bool Node::Impl::isCoordinatorAddress(const std::string& address) const {
  if (options_.coordinator.empty()) return false;
  auto hp = parseHostPort(options_.coordinator);
  return hp.hasValue() && address == fmt::format("{}:{}", hp->first, hp->second);
}

void Node::Impl::refuse(Connection* c, const std::string& reason) {
  counters_.refused++;
  capnp::MallocMessageBuilder m;
  m.initRoot<wire::Refused>().setReason(reason);
  sendControl(c, kRefused, m);
  c->refused = true;
  c->peerId = 0;  // never authenticated: no peer goes down
  closeConnection(c, Status::unavailable(reason), false);
}

// ---------------------------------------------------------------- sending

void Node::Impl::sendRaw(Connection* c, Envelope envelope, std::vector<Tensor> tensors) {
  envelope.sourceNode = options_.nodeId;
  auto out = std::make_unique<OutFrame>();
  out->self = this;
  std::vector<TensorView> views;
  views.reserve(tensors.size());
  for (const Tensor& t : tensors) views.push_back(TensorView{t.data, t.bytes, t.dtype});
  out->head = encodeEnvelope(envelope, views);
  out->tensors = std::move(tensors);
  // The envelope travels as the active message's header and the tensors as
  // its data: one tensor as a contiguous buffer (UCX's zero-copy rendezvous
  // takes it as it is), several as an I/O vector with the padding between
  // them. The receiver pads the end.
  const bool inHeader = out->head.size() <= maxAmHeader_;
  size_t total = out->head.size();
  if (!inHeader) out->iov.push_back(ucp_dt_iov_t{out->head.data(), out->head.size()});
  for (size_t i = 0; i < out->tensors.size(); ++i) {
    const Tensor& t = out->tensors[i];
    if (t.bytes) out->iov.push_back(ucp_dt_iov_t{const_cast<std::byte*>(t.data), t.bytes});
    const size_t pad = paddedTensorBytes(t.bytes) - t.bytes;
    if (pad && i + 1 < out->tensors.size()) out->iov.push_back(ucp_dt_iov_t{const_cast<std::byte*>(kPadding), pad});
    total += paddedTensorBytes(t.bytes);
  }
  ucp_request_param_t rp{};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_DATATYPE |
                    UCP_OP_ATTR_FIELD_FLAGS;
  rp.flags = UCP_AM_SEND_FLAG_REPLY;
  rp.cb.send = &Impl::onSendDone;
  rp.user_data = out.get();
  const void* header = inHeader ? out->head.data() : nullptr;
  const size_t headerBytes = inHeader ? out->head.size() : 0;
  ucs_status_ptr_t r;
  if (out->iov.size() <= 1) {
    rp.datatype = ucp_dt_make_contig(1);
    const void* data = out->iov.empty() ? nullptr : out->iov[0].buffer;
    const size_t bytes = out->iov.empty() ? 0 : out->iov[0].length;
    r = ucp_am_send_nbx(c->ep, kAmId, header, headerBytes, data, bytes, &rp);
  } else {
    rp.datatype = ucp_dt_make_iov();
    r = ucp_am_send_nbx(c->ep, kAmId, header, headerBytes, out->iov.data(), out->iov.size(), &rp);
  }
  c->lastSent = Clock::now();
  counters_.framesSent++;
  counters_.bytesSent += total;
  if (r == nullptr) return;  // done; `out` goes now
  if (UCS_PTR_IS_ERR(r)) {
    closeConnection(c, Status::unavailable(fmt::format("send to node {:x} failed: {}", c->peerId,
                                                       ucsError(UCS_PTR_STATUS(r)))),
                    true);
    return;
  }
  pendingSends_++;
  out.release();  // onSendDone frees it and the request
}

void Node::Impl::sendRawBytes(uint64_t peer, std::vector<std::byte> bytes) {
  auto it = byPeer_.find(peer);
  if (it == byPeer_.end()) return;
  auto out = std::make_unique<OutFrame>();
  out->self = this;
  out->head = std::move(bytes);
  ucp_request_param_t rp{};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  rp.flags = UCP_AM_SEND_FLAG_REPLY;
  rp.cb.send = &Impl::onSendDone;
  rp.user_data = out.get();
  ucs_status_ptr_t r = ucp_am_send_nbx(it->second->ep, kAmId, nullptr, 0, out->head.data(), out->head.size(), &rp);
  if (r != nullptr && !UCS_PTR_IS_ERR(r)) {
    pendingSends_++;
    out.release();
  }
}

void Node::Impl::onSendDone(void* request, ucs_status_t /*status*/, void* user) {
  auto* out = static_cast<OutFrame*>(user);
  out->self->pendingSends_--;
  delete out;
  if (request) ucp_request_free(request);
}

void Node::Impl::sendControl(Connection* c, uint16_t kind, capnp::MallocMessageBuilder& body) {
  Envelope e;
  e.kind = kind;
  e.body = bodyOf(body);
  sendRaw(c, std::move(e), {});
}

void Node::Impl::sendTo(uint64_t peer, Envelope envelope, std::vector<Tensor> tensors) {
  if (auto it = byPeer_.find(peer); it != byPeer_.end()) {
    sendRaw(it->second, std::move(envelope), std::move(tensors));
    return;
  }
  if (auto it = connecting_.find(peer); it != connecting_.end()) {
    it->second->outbox.emplace_back(std::move(envelope), std::move(tensors));
    return;
  }
  if (downPeers_.count(peer)) {
    handler_->onPeerDown(peer, Status::unavailable(fmt::format("node {:x} is down", peer)));
    return;
  }
  const Member* m = nullptr;
  std::vector<Member> snapshot;
  {
    std::lock_guard<std::mutex> lock(membersMutex_);
    snapshot = members_;
  }
  for (const Member& x : snapshot) {
    if (x.nodeId == peer) m = &x;
  }
  if (m == nullptr || peer == options_.nodeId) {
    handler_->onPeerDown(peer, Status::notFound(fmt::format("node {:x} is not a member of the job", peer)));
    return;
  }
  openConnection(m->host, m->port, peer);
  if (auto it = connecting_.find(peer); it != connecting_.end()) {
    it->second->outbox.emplace_back(std::move(envelope), std::move(tensors));
  }
}

// ---------------------------------------------------------------- receiving

ucs_status_t Node::Impl::onAm(void* arg, const void* header, size_t headerLength, void* data, size_t length,
                              const ucp_am_recv_param_t* param) {
  auto* self = static_cast<Impl*>(arg);
  const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  const ucs_status_t drop = rndv ? UCS_ERR_REJECTED : UCS_OK;
  Connection* c = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? self->connectionOf(param->reply_ep) : nullptr;
  if (c == nullptr || c->state == State::kClosed) {
    self->counters_.unauthenticated++;
    return drop;
  }
  // The frame is the header (the envelope), then the data, then zeros up to
  // a multiple of 8.
  const uint64_t frameBytes = uint64_t(headerLength) + paddedTensorBytes(length);
  if (c->state != State::kReady && frameBytes > kMaxUnauthenticatedFrame) {
    self->counters_.unauthenticated++;
    log()->warn("dropped a {}-byte message from {} before its handshake", frameBytes, c->address);
    return drop;
  }
  if (frameBytes > self->options_.maxFrameBytes || frameBytes < kFrameHeaderBytes || headerLength % 8 != 0) {
    self->dropMalformed(c, fmt::format("a message of {}+{} bytes (a header of whole words; {}..{} in all)",
                                       headerLength, length, kFrameHeaderBytes, self->options_.maxFrameBytes));
    return drop;
  }
  auto in = std::make_shared<Incoming>();
  in->storage = self->buffers_->get(frameBytes);
  if (!in->storage) {
    self->dropMalformed(c, fmt::format("no memory for a {}-byte message", frameBytes));
    return drop;
  }
  in->bytes = frameBytes;
  auto* bytes = reinterpret_cast<std::byte*>(in->storage.get());
  if (headerLength) std::memcpy(bytes, header, headerLength);
  std::memset(bytes + headerLength + length, 0, frameBytes - headerLength - length);
  c->inbox.push_back(in);
  if (!rndv) {
    if (length) std::memcpy(bytes + headerLength, data, length);
    in->complete = true;
    self->pumpInbox(c);
    return UCS_OK;
  }
  auto* op = new RecvOp{self, c->ep, in};
  ucp_request_param_t rp{};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_DATATYPE;
  rp.datatype = ucp_dt_make_contig(1);
  rp.cb.recv_am = &Impl::onRecvDone;
  rp.user_data = op;
  ucs_status_ptr_t r = ucp_am_recv_data_nbx(self->worker_, data, bytes + headerLength, length, &rp);
  if (r == nullptr) {
    onRecvDone(nullptr, UCS_OK, length, op);
  } else if (UCS_PTR_IS_ERR(r)) {
    onRecvDone(nullptr, UCS_PTR_STATUS(r), 0, op);
  }  // else onRecvDone runs later and frees the request
  return UCS_INPROGRESS;
}

void Node::Impl::onRecvDone(void* request, ucs_status_t status, size_t /*length*/, void* user) {
  if (request) ucp_request_free(request);
  std::unique_ptr<RecvOp> op(static_cast<RecvOp*>(user));
  Connection* c = op->self->connectionOf(op->ep);
  if (c == nullptr) return;
  if (status != UCS_OK) {
    op->self->closeConnection(c, Status::unavailable(fmt::format("receive from node {:x} failed: {}", c->peerId,
                                                                 ucsError(status))),
                              true);
    return;
  }
  op->incoming->complete = true;
  op->self->pumpInbox(c);
}

void Node::Impl::pumpInbox(Connection* c) {
  const ucp_ep_h ep = c->ep;
  while (!c->inbox.empty() && c->inbox.front()->complete) {
    auto in = std::move(c->inbox.front());
    c->inbox.pop_front();
    handleFrame(c, in);
    c = connectionOf(ep);  // the frame may have closed the connection
    if (c == nullptr || c->state == State::kClosed) return;
  }
}

void Node::Impl::dropMalformed(Connection* c, const std::string& why) {
  const uint64_t n = ++counters_.malformed;
  // Log the first few and then every 1000th, so garbage cannot flood the log.
  if (n <= 10 || n % 1000 == 0) {
    log()->warn("dropped malformed message #{} from {} (node {:x}): {}", n, c->address, c->peerId, why);
  }
}

void Node::Impl::handleFrame(Connection* c, const std::shared_ptr<Incoming>& in) {
  auto decoded = decodeFrame(reinterpret_cast<const std::byte*>(in->storage.get()), in->bytes);
  if (!decoded.hasValue()) {
    dropMalformed(c, decoded.status().message());
    return;
  }
  DecodedFrame& frame = *decoded;
  if (frame.envelope.kind < kFirstUserKind) {
    handleControl(c, frame);
    return;
  }
  if (c->state != State::kReady) {
    counters_.unauthenticated++;
    log()->warn("dropped a message of kind {} from {} before its handshake", frame.envelope.kind, c->address);
    return;
  }
  c->lastReceived = Clock::now();
  if (frame.envelope.sourceNode != c->peerId) {
    dropMalformed(c, fmt::format("claims to come from node {:x}", frame.envelope.sourceNode));
    return;
  }
  counters_.framesReceived++;
  counters_.bytesReceived += in->bytes;
  handler_->onFrame(c->peerId, std::move(frame), in->storage);
}

void Node::Impl::handleControl(Connection* c, const DecodedFrame& frame) {
  const uint16_t kind = frame.envelope.kind;
  try {
    ControlReader r(frame.envelope.body);
    switch (kind) {
      case kHello: {
        if (c->outgoing || c->state != State::kAwaitHello) {
          dropMalformed(c, "unexpected hello");
          return;
        }
        auto h = r.reader->getRoot<wire::Hello>();
        auto nonce = h.getNonce();
        if (nonce.size() != kNonceBytes || h.getNodeId() == 0) {
          log()->warn("refused {}: malformed hello", c->address);
          refuse(c, "malformed hello");
          return;
        }
        if (h.getJobHash() != tokenFingerprint_) {
          log()->error("refused {} (claims node {:x}): it holds another job's token", c->address, h.getNodeId());
          refuse(c, "wrong job token");
          return;
        }
        c->peerId = h.getNodeId();
        std::memcpy(c->clientNonce.data(), nonce.begin(), kNonceBytes);
        c->serverNonce = randomNonce();
        const Mac mac = handshakeMac(options_.token, "server", c->clientNonce, c->serverNonce, c->peerId,
                                     options_.nodeId);
        capnp::MallocMessageBuilder m;
        auto ch = m.initRoot<wire::Challenge>();
        ch.setNodeId(options_.nodeId);
        ch.setNonce(kj::arrayPtr(c->serverNonce.data(), kNonceBytes));
        ch.setMac(kj::arrayPtr(mac.data(), kMacBytes));
        c->state = State::kAwaitProof;
        sendControl(c, kChallenge, m);
        return;
      }
      case kChallenge: {
        if (!c->outgoing || c->state != State::kHelloSent) {
          dropMalformed(c, "unexpected challenge");
          return;
        }
        auto ch = r.reader->getRoot<wire::Challenge>();
        auto nonce = ch.getNonce();
        auto mac = ch.getMac();
        const uint64_t serverId = ch.getNodeId();
        if (nonce.size() != kNonceBytes || serverId == 0) {
          closeConnection(c, Status::corruption(fmt::format("malformed challenge from {}", c->address)), true);
          return;
        }
        std::memcpy(c->serverNonce.data(), nonce.begin(), kNonceBytes);
        const Mac expect = handshakeMac(options_.token, "server", c->clientNonce, c->serverNonce, options_.nodeId,
                                        serverId);
        if (!macEquals(expect, mac.begin(), mac.size())) {
          counters_.refused++;
          log()->error("refused {} (node {:x}): it does not hold the job token", c->address, serverId);
          c->refused = true;
          closeConnection(c, Status::unavailable(fmt::format("{} does not hold the job token", c->address)), true);
          return;
        }
        if (c->peerId != 0 && c->peerId != serverId) {
          closeConnection(c, Status::unavailable(fmt::format("{} is node {:x}, expected {:x}", c->address, serverId,
                                                             c->peerId)),
                          true);
          return;
        }
        c->peerId = serverId;
        const Mac proof = handshakeMac(options_.token, "client", c->clientNonce, c->serverNonce, options_.nodeId,
                                       serverId);
        capnp::MallocMessageBuilder m;
        m.initRoot<wire::Proof>().setMac(kj::arrayPtr(proof.data(), kMacBytes));
        sendControl(c, kProof, m);
        c->state = State::kProofSent;
        return;
      }
      case kWelcome: {
        if (!c->outgoing || c->state != State::kProofSent) {
          dropMalformed(c, "unexpected welcome");
          return;
        }
        becomeReady(c);
        return;
      }
      case kProof: {
        if (c->outgoing || c->state != State::kAwaitProof) {
          dropMalformed(c, "unexpected proof");
          return;
        }
        auto mac = r.reader->getRoot<wire::Proof>().getMac();
        const Mac expect = handshakeMac(options_.token, "client", c->clientNonce, c->serverNonce, c->peerId,
                                        options_.nodeId);
        if (!macEquals(expect, mac.begin(), mac.size())) {
          log()->error("refused {} (claims node {:x}): wrong job token", c->address, c->peerId);
          refuse(c, "wrong job token");
          return;
        }
        {
          capnp::MallocMessageBuilder m;
          m.initRoot<wire::Proof>();
          sendControl(c, kWelcome, m);
        }
        becomeReady(c);
        return;
      }
      case kRefused: {
        if (!c->outgoing || c->state == State::kReady) {
          dropMalformed(c, "unexpected refusal");
          return;
        }
        const std::string reason = r.reader->getRoot<wire::Refused>().getReason().cStr();
        c->refused = true;
        closeConnection(c, Status::unavailable(fmt::format("refused by {}: {}", c->address, reason)), true);
        return;
      }
      case kGoodbye:
        if (c->state != State::kReady) return;
        c->left = true;
        closeConnection(c, Status::unavailable(fmt::format("node {:x} left the job", c->peerId)), true);
        return;
      case kHeartbeat:
        if (c->state == State::kReady) c->lastReceived = Clock::now();
        return;
      case kJoin: {
        if (c->state != State::kReady) {
          counters_.unauthenticated++;
          return;
        }
        if (!options_.isCoordinator) {
          dropMalformed(c, "join sent to a node that is not the coordinator");
          return;
        }
        auto m = r.reader->getRoot<wire::Join>().getSelf();
        auto addr = ipv4Address(m.getHost(), m.getPort());
        if (m.getNodeId() != c->peerId || !addr.hasValue() || m.getPort() == 0) {
          dropMalformed(c, "join with a wrong node id or address");
          return;
        }
        membership_[c->peerId] = Member{c->peerId, m.getRole(), m.getHost(), m.getPort()};
        log()->info("node {:x} ({}) joined from {}:{}", c->peerId, std::string(m.getRole().cStr()),
                    std::string(m.getHost().cStr()), m.getPort());
        broadcastMembers();
        return;
      }
      case kMembers: {
        if (c->state != State::kReady) {
          counters_.unauthenticated++;
          return;
        }
        auto ms = r.reader->getRoot<wire::Members>();
        std::vector<Member> members;
        for (auto m : ms.getMembers()) {
          members.push_back(Member{m.getNodeId(), m.getRole(), m.getHost(), m.getPort()});
        }
        setMembers(std::move(members));
        return;
      }
      default:
        dropMalformed(c, fmt::format("unknown control kind {}", kind));
        return;
    }
  } catch (const kj::Exception& e) {
    dropMalformed(c, fmt::format("control message {}: {}", kind, e.getDescription().cStr()));
  }
}

void Node::Impl::becomeReady(Connection* c) {
  c->state = State::kReady;
  c->lastReceived = Clock::now();
  downPeers_.erase(c->peerId);
  log()->debug("node {:x}: handshake with node {:x} ({}) done", options_.nodeId, c->peerId, c->address);
  if (connecting_.count(c->peerId) && connecting_[c->peerId] == c) connecting_.erase(c->peerId);
  if (!byPeer_.count(c->peerId)) byPeer_[c->peerId] = c;
  Connection* sender = byPeer_[c->peerId];
  auto outbox = std::move(c->outbox);
  for (auto& [e, t] : outbox) sendRaw(sender, std::move(e), std::move(t));
  if (c->outgoing && !options_.coordinator.empty() && !options_.isCoordinator) {
    // Our first connection to the coordinator's address: join.
    auto hp = parseHostPort(options_.coordinator);
    if (hp.hasValue() && c->address == fmt::format("{}:{}", hp->first, hp->second)) {
      capnp::MallocMessageBuilder m;
      auto self = m.initRoot<wire::Join>().initSelf();
      self.setNodeId(options_.nodeId);
      self.setRole(options_.role);
      self.setHost(options_.listenHost);
      self.setPort(port_);
      sendControl(c, kJoin, m);
    }
  }
}

void Node::Impl::broadcastMembers() {
  std::vector<Member> members;
  for (auto& [id, m] : membership_) members.push_back(m);
  setMembers(members);
  capnp::MallocMessageBuilder msg;
  auto root = msg.initRoot<wire::Members>();
  root.setEpoch(++membersEpoch_);
  auto list = root.initMembers(unsigned(members.size()));
  for (size_t i = 0; i < members.size(); ++i) {
    list[unsigned(i)].setNodeId(members[i].nodeId);
    list[unsigned(i)].setRole(members[i].role);
    list[unsigned(i)].setHost(members[i].host);
    list[unsigned(i)].setPort(members[i].port);
  }
  for (auto& [id, m] : membership_) {
    if (id == options_.nodeId) continue;
    if (auto it = byPeer_.find(id); it != byPeer_.end()) sendControl(it->second, kMembers, msg);
  }
}

void Node::Impl::setMembers(std::vector<Member> members) {
  {
    std::lock_guard<std::mutex> lock(membersMutex_);
    members_ = members;
  }
  membersChanged_.notify_all();
  handler_->onMembers(members);
}

// ---------------------------------------------------------------- Node

Expected<std::unique_ptr<Node>> Node::start(NodeOptions options, NodeHandler* handler) {
  TROUPE_CHECK(handler != nullptr, "Node::start needs a handler");
  auto impl = std::make_unique<Impl>(std::move(options), handler);
  Status st = impl->init();
  if (!st.isOk()) return st;
  return std::unique_ptr<Node>(new Node(std::move(impl)));
}

Node::Node(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Node::~Node() = default;

uint64_t Node::id() const { return impl_->options_.nodeId; }
const std::string& Node::role() const { return impl_->options_.role; }
uint16_t Node::port() const { return impl_->port_; }
std::string Node::address() const { return fmt::format("{}:{}", impl_->options_.listenHost, impl_->port_); }

void Node::send(uint64_t peer, Envelope envelope, std::vector<Tensor> tensors) {
  impl_->sendNowOrPost(peer, std::move(envelope), std::move(tensors));
}

void Node::sendRawFrame(uint64_t peer, std::vector<std::byte> frame) {
  Impl* impl = impl_.get();
  impl->post([impl, peer, f = std::move(frame)]() mutable { impl->sendRawBytes(peer, std::move(f)); });
}

void Node::connect(const std::string& host, uint16_t port) {
  Impl* impl = impl_.get();
  impl->post([impl, host, port] { impl->openPublic(host, port); });
}

std::vector<Member> Node::members() const {
  std::lock_guard<std::mutex> lock(impl_->membersMutex_);
  return impl_->members_;
}

Status Node::waitForMembers(size_t count, std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(impl_->membersMutex_);
  if (!impl_->membersChanged_.wait_for(lock, timeout, [&] {
        return impl_->members_.size() >= count || !impl_->bootstrapError_.isOk();
      })) {
    return Status::timeout(fmt::format("{} of {} members joined within {} ms", impl_->members_.size(), count,
                                       timeout.count()));
  }
  if (impl_->members_.size() >= count) return Status::ok();
  return impl_->bootstrapError_;
}

NodeStats Node::stats() const {
  const auto& k = impl_->counters_;
  NodeStats s;
  s.framesSent = k.framesSent;
  s.framesReceived = k.framesReceived;
  s.bytesSent = k.bytesSent;
  s.bytesReceived = k.bytesReceived;
  s.malformedDropped = k.malformed;
  s.unauthenticatedDropped = k.unauthenticated;
  s.handshakesRefused = k.refused;
  s.heartbeatsSent = k.heartbeats;
  s.peersDown = k.peersDown;
  return s;
}

}  // namespace troupe::transport
