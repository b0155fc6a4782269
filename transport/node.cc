#include "transport/node.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <poll.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdlib>
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
#include "transport/handshake.h"
#include "transport/internal/node_impl.h"
#include "transport/local_network.h"

namespace troupe::transport {
namespace {

const std::byte kPadding[8] = {};

// How long a leaving node waits for its peers to answer its goodbye
// (shutdown): on a loaded host they are scheduled and read their queue in
// that time; a stopped or silent peer costs this much of an exit.
constexpr std::chrono::milliseconds kFarewellWait{1000};

}  // namespace

const char* departureName(Departure how) {
  switch (how) {
    case Departure::kLeft: return "left";
    case Departure::kCrashed: return "crashed";
    case Departure::kTimedOut: return "timed out";
    case Departure::kRefused: return "refused";
    case Departure::kUnreachable: return "unreachable";
    case Departure::kShutdown: return "shut down";
  }
  return "gone";
}

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


// ---------------------------------------------------------------- set-up

Status checkNodeOptions(NodeOptions* options) {
  if (options->token.empty()) return Status::invalidArgument("transport: the job token is empty");
  if (options->handshakeTimeout.count() <= 0 || options->maxHandshaking < 1 || options->maxHandshakingPerHost < 1) {
    return Status::invalidArgument(fmt::format(
        "transport: handshake timeout ({} ms), handshake slots ({}) and slots per host ({}) must be positive",
        options->handshakeTimeout.count(), options->maxHandshaking, options->maxHandshakingPerHost));
  }
  if (options->nodeId == 0) {
    const Nonce n = randomNonce();
    std::memcpy(&options->nodeId, n.data(), sizeof(options->nodeId));
    if (options->nodeId == 0) options->nodeId = 1;
  }
  if (options->heartbeatInterval.count() <= 0 || options->heartbeatTimeout <= options->heartbeatInterval) {
    return Status::invalidArgument(
        fmt::format("transport: heartbeat timeout ({} ms) must exceed the heartbeat interval ({} ms) > 0",
                    options->heartbeatTimeout.count(), options->heartbeatInterval.count()));
  }
  return Status::ok();
}

Status UcxNode::Impl::init() {
  if (Status st = checkNodeOptions(&options_); !st.isOk()) return st;
  auto listenAddr = ipv4Address(options_.listenHost, options_.listenPort);
  if (!listenAddr.hasValue()) return Status::invalidArgument(fmt::format("transport listen address: {}", listenAddr.status().message()));
  if (listenAddr->sin_addr.s_addr == htonl(INADDR_ANY)) {
    return Status::invalidArgument("transport: listen on a concrete address peers can reach, not 0.0.0.0");
  }
  if (options_.reliableLinks || options_.linkFaults) {
    links_ = std::make_unique<Links>(options_.nodeId, Links::Options{}, options_.linkFaults);
  }
  if (!options_.coordinator.empty()) {
    auto hp = parseHostPort(options_.coordinator);
    if (!hp.hasValue()) return Status::invalidArgument(fmt::format("transport coordinator: {}", hp.status().message()));
    coordinatorHost_ = hp->first;
    coordinatorPort_ = hp->second;
    coordinatorAddress_ = fmt::format("{}:{}", coordinatorHost_, coordinatorPort_);
  }

  ucp_config_t* config = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
  if (s != UCS_OK) return Status::internal("ucp_config_read: " + ucsError(s));
  // One socket event per TCP poll (UCX's default is 16). UCX 1.13 marks a
  // TCP endpoint failed (closed, its socket out of epoll) the moment a
  // send on it fails, and our callbacks send (a member lost is told to
  // the others at once); an event for that endpoint later in the same
  // batch then aborts the process (tcp_iface.c: "ep->conn_state !=
  // UCT_TCP_EP_CONN_STATE_CLOSED"), seen at a job's end under load. With
  // one event a poll there is no later event. UCX_TCP_MAX_POLL, when
  // set, stands (README). (UCX applies the key to every transport that has
  // one: TCP here, and its CUDA copy transports where UCX was built with
  // CUDA, whose polls are for finished copies.)
  if (std::getenv("UCX_TCP_MAX_POLL") == nullptr) {
    s = ucp_config_modify(config, "MAX_POLL", "1");
    if (s != UCS_OK) log()->warn("could not set UCX's TCP MAX_POLL to 1: {}", ucsError(s));
  }
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
  thread_ = std::thread([this] { run(); });
  if (!coordinatorAddress_.empty()) {
    joinDeadline_ = Clock::now() + options_.joinTimeout;
    post([this] { openConnection(coordinatorHost_, coordinatorPort_, 0); });
  }
  return Status::ok();
}

void UcxNode::Impl::sayGoodbye(Connection* c) {
  // (A peer declared down answers nothing: its stale connection, if one
  // stays, is not waited for.)
  c->goodbyeSent = true;
  if (!downPeers_.count(c->peerId)) {
    c->saidGoodbye = true;  // (first: a send that fails closes the connection)
    holdFarewell(c);
  }
  sendControl(c, kGoodbye, encodeEmpty());
}

void UcxNode::Impl::shutdown() {
  bool cancelledSends = false;
  if (thread_.joinable()) {
    // Say goodbye to every peer, let those sends (and any others) finish,
    // wait for each peer's answer, then stop progress and let
    // ucp_worker_destroy release the endpoints.
    // Endpoints are not closed one by one here: on shared memory (no UCX
    // error handling) an endpoint's wire id is its address, so closing one
    // while a peer that is also leaving still sends to it makes UCX read
    // freed memory. A peer stops sending to us once it has our goodbye.
    std::atomic<bool> said{false};
    post([this, &said] {
      if (listener_) ucp_listener_destroy(listener_);  // no new connections while leaving
      listener_ = nullptr;
      // (Over a copy: a send that fails closes its connection, which leaves
      // connections_.)
      std::vector<Connection*> all;
      for (auto& [ep, c] : connections_) all.push_back(c.get());
      leaving_ = true;  // (a connection ready from now on gets its goodbye in becomeReady)
      for (Connection* c : all) {
        if (c->state == State::kReady) {
          sayGoodbye(c);
        } else if (c->state != State::kClosed && c->outgoing && (!c->outbox.empty() || !c->rawOutbox.empty())) {
          // Frames held for a handshake still running: waited for too (they
          // go, with a goodbye after them, once it is ready).
          holdFarewell(c);
        }
      }
      said = true;
    });
    const auto deadline = Clock::now() + std::chrono::seconds(2);
    while (!said && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const auto sendDeadline = Clock::now() + std::chrono::milliseconds(500);
    while (pendingSends_.load() > 0 && Clock::now() < sendDeadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    // On one host what we sent waits in the peer's shared-memory queue, and
    // our sockets close when this process exits: a peer that sees them
    // close before it has read the queue takes us for crashed and drops
    // what it had not read (measured: 20 frames sent to a peer held
    // stopped for 400 ms, 4 to 19 of the second 20 lost in 5 runs of 5).
    // A peer reads our goodbye after the frames we sent before it on the
    // same connection (eager ones; a rendezvous transfer may still be
    // running) and answers with a goodbye of its own, or its side closes;
    // a stopped or silent one is not waited for longer than kFarewellWait.
    const auto farewellDeadline = Clock::now() + kFarewellWait;
    while (farewellsOpen_.load() > 0 && Clock::now() < farewellDeadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (farewellsOpen_.load() > 0) {
      log()->info("node {:x}: {} peer connection(s) still open {} ms after this node's goodbye; leaving anyway",
                  options_.nodeId, farewellsOpen_.load(), kFarewellWait.count());
    }
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
  // (Held from here on: a caller's pollOnce or send may still try the
  // worker, and the callbacks below give frames back to spareFrames_.)
  std::lock_guard<std::mutex> workerLock(workerMutex_);
  if (worker_) {
    // Sends that never finished (to a peer cut off, whose TCP connection
    // holds them): cancelled, and their callbacks run, before the worker
    // and its endpoints go (UCX asserts on an endpoint with requests left).
    std::vector<void*> left;
    {
      std::lock_guard<std::mutex> lock(inflightMutex_);
      left.assign(inflight_.begin(), inflight_.end());
    }
    if (!left.empty()) log()->info("{} send(s) that never finished cancelled as the node goes", left.size());
    for (void* r : left) ucp_request_cancel(worker_, r);
    for (int i = 0; i < 1000; ++i) {
      {
        std::lock_guard<std::mutex> lock(inflightMutex_);
        if (inflight_.empty()) break;
      }
      ucp_worker_progress(worker_);
    }
    // A send that did not finish even so (one on an endpoint still being
    // wired up, to a peer held stopped while this node connected to it,
    // stays in UCX's pending queue) makes ucp_worker_destroy abort the
    // process (UCX 1.13: "pending request ... should have been flushed"):
    // the worker is left then.
    std::lock_guard<std::mutex> lock(inflightMutex_);
    cancelledSends = !inflight_.empty();
  }
  closeEndpoints();  // (the progress thread has stopped: nothing is in progress)
  for (void* r : closing_) ucp_request_free(r);
  closing_.clear();
  connections_.clear();
  if (listener_) ucp_listener_destroy(listener_);
  if (silentPeer_ || cancelledSends) {
    // Nothing calls back into this node from here on (UCX calls back only
    // from progress, which has stopped); the process's exit frees the rest.
    log()->info("node {:x}: {}, so its UCX worker is left to the process's exit (UCX 1.13 cannot destroy an "
                "endpoint whose requests never finished)",
                options_.nodeId, silentPeer_ ? "a peer went silent" : "sends to a peer never finished");
    worker_ = nullptr;
    context_ = nullptr;
  }
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

thread_local bool UcxNode::Impl::t_polling = false;

void UcxNode::Impl::run() {
  auto lastWork = Clock::now();
  auto now = lastWork;
  unsigned idle = 0;
  while (!stop_.load(std::memory_order_relaxed)) {
    if (callerPolling(Clock::now(), std::chrono::microseconds(1000))) {
      // A caller drives progress (pollOnce) now or did within 1 ms: stay
      // off the cores, but keep the timers (heartbeats) and queued work
      // going, every 200 us or when woken (endPolling, post).
      sleeping_.store(true, std::memory_order_seq_cst);
      if (!queued_.load(std::memory_order_seq_cst)) {
        pollfd p{eventFd_, POLLIN, 0};
        const timespec t{0, 200000};
        if (::ppoll(&p, 1, &t, nullptr) > 0) {
          uint64_t v;
          while (::read(eventFd_, &v, sizeof(v)) > 0) {
          }
        }
      }
      sleeping_.store(false, std::memory_order_seq_cst);
      idle = 0;  // this turn reads the clock and runs due timers
    }
    bool worked = false;
    {
      std::lock_guard<std::mutex> lock(workerMutex_);
      PollingScope polling;
      graveyard_.clear();  // nothing up the stack holds a connection here
      worked = drainQueue();
      // Bounded, so a flood cannot starve queued sends, heartbeats and timers.
      for (int i = 0; i < 64 && ucp_worker_progress(worker_) != 0; ++i) worked = true;
      closeEndpoints();
      // The clock is read when there was work and every 32nd idle turn:
      // reading it on every turn of the spin cost more than the progress.
      if (worked || (idle & 31) == 0) {
        now = Clock::now();
        if (now >= nextTimer_) onTimer(now);
        closeEndpoints();
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
    }
    if (worked) {
      lastWork = now;
      idle = 0;
      continue;
    }
    if ((idle++ & 31) != 0 || now - lastWork < options_.spinBeforeSleep) {
      // Spin politely: a thread this one just woke (the actor a message went
      // to) gets the core at once. Measured: round trips 55-76 us against
      // 89-148 us without the yield, on 2 cores.
      std::this_thread::yield();
      continue;
    }
    sleeping_.store(true, std::memory_order_seq_cst);
    if (queued_.load(std::memory_order_seq_cst)) {
      sleeping_.store(false);
      continue;
    }
    ucs_status_t armed;
    int timeoutMs;
    {
      std::lock_guard<std::mutex> lock(workerMutex_);
      armed = ucp_worker_arm(worker_);
      timeoutMs = int(std::chrono::duration_cast<std::chrono::milliseconds>(nextTimer_ - Clock::now()).count()) + 1;
      // A send UCX has not finished is completed by a message from its peer
      // (which wakes us); the short timeout covers one waiting on buffers.
      if (!closing_.empty() || pendingSends_.load() > 0) timeoutMs = 1;
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
    now = lastWork = Clock::now();
    idle = 0;
  }
}

bool UcxNode::Impl::pollOnce() {
  if (t_polling || !workerMutex_.try_lock()) return false;
  std::lock_guard<std::mutex> lock(workerMutex_, std::adopt_lock);
  PollingScope polling;
  graveyard_.clear();  // the caller holds no connection
  bool worked = drainQueue();
  for (int i = 0; i < 64 && ucp_worker_progress(worker_) != 0; ++i) worked = true;
  closeEndpoints();
  return worked;
}

bool UcxNode::Impl::drainQueue() {
  if (!queued_.load(std::memory_order_seq_cst)) return false;
  {
    std::lock_guard<std::mutex> lock(queueMutex_);
    draining_.swap(queue_);
    queued_.store(false, std::memory_order_seq_cst);
  }
  const bool any = !draining_.empty();
  // Emptied however the loop ends: an item that throws takes the rest with
  // it (as when the queue was a local), and none runs twice.
  struct Emptied {
    std::vector<Work>& v;
    ~Emptied() {
      v.clear();
      if (v.capacity() > kKeptWork) std::vector<Work>().swap(v);  // after a flood
    }
  } emptied{draining_};
  for (Work& w : draining_) {
    if (w.fn) {
      w.fn();
    } else {
      sendTo(w.peer, std::move(w.envelope), std::move(w.tensors));
    }
  }
  return any;
}

void UcxNode::Impl::onTimer(Clock::time_point now) {
  nextTimer_ = now + std::max(std::chrono::milliseconds(1), options_.heartbeatInterval / 4);
  if (retryJoinAt_ && now >= *retryJoinAt_) {
    retryJoinAt_.reset();
    openConnection(coordinatorHost_, coordinatorPort_, 0);
  }
  std::vector<Connection*> all;
  for (auto& [ep, cp] : connections_) all.push_back(cp.get());
  std::vector<std::pair<Connection*, Status>> dead;
  for (Connection* c : all) {
    if (c->closeAt) {
      if (now >= *c->closeAt) closeConnection(c, c->closeWhy, !c->closeWhy.isOk());
      continue;
    }
    if (c->state == State::kClosed) continue;
    if (c->state == State::kReady) {
      if (now - c->lastReceived > options_.heartbeatTimeout) {
        dead.emplace_back(c, Status::timeout(fmt::format(
                                 "no message or heartbeat from node {:x} ({}) for {} ms", c->peerId, c->address,
                                 std::chrono::duration_cast<std::chrono::milliseconds>(now - c->lastReceived).count())));
      } else if (now - c->lastSent >= options_.heartbeatInterval && !c->goodbyeSent) {
        // (None after this node's goodbye: the peer closes its side on it.)
        sendControl(c, kHeartbeat, encodeEmpty());
        counters_.heartbeats++;
      }
    } else if (c->state != State::kClosed &&
               now - c->opened > (c->outgoing ? std::max(options_.handshakeTimeout, options_.heartbeatTimeout)
                                              : options_.handshakeTimeout)) {
      // (One this node opened is to a peer it needs: given up on no sooner
      // than a silent peer would be.)
      counters_.handshakesTimedOut++;
      const std::string why = fmt::format(
          "handshake with {} did not finish in {} ms", c->address,
          std::chrono::duration_cast<std::chrono::milliseconds>(now - c->opened).count());
      if (c->outgoing) {
        dead.emplace_back(c, Status::timeout(why));
      } else {  // nobody waits for an accepted one: a line per host a minute
        warnAboutHost(c->host, why);
        dead.emplace_back(c, Status::ok());
      }
    }
  }
  for (auto& [c, why] : dead) closeConnection(c, why, true);
  if (links_) {
    std::vector<Links::Wire> wires;
    std::vector<std::pair<uint64_t, Status>> lost;
    links_->tick(now, &wires, &lost);
    for (auto& w : wires) sendWire(std::move(w));
    for (auto& [peer, why] : lost) {
      Connection* any = nullptr;
      if (auto it = byPeer_.find(peer); it != byPeer_.end()) any = it->second;
      for (auto& [ep, conn] : connections_) {
        if (!any && conn->peerId == peer && conn->state != State::kClosed) any = conn.get();
      }
      if (any) {
        closeConnection(any, why, true);
      } else {
        links_->forget(peer);
      }
    }
    if (auto due = links_->nextDue()) {
      nextTimer_ = std::max(now + std::chrono::microseconds(500), std::min(nextTimer_, *due));
    }
  }
}

// ---------------------------------------------------------------- endpoints

Status UcxNode::Impl::createEndpoint(const ucp_ep_params_t& base, Connection* c) {
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
  c->serial = nextSerial_++;
  c->opened = c->lastReceived = c->lastSent = Clock::now();
  return Status::ok();
}

void UcxNode::Impl::openConnection(const std::string& host, uint16_t port, uint64_t expectPeer) {
  auto addr = ipv4Address(host, port);
  auto c = std::make_unique<Connection>();
  c->outgoing = true;
  c->address = fmt::format("{}:{}", host, port);
  c->peerId = expectPeer;
  c->state = State::kHelloSent;
  if (!addr.hasValue()) {
    log()->error("cannot connect to {}: {}", c->address, addr.status().message());
    if (expectPeer) notifyPeerDown(expectPeer, Departure::kUnreachable, addr.status());
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
      downPeers_[expectPeer] = Departure::kUnreachable;
      notifyPeerDown(expectPeer, Departure::kUnreachable, st);
    }
    return;
  }
  Connection* raw = c.get();
  connections_[raw->ep] = std::move(c);
  if (expectPeer) connecting_[expectPeer] = raw;
  raw->client.emplace(options_.token, options_.nodeId, randomNonce(), options_.integrity);
  sendControl(raw, kHello, raw->client->hello());
}

bool UcxNode::Impl::makeHandshakeRoom(const std::string& host) {
  // Accepted connections not through the handshake, refused ones still
  // closing among them, by host.
  const auto now = Clock::now();
  // A connection this young may be a real peer whose hello is on its way:
  // never closed to make room.
  const auto minAge = std::max(std::chrono::milliseconds(1), options_.handshakeTimeout / 4);
  std::unordered_map<std::string, size_t> byHost;
  std::vector<Connection*> pending;
  for (auto& [ep, c] : connections_) {
    if (c->outgoing || c->state == State::kReady || c->state == State::kClosed) continue;
    pending.push_back(c.get());
    byHost[c->host]++;
  }
  const bool hostFull = byHost[host] >= options_.maxHandshakingPerHost;
  if (!hostFull && pending.size() < options_.maxHandshaking) return true;
  // Whom to close, of those old enough (or refused and closing): from this
  // host when its share is full, else from the host holding the most slots
  // among those with one to close; a refused one still closing first, then
  // the oldest that has sent nothing, then the oldest that sent a hello but
  // no proof.
  auto rank = [&](const Connection* c) { return c->closeAt ? 0 : c->state == State::kAwaitHello ? 1 : 2; };
  auto before = [&](const Connection* a, const Connection* b) {
    if (!hostFull && byHost[a->host] != byHost[b->host]) return byHost[a->host] > byHost[b->host];
    if (rank(a) != rank(b)) return rank(a) < rank(b);
    return a->opened < b->opened;
  };
  Connection* victim = nullptr;
  for (Connection* c : pending) {
    if (hostFull && c->host != host) continue;
    if (now - c->opened < minAge) continue;  // (a refused one too: its endpoint may still be wiring up)
    if (!victim || before(c, victim)) victim = c;
  }
  if (!victim) {
    warnAboutHost(host, fmt::format("refused a connection from {}: {} connections ({} from it) are in their handshake, "
                                    "none older than {} ms",
                                    host, pending.size(), byHost[host], minAge.count()));
    return false;
  }
  if (!victim->closeAt) {
    counters_.idleClosed++;
    warnAboutHost(victim->host,
                  fmt::format("closed a connection from {} that {} in {} ms, to make room", victim->address,
                              victim->state == State::kAwaitHello ? "sent nothing" : "sent no proof",
                              std::chrono::duration_cast<std::chrono::milliseconds>(now - victim->opened).count()));
  }
  closeConnection(victim, Status::ok(), false);
  return true;
}

void UcxNode::Impl::warnAboutHost(const std::string& host, const std::string& what) {
  const auto now = Clock::now();
  // Bounded: hosts quiet for a minute are forgotten (a sweep at most once a
  // minute), and past 1024 remembered hosts the rest share one entry.
  if (now - hostWarningsSwept_ >= std::chrono::minutes(1)) {
    hostWarningsSwept_ = now;
    for (auto w = hostWarnings_.begin(); w != hostWarnings_.end();) {
      if (now - w->second.first < std::chrono::minutes(1)) {
        ++w;
        continue;
      }
      if (w->second.second > 0) {
        log()->warn("{} more pre-handshake warnings from {} in the last minute, not logged", w->second.second,
                    w->first);
      }
      w = hostWarnings_.erase(w);
    }
  }
  const std::string key = hostWarnings_.count(host) || hostWarnings_.size() < 1024 ? host : "other hosts";
  auto [it, fresh] = hostWarnings_.try_emplace(key, now, 0);
  if (!fresh && now - it->second.first < std::chrono::minutes(1)) {
    it->second.second++;
    return;
  }
  if (it->second.second > 0) {
    log()->warn("{} (and {} more from {} in the last minute, not logged)", what, it->second.second, key);
  } else {
    log()->warn("{}", what);
  }
  it->second = {now, 0};
}

void UcxNode::Impl::onConnRequest(ucp_conn_request_h request, void* arg) {
  auto* self = static_cast<Impl*>(arg);
  self->counters_.connectionRequests++;
  ucp_conn_request_attr_t attr{};
  attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
  const bool known = ucp_conn_request_query(request, &attr) == UCS_OK;
  const std::string host = known ? sockaddrHost(attr.client_address) : "?";
  // No room: the connection is accepted and refused in words (kRefused,
  // closed 200 ms later), not with ucp_listener_reject, which under a flood
  // tripped an assertion in UCX 1.13's TCP connection manager
  // (tcp_sockcm_ep.c:416) and aborted the process.
  const bool room = self->makeHandshakeRoom(host);
  auto c = std::make_unique<Connection>();
  c->outgoing = false;
  c->state = State::kAwaitHello;
  c->address = known ? sockaddrText(attr.client_address) : "?";
  c->host = host;
  c->sameHost = self->options_.sharedMemory && known && attr.client_address.ss_family == AF_INET &&
                isLocalAddress(reinterpret_cast<const sockaddr_in*>(&attr.client_address)->sin_addr);
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST;
  params.conn_request = request;
  Status st = self->createEndpoint(params, c.get());
  if (!st.isOk()) {  // (mostly: the far side went away already)
    self->counters_.handshakesAbandoned++;
    self->warnAboutHost(host, fmt::format("could not accept a connection from {}: {}", c->address, st.message()));
    return;
  }
  Connection* raw = c.get();
  self->connections_[raw->ep] = std::move(c);
  if (!room) self->refuse(raw, "too many connections are in their handshake; try again");
}

void UcxNode::Impl::onEpError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* self = static_cast<Impl*>(arg);
  if (self->stop_.load()) return;  // the node is going: its last progress only finishes sends
  Connection* c = self->connectionOf(ep);
  if (c == nullptr || c->state == State::kClosed) return;
  // A refusal either way being closed: its own reason stands (the far side
  // closing first after reading it is what a refusal comes to).
  if (c->closeAt) return self->closeConnection(c, c->closeWhy, !c->closeWhy.isOk());
  // This node is leaving and said goodbye here: the far side closing
  // answers it as well as a goodbye back (shutdown waits for either).
  if (c->saidGoodbye) return self->closeConnection(c, Status::unavailable("closed after this node's goodbye"), true);
  // (UCX says "Endpoint timeout" for a killed peer as well as a silent one:
  // every endpoint error is a crash here; our heartbeats say timed out.)
  self->closeConnection(
      c, Status::unavailable(fmt::format("endpoint to node {:x} ({}) failed: {}", c->peerId, c->address, ucsError(status))),
      true);
}

void UcxNode::Impl::closeEndpoints() {
  if (toClose_.empty()) return;
  std::vector<ucp_ep_h> eps;
  eps.swap(toClose_);
  for (ucp_ep_h ep : eps) {
    ucp_request_param_t rp{};
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    // Forced: what is queued goes no further. (A refusal waits 200 ms with
    // closeAt first, so that it leaves before this.)
    rp.flags = UCP_EP_CLOSE_FLAG_FORCE;
    void* req = ucp_ep_close_nbx(ep, &rp);
    if (UCS_PTR_IS_PTR(req)) closing_.push_back(req);
  }
}

void UcxNode::Impl::closeConnection(Connection* c, const Status& why, bool peerDown) {
  if (c->state == State::kClosed) return;
  const State was = c->state;
  c->state = State::kClosed;
  releaseFarewell(c);
  const uint64_t peer = c->peerId;
  const bool wasSender = peer != 0 && ((byPeer_.count(peer) && byPeer_[peer] == c) ||
                                       (connecting_.count(peer) && connecting_[peer] == c));
  if (peer) {
    if (byPeer_.count(peer) && byPeer_[peer] == c) byPeer_.erase(peer);
    if (connecting_.count(peer) && connecting_[peer] == c) connecting_.erase(peer);
  }
  const ucp_ep_h ep = c->ep;
  toClose_.push_back(ep);  // closed by closeEndpoints, outside progress
  auto owned = std::move(connections_[ep]);
  connections_.erase(ep);
  Connection* kept = owned.get();
  graveyard_.push_back(std::move(owned));

  if (peerDown && peer != 0 && wasSender) {
    // How it went: a goodbye or a refusal was recorded on the connection;
    // a timeout is a Status of its own; anything else is a failed endpoint.
    // (This node leaving: whatever closes a connection it said goodbye on
    // is its own leaving to those waiting on the peer, as RemoteActors
    // reports it; but a silence is still one.)
    const Departure how = kept->left                          ? Departure::kLeft
                          : kept->refused                     ? Departure::kRefused
                          : why.code() == Status::Code::kTimeout ? Departure::kTimedOut
                          : kept->saidGoodbye                 ? Departure::kShutdown
                                                              : Departure::kCrashed;
    downPeers_[peer] = how;
    if (how == Departure::kTimedOut) silentPeer_ = true;
    // (Its other connection, if both sides connected at once, stays: UCX's
    // TCP transport may share one socket between the two, and closing both
    // has aborted in tcp_iface.c. Frames from a peer that is down are
    // dropped before the links see them.)
    if (links_) links_->forget(peer);
    if (how != Departure::kShutdown) counters_.peersDown++;
    if (how == Departure::kShutdown) {
      log()->debug("connection to node {:x} closed after this node's goodbye ({})", peer, why.message());
    } else if (kept->left) {
      log()->info("node {:x} left the job", peer);
    } else {
      log()->warn("node {:x} is down: {}", peer, why.message());
    }
    if (options_.isCoordinator && membership_.erase(peer) && !kept->saidGoodbye) broadcastMembers();
    // (This node's leaving in the words RemoteActors' own shutdown uses.)
    notifyPeerDown(peer, how,
                   how == Departure::kShutdown ? Status::unavailable(kShutdownWhy) : why);
  } else if (peerDown && was != State::kReady && !why.isOk()) {
    const std::string what =
        fmt::format("connection with {} closed before the handshake finished: {}", kept->address, why.message());
    if (kept->outgoing) {
      log()->warn("{}", what);
    } else if (!kept->refused) {  // the far side went away: anyone can do that, a line per host a minute
      counters_.handshakesAbandoned++;
      warnAboutHost(kept->host, what);
    }
  }
  if (kept->outgoing && was != State::kReady && isCoordinatorAddress(kept->address) && !stop_) {
    const bool retry = !kept->refused && Clock::now() < joinDeadline_ && !why.isOk();
    if (retry) {
      log()->debug("coordinator at {} not reachable yet ({}); retrying", kept->address, why.message());
      retryJoinAt_ = Clock::now() + std::chrono::milliseconds(200);
    } else {
      {
        std::lock_guard<std::mutex> lock(membersMutex_);
        bootstrapError_ = Status::unavailable(fmt::format(
            "could not join the coordinator at {}: {}", kept->address,
            why.isOk() ? std::string("connection closed during the handshake") : why.message()));
      }
      membersChanged_.notify_all();
    }
  }
}


// ---------------------------------------------------------------- sending

void UcxNode::Impl::sendRaw(Connection* c, Envelope envelope, std::vector<Tensor> tensors) {
  if (c->state == State::kClosed || c->closeAt) return;
  envelope.sourceNode = options_.nodeId;
  std::unique_ptr<OutFrame> out = takeOutFrame();
  std::vector<TensorView>& views = sendViews_;
  views.clear();
  for (const Tensor& t : tensors) views.push_back(TensorView{t.data, t.bytes, t.dtype});
  const Integrity guard = sendGuard(c);
  encodeEnvelope(envelope, views, guard, &out->head);
  const bool sealed = guard == Integrity::kHmac;
  if (sealed) out->seal = c->sendMac->seal(++c->sealed, out->head.data(), out->head.size(), views);
  views.clear();  // (they point into `tensors`)
  out->tensors = std::move(tensors);
  // The envelope travels as the active message's header and the tensors as
  // its data: one tensor as a contiguous buffer (UCX's zero-copy rendezvous
  // takes it as it is), several as an I/O vector with the padding between
  // them; then the seal, if any. The receiver pads the end.
  const bool inHeader = out->head.size() <= maxAmHeader_;
  size_t total = out->head.size();
  if (!inHeader) out->iov.push_back(ucp_dt_iov_t{out->head.data(), out->head.size()});
  for (size_t i = 0; i < out->tensors.size(); ++i) {
    const Tensor& t = out->tensors[i];
    if (t.bytes) out->iov.push_back(ucp_dt_iov_t{const_cast<std::byte*>(t.data), t.bytes});
    const size_t pad = paddedTensorBytes(t.bytes) - t.bytes;
    if (pad && (sealed || i + 1 < out->tensors.size())) {
      out->iov.push_back(ucp_dt_iov_t{const_cast<std::byte*>(kPadding), pad});
    }
    total += paddedTensorBytes(t.bytes);
  }
  if (sealed) {
    out->iov.push_back(ucp_dt_iov_t{out->seal.data(), out->seal.size()});
    total += kSealBytes;
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
  if (envelope.traffic && envelope.traffic < kTrafficLabels) {
    counters_.trafficFrames[envelope.traffic]++;
    counters_.trafficBytes[envelope.traffic] += total;
  }
  if (r == nullptr) {  // done
    giveBack(std::move(out));
    return;
  }
  if (UCS_PTR_IS_ERR(r)) {
    giveBack(std::move(out));
    closeConnection(c, Status::unavailable(fmt::format("send to node {:x} failed: {}", c->peerId,
                                                       ucsError(UCS_PTR_STATUS(r)))),
                    true);
    return;
  }
  sent(r);
  out.release();  // onSendDone gives it back and frees the request
}

void UcxNode::Impl::sendRawBytes(uint64_t peer, std::vector<std::byte> bytes, const std::vector<uint64_t>* flips) {
  auto it = byPeer_.find(peer);
  if (it == byPeer_.end()) return;
  if (flips) {
    Connection* c = it->second;
    const Integrity guard = sendGuard(c);
    reguardFrame(&bytes, guard, c->sendMac.get(), guard == Integrity::kHmac ? ++c->sealed : 0);
    flipFrameBits(&bytes, *flips);
  }
  std::unique_ptr<OutFrame> out = takeOutFrame();
  out->head = std::move(bytes);
  ucp_request_param_t rp{};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  rp.flags = UCP_AM_SEND_FLAG_REPLY;
  rp.cb.send = &Impl::onSendDone;
  rp.user_data = out.get();
  ucs_status_ptr_t r = ucp_am_send_nbx(it->second->ep, kAmId, nullptr, 0, out->head.data(), out->head.size(), &rp);
  if (r != nullptr && !UCS_PTR_IS_ERR(r)) {
    sent(r);
    out.release();
    return;
  }
  giveBack(std::move(out));
}

void UcxNode::Impl::onSendDone(void* request, ucs_status_t /*status*/, void* user) {
  std::unique_ptr<OutFrame> out(static_cast<OutFrame*>(user));
  Impl* self = out->self;
  self->pendingSends_--;
  {
    std::lock_guard<std::mutex> lock(self->inflightMutex_);
    self->inflight_.erase(request);
  }
  self->giveBack(std::move(out));
  if (request) ucp_request_free(request);
}

void UcxNode::Impl::sendControl(Connection* c, uint16_t kind, std::string body) {
  Envelope e;
  e.kind = kind;
  e.body = std::move(body);
  if (links_ && c->state == State::kReady && c->peerId != 0 && linkCarried(kind)) {
    // On this connection, with what the link has received and sent (and
    // through the fault filter: a partition drops heartbeats too).
    std::vector<Links::Wire> wires;
    const bool sequenced = linkSequenced(kind);
    links_->send(c->peerId, std::move(e), {}, sequenced, Clock::now(), &wires);
    for (auto& w : wires) {
      if (!w.raw && w.envelope.kind == kind && (sequenced || w.envelope.linkSeq == 0)) {
        sendRaw(c, std::move(w.envelope), {});
      } else {
        sendWire(std::move(w));
      }
    }
    return;
  }
  sendRaw(c, std::move(e), {});
}

void UcxNode::Impl::sendWire(Links::Wire w) {
  // The links' own frames (acks, resend requests) to a peer that is gone
  // are dropped quietly: only the caller's sends report a dead peer.
  if (downPeers_.count(w.peer) && (w.raw || w.envelope.kind < kFirstUserKind)) return;
  if (w.raw) {
    // A corrupted frame (a fault): over the peer's connection, or once the
    // connection this opens is ready.
    if (byPeer_.count(w.peer)) {
      sendRawBytes(w.peer, std::move(w.bytes), &w.flipBits);
      return;
    }
    if (!connecting_.count(w.peer) && !downPeers_.count(w.peer) && w.peer != options_.nodeId) {
      Envelope probe;  // opens the connection as a send would (an ack carries nothing)
      probe.kind = kLinkAck;
      routeTo(w.peer, std::move(probe), {});
    }
    if (auto it = connecting_.find(w.peer); it != connecting_.end()) it->second->rawOutbox.emplace_back(std::move(w.bytes), std::move(w.flipBits));
    return;
  }
  routeTo(w.peer, std::move(w.envelope), std::move(w.tensors));
}

void UcxNode::Impl::sendTo(uint64_t peer, Envelope envelope, std::vector<Tensor> tensors) {
  if (links_ && peer != options_.nodeId && !downPeers_.count(peer) &&
      (byPeer_.count(peer) || connecting_.count(peer) || isMember(peer))) {
    std::vector<Links::Wire> wires;
    links_->send(peer, std::move(envelope), std::move(tensors), true, Clock::now(), &wires);
    for (auto& w : wires) sendWire(std::move(w));
    clampTimer();
    return;
  }
  routeTo(peer, std::move(envelope), std::move(tensors));
}

bool UcxNode::Impl::isMember(uint64_t peer) const {
  std::lock_guard<std::mutex> lock(membersMutex_);
  for (const Member& m : members_) {
    if (m.nodeId == peer) return true;
  }
  return false;
}

void UcxNode::Impl::routeTo(uint64_t peer, Envelope envelope, std::vector<Tensor> tensors) {
  if (auto it = byPeer_.find(peer); it != byPeer_.end()) {
    sendRaw(it->second, std::move(envelope), std::move(tensors));
    return;
  }
  if (auto it = connecting_.find(peer); it != connecting_.end()) {
    it->second->outbox.emplace_back(std::move(envelope), std::move(tensors));
    return;
  }
  if (auto down = downPeers_.find(peer); down != downPeers_.end()) {
    notifyPeerDown(peer, down->second,
                   Status::unavailable(fmt::format("node {:x} is down ({})", peer, departureName(down->second))));
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
    notifyPeerDown(peer, Departure::kUnreachable,
                   Status::notFound(fmt::format("node {:x} is not a member of the job", peer)));
    return;
  }
  openConnection(m->host, m->port, peer);
  if (auto it = connecting_.find(peer); it != connecting_.end()) {
    it->second->outbox.emplace_back(std::move(envelope), std::move(tensors));
  }
}

// ---------------------------------------------------------------- receiving

ucs_status_t UcxNode::Impl::onAm(void* arg, const void* header, size_t headerLength, void* data, size_t length,
                              const ucp_am_recv_param_t* param) {
  auto* self = static_cast<Impl*>(arg);
  const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  const ucs_status_t drop = rndv ? UCS_ERR_REJECTED : UCS_OK;
  if (self->stop_.load()) return drop;  // the node is going: nothing more is delivered
  Connection* c = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? self->connectionOf(param->reply_ep) : nullptr;
  if (c == nullptr && (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) && self->closingEndpoint(param->reply_ep)) {
    return drop;  // its connection closed in this progress pass: as if its endpoint were gone already
  }
  if (c == nullptr || c->state == State::kClosed || c->closeAt) {
    self->counters_.unauthenticated++;
    return drop;
  }
  if (c->state != State::kReady && rndv) {  // handshake messages are small and eager
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
  if (frameBytes > self->options_.maxFrameBytes) {
    const std::string why = fmt::format("a message of {} bytes is over the limit of {} (transport.max_message_mb)",
                                        frameBytes, self->options_.maxFrameBytes);
    self->dropMalformed(c, why);
    if (self->links_ && c->state == State::kReady) {
      // A reliable link cannot skip a message it never read: the sender is
      // cut off (rather than waiting for what never comes).
      self->closeConnection(c, Status::unavailable(fmt::format("node {:x} sent {}", c->peerId, why)), true);
    }
    return drop;
  }
  if (frameBytes < kFrameHeaderBytes || headerLength % 8 != 0) {
    self->dropMalformed(c, fmt::format("a message of {} + {} bytes (a frame is at least {} bytes, its header whole words)",
                                       headerLength, length, kFrameHeaderBytes));
    return drop;
  }
  auto in = std::make_shared<Incoming>();
  in->storage = frameBytes <= FrameBuffers::kMaxBytes ? self->frameBuffers_.get(frameBytes)
                                                      : self->buffers_->get(frameBytes);
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
  auto* op = new RecvOp{self, c->ep, c->serial, in};
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

void UcxNode::Impl::onRecvDone(void* request, ucs_status_t status, size_t /*length*/, void* user) {
  if (request) ucp_request_free(request);
  std::unique_ptr<RecvOp> op(static_cast<RecvOp*>(user));
  Connection* c = op->self->connectionOf(op->ep);
  if (c == nullptr || c->serial != op->serial || c->state == State::kClosed) return;
  if (status != UCS_OK) {
    op->self->closeConnection(c, Status::unavailable(fmt::format("receive from node {:x} failed: {}", c->peerId,
                                                                 ucsError(status))),
                              true);
    return;
  }
  op->incoming->complete = true;
  op->self->pumpInbox(c);
}

void UcxNode::Impl::pumpInbox(Connection* c) {
  const ucp_ep_h ep = c->ep;
  while (!c->inbox.empty() && c->inbox.front()->complete) {
    auto in = std::move(c->inbox.front());
    c->inbox.pop_front();
    handleFrame(c, in);
    c = connectionOf(ep);  // the frame may have closed the connection
    if (c == nullptr || c->state == State::kClosed) return;
  }
}

void UcxNode::Impl::dropMalformed(Connection* c, const std::string& why) {
  const uint64_t n = ++counters_.malformed;
  // Log the first few and then every 1000th, so garbage cannot flood the log.
  if (n <= 10 || n % 1000 == 0) {
    log()->warn("dropped malformed message #{} from {} (node {:x}): {}", n, c->address, c->peerId, why);
  }
}

void UcxNode::Impl::handleFrame(Connection* c, const std::shared_ptr<Incoming>& in) {
  const auto* data = reinterpret_cast<const std::byte*>(in->storage.get());
  // What this connection takes: the hello, challenge and proof carry a CRC;
  // later frames what transport.integrity says (for hmac, sealed from the
  // moment this side holds its receive key: after its proof for a client,
  // whatever the server says then, its welcome or a refusal, is sealed).
  // A sealed frame's structure is checked first (cheap, and garbage goes
  // no further), then its seal; nothing in it is acted on before both.
  FrameCheck check;
  const bool sealed = c->recvMac != nullptr;
  if (sealed) {
    check = FrameCheck{Integrity::kHmac, nullptr, false};
  } else if (c->state == State::kReady) {
    check.integrity = options_.integrity;
  }
  auto decoded = decodeFrame(data, in->bytes, check);
  if (!decoded.hasValue()) {
    const auto word = frameIntegrityWord(data, in->bytes);
    if (sealed && word && (*word == uint32_t(Integrity::kCrc32c) || *word == uint32_t(Integrity::kOff))) {
      counters_.unsealedRefused++;
    }
    dropMalformed(c, decoded.status().message());
    return;
  }
  if (sealed) {
    Status st = c->recvMac->verify(data, in->bytes)
                    ? c->seals.accept(decoded->sealSeq)
                    : Status::corruption(fmt::format("the seal of a {}-byte frame does not verify (forged, altered, "
                                                     "or another connection's)", in->bytes));
    if (!st.isOk()) {
      counters_.sealsRefused++;
      dropMalformed(c, st.message());
      return;
    }
  }
  DecodedFrame& frame = *decoded;
  const uint16_t kind = frame.envelope.kind;
  if (kind < kFirstUserKind && (!links_ || c->state != State::kReady || !linkCarried(kind))) {
    handleControl(c, frame);
    return;
  }
  if (c->state != State::kReady) {
    counters_.unauthenticated++;
    log()->warn("dropped a message of kind {} from {} before its handshake", kind, c->address);
    return;
  }
  c->lastReceived = Clock::now();
  if (frame.envelope.sourceNode != c->peerId) {
    dropMalformed(c, fmt::format("claims to come from node {:x}", frame.envelope.sourceNode));
    return;
  }
  if (links_ && downPeers_.count(c->peerId)) {
    // A late frame of a peer given up; but a goodbye on its other
    // connection (both sides connected at once) still closes that one, and
    // is answered (a leaving node waits for it).
    if (kind == kGoodbye) handleControl(c, frame);
    return;
  }
  frame.wireBytes = in->bytes;
  if (!links_) {
    counters_.framesReceived++;
    counters_.bytesReceived += in->bytes;
    handler_->onFrame(c->peerId, std::move(frame), in->storage);
    return;
  }
  // In link order: what waited for this frame comes with it.
  if (kind >= kFirstUserKind) counters_.bytesReceived += in->bytes;
  const uint64_t peer = c->peerId;
  const ucp_ep_h ep = c->ep;
  std::vector<Links::Delivery> deliveries;
  std::vector<Links::Wire> wires;
  links_->receive(peer, std::move(frame), in->storage, Clock::now(), &deliveries, &wires);
  for (auto& w : wires) sendWire(std::move(w));
  clampTimer();
  for (auto& d : deliveries) {
    c = connectionOf(ep);
    if (c == nullptr || c->state == State::kClosed) return;  // a goodbye closed it
    if (d.frame.envelope.kind < kFirstUserKind) {
      handleControl(c, d.frame);
      continue;
    }
    counters_.framesReceived++;
    handler_->onFrame(peer, std::move(d.frame), d.owner);
  }
}

// ---------------------------------------------------------------- Node

Expected<std::unique_ptr<Node>> Node::start(NodeOptions options, NodeHandler* handler) {
  TROUPE_CHECK(handler != nullptr, "Node::start needs a handler");
  if (options.network) return startLocalNode(std::move(options), handler);
  auto impl = std::make_unique<UcxNode::Impl>(std::move(options), handler);
  Status st = impl->init();
  if (!st.isOk()) return st;
  return std::unique_ptr<Node>(new UcxNode(std::move(impl)));
}

UcxNode::UcxNode(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
UcxNode::~UcxNode() = default;

uint64_t UcxNode::id() const { return impl_->options_.nodeId; }
const std::string& UcxNode::role() const { return impl_->options_.role; }
uint16_t UcxNode::port() const { return impl_->port_; }
std::string UcxNode::address() const { return fmt::format("{}:{}", impl_->options_.listenHost, impl_->port_); }

void UcxNode::send(uint64_t peer, Envelope envelope, std::vector<Tensor> tensors) {
  impl_->sendNowOrPost(peer, std::move(envelope), std::move(tensors));
}

void UcxNode::sendRawFrame(uint64_t peer, std::vector<std::byte> frame) {
  Impl* impl = impl_.get();
  impl->post([impl, peer, f = std::move(frame)]() mutable { impl->sendRawBytes(peer, std::move(f)); });
}

std::vector<Member> UcxNode::members() const {
  std::lock_guard<std::mutex> lock(impl_->membersMutex_);
  return impl_->members_;
}

Status UcxNode::waitForMembers(size_t count, std::chrono::milliseconds timeout) const {
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

bool UcxNode::pollOnce() { return impl_->pollOnce(); }

void UcxNode::beginPolling() { impl_->beginPolling(); }

void UcxNode::endPolling() { impl_->endPolling(); }

void UcxNode::handBackProgress(bool now) { impl_->handBackProgress(now); }

Status UcxNode::setLinkFaults(std::shared_ptr<LinkFaults> faults) {
  if (!impl_->links_) {
    return Status::invalidArgument("message faults need reliable links (transport.reliable_links = true)");
  }
  impl_->links_->setFaults(std::move(faults));
  return Status::ok();
}

NodeStats UcxNode::stats() const {
  const auto& k = impl_->counters_;
  NodeStats s;
  s.framesSent = k.framesSent;
  s.framesReceived = k.framesReceived;
  s.bytesSent = k.bytesSent;
  s.bytesReceived = k.bytesReceived;
  s.malformedDropped = k.malformed;
  s.sealsRefused = k.sealsRefused;
  s.unsealedRefused = k.unsealedRefused;
  s.unauthenticatedDropped = k.unauthenticated;
  s.handshakesRefused = k.refused;
  s.handshakesTimedOut = k.handshakesTimedOut;
  s.idleClosed = k.idleClosed;
  s.framesHandedOver = k.framesHandedOver;
  s.handshakesAbandoned = k.handshakesAbandoned;
  s.connectionRequests = k.connectionRequests;
  s.heartbeatsSent = k.heartbeats;
  s.peersDown = k.peersDown;
  for (size_t i = 0; i < kTrafficLabels; ++i) {
    s.framesSentByTraffic[i] = k.trafficFrames[i];
    s.bytesSentByTraffic[i] = k.trafficBytes[i];
  }
  if (impl_->links_) addLinkStats(impl_->links_->stats(), &s);
  return s;
}

}  // namespace troupe::transport
