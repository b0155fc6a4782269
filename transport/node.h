// Node: this process's place in a job's network. It owns one UCX context and
// worker (shared memory on one host, TCP or RDMA verbs across hosts, as UCX
// picks), a listener on the configured address, one endpoint per peer process,
// and the one progress thread that drives them.
//
// What it guarantees:
//  - A peer is usable only after the token handshake (transport/handshake.h);
//    anything else it sends is counted and dropped, and a failed proof closes
//    its endpoint and is logged.
//  - Frames from one peer are delivered in the order that peer sent them.
//  - Every frame is decoded bounds-checked; a malformed one is counted,
//    logged and dropped, and the node keeps serving.
//  - A peer is declared down, exactly once per connection, when its endpoint
//    errors (UCX peer error handling), when nothing arrives from it for
//    heartbeatTimeout, or when a send to it cannot be delivered.
//  - Bootstrap: a node given the coordinator's host:port joins there and
//    learns every member's role and listen address; the coordinator node
//    keeps the membership and tells every member when it changes.
//
// Threading: one progress thread owns UCX progress. send() sends on the
// caller's thread when the worker's mutex is free at once, and otherwise
// queues the frame for the progress thread and wakes it (eventfd); it never
// blocks, and one thread's sends stay in order. The handler's callbacks run
// on the progress thread, or on a thread in pollOnce() (a caller waiting
// for a frame drives progress itself instead of waiting for the progress
// thread to be scheduled); the worker mutex serializes them, so they never
// run concurrently. They must be short and must not call back into blocking
// Node methods. The progress thread spins (yielding) for spinBeforeSleep
// after its last work, then arms the UCX worker and sleeps in epoll, so an
// idle node costs no CPU; while a caller polls (beginPolling) it stays off
// the cores and wakes only for timers.
//
// Ownership: send() keeps the tensors' owners alive until UCX has sent them;
// received frames live in a buffer the handler may keep (`owner`).
#pragma once

#include <atomic>
#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "transport/frame.h"
#include "transport/tensor.h"

namespace troupe::transport {

class LocalNetwork;
class LinkFaults;

// Envelope kinds below this are the transport's own (handshake, heartbeat,
// bootstrap); actor messages use kinds from it on.
inline constexpr uint16_t kFirstUserKind = 16;

struct NodeOptions {
  uint64_t nodeId = 0;            // unique in the job, non-zero (0: random)
  std::string role = "node";      // shown in membership and logs
  std::string listenHost = "127.0.0.1";  // a concrete address peers can reach
  uint16_t listenPort = 0;        // 0: any free port (see Node::port())
  std::string token;              // the job's secret; must not be empty
  bool isCoordinator = false;     // keeps the membership
  std::string coordinator;        // "host:port" to join; empty for none
  std::chrono::milliseconds heartbeatInterval{250};
  std::chrono::milliseconds heartbeatTimeout{3000};
  // A connection accepted must finish the token handshake this soon after
  // it opens, or it is closed (an idle or slow connection holds a slot);
  // one this node opens, within the longer of this and heartbeatTimeout.
  std::chrono::milliseconds handshakeTimeout{1000};
  // Accepted connections still in their handshake: at most this many in
  // all and from one host. When either is full, a new connection takes a
  // slot of that host (or of the host holding the most): a refused one
  // still closing, else the oldest that has sent nothing, else the oldest
  // that sent a hello but no proof, is closed. One younger than a quarter
  // of handshakeTimeout is never closed to make room (its hello may be on
  // the way): with no other, the new one is refused.
  size_t maxHandshaking = 256;
  size_t maxHandshakingPerHost = 64;
  // How long to keep retrying to reach the coordinator (it may start later).
  // A refusal (wrong token) is final at once.
  std::chrono::milliseconds joinTimeout{30000};
  std::chrono::microseconds spinBeforeSleep{50};
  uint64_t maxFrameBytes = uint64_t{1} << 32;  // larger incoming frames are dropped
  // Peers on this machine talk over UCX shared memory (sysv/posix + cma).
  // UCX offers those only without its peer error handling, so a dead local
  // peer is found by heartbeats and by the wire-up lane's socket. false:
  // TCP with UCX peer error handling everywhere (as across hosts).
  bool sharedMemory = true;
  // Set: the node is not a UCX node but a node of this in-process network
  // (transport/local_network.h); listenHost and listenPort name it there.
  std::shared_ptr<LocalNetwork> network;
  // Message faults injected below this node's reliable links
  // (transport/link_faults.h); set, the links are reliable whatever
  // reliableLinks says. Also settable later (Node::setLinkFaults).
  std::shared_ptr<LinkFaults> linkFaults;
  // Number, acknowledge and resend frames per link (internal/links.h), so
  // that lost, doubled, reordered or corrupted frames still arrive once and
  // in order (transport.reliable_links). Every node of a job must agree.
  bool reliableLinks = false;
  // How frames are guarded once a connection's handshake is done
  // (transport.integrity, frame.h): crc32c against bits flipped on the
  // way; hmac, a seal per frame under keys of the connection's own, also
  // against anyone without the token who can alter, forge or replay
  // traffic; off, nothing. Every node of a job must agree (a peer with
  // another setting is refused in the handshake). UCX nodes only: a node of
  // the in-process network (LocalNetwork) refuses to start with any but crc32c.
  Integrity integrity = Integrity::kCrc32c;
};

// Why a peer is gone, as NodeHandler::onPeerDown and the proxies of
// transport/remote_actors.h report it.
enum class Departure : uint8_t {
  kLeft = 1,     // it said goodbye (a clean exit)
  kCrashed,      // its endpoint failed, or a send to it or a receive from it did
  kTimedOut,     // nothing (not even a heartbeat) arrived for heartbeatTimeout
  kRefused,      // a handshake with it failed (no proof of the job token)
  kUnreachable,  // it could not be reached (not a member, no route, bad address)
  kShutdown,     // this process's own transport shut down
};
// "left", "crashed", "timed out", "refused", "unreachable", "shut down".
const char* departureName(Departure how);
// What a peer's departure says when the cause is this process's own
// transport shutting down (Departure::kShutdown).
inline constexpr char kShutdownWhy[] = "this process's transport shut down";

struct Member {
  uint64_t nodeId = 0;
  std::string role;
  std::string host;
  uint16_t port = 0;
};

struct NodeStats {
  uint64_t framesSent = 0;
  uint64_t framesReceived = 0;
  uint64_t bytesSent = 0;
  uint64_t bytesReceived = 0;
  uint64_t malformedDropped = 0;        // failed decode
  // integrity = hmac: frames whose seal did not verify or whose number was
  // seen before (or is older than the last SealWindow::kSpan). (A frame
  // whose structure is broken is dropped before its seal is looked at:
  // malformedDropped only.)
  uint64_t sealsRefused = 0;
  // integrity = hmac: frames guarded otherwise (a CRC, none) where a seal is required.
  uint64_t unsealedRefused = 0;
  uint64_t unauthenticatedDropped = 0;  // arrived before the handshake completed
  uint64_t handshakesRefused = 0;       // bad or missing proof of the token, or no slot free
  uint64_t handshakesTimedOut = 0;      // did not finish within handshakeTimeout
  uint64_t idleClosed = 0;              // had sent nothing (or no proof) when a newer connection needed its slot
  uint64_t handshakesAbandoned = 0;     // accepted, and closed by the far side before the handshake finished
  uint64_t connectionRequests = 0;      // that reached the listener (each ends refused, closed for room, timed
                                        // out, abandoned, or through the handshake)
  uint64_t heartbeatsSent = 0;
  uint64_t peersDown = 0;
  // Frames held for this node's connection to a peer while the peer's own
  // connection to it was the first one ready (both sides connected at
  // once), sent over that one before anything after them.
  uint64_t framesHandedOver = 0;
  // Reliable links (NodeOptions::reliableLinks): frames sent again on
  // request, duplicates suppressed, frames that waited for an earlier one,
  // resend requests; and the message faults injected here.
  uint64_t framesResent = 0;
  uint64_t duplicatesSuppressed = 0;
  uint64_t framesHeldOutOfOrder = 0;
  uint64_t gapsFound = 0;
  uint64_t faultsDropped = 0, faultsDuplicated = 0, faultsDelayed = 0, faultsReordered = 0, faultsCorrupted = 0,
           faultsPartitioned = 0;
  uint64_t linksGivenUp = 0;  // a gap that never filled: the peer was declared down
  // Frames and bytes sent by Envelope::traffic label (index 0: unlabelled).
  std::array<uint64_t, kTrafficLabels> framesSentByTraffic{}, bytesSentByTraffic{};
};

// Receives what the node delivers. Runs on the progress thread or on a
// caller in Node::pollOnce, one at a time (see Threading above).
class NodeHandler {
 public:
  virtual ~NodeHandler() = default;
  // An authenticated frame of a user kind from `peer` (its sourceNode is
  // checked to be `peer`). `owner` keeps the frame's bytes alive.
  virtual void onFrame(uint64_t peer, DecodedFrame frame, std::shared_ptr<const void> owner) = 0;
  // `peer` is gone (or could not be reached): `how` says which way, `why`
  // names it for logs. Sends to it fail from now on.
  virtual void onPeerDown(uint64_t peer, Departure how, const Status& why) = 0;
  // Membership changed (every member, this node included).
  virtual void onMembers(const std::vector<Member>& members) { (void)members; }
};

// A node's side of the job's network. Two implementations: UCX (the
// product; this file's header comment describes it) and the in-process twin
// (transport/local_network.h: every node a thread of one process, frames
// handed over by ownership), chosen by NodeOptions::network. Both keep the
// guarantees above; code above the transport never asks which it has.
class Node {
 public:
  // Creates the node: the UCX context, worker and listener and the progress
  // thread, or the in-process twin's node when options.network is set;
  // then, if options.coordinator is set, joins there. Fails with a Status
  // naming what went wrong (bad address, port in use, no token, UCX).
  // `handler` must outlive the node.
  static Expected<std::unique_ptr<Node>> start(NodeOptions options, NodeHandler* handler);

  // Says goodbye to every peer, stops the progress thread and closes every
  // endpoint (bounded wait).
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  virtual uint64_t id() const = 0;
  virtual const std::string& role() const = 0;
  virtual uint16_t port() const = 0;  // the port the listener got
  virtual std::string address() const = 0;  // "host:port"

  // Queues a frame for `peer`; never blocks. The envelope's sourceNode is set
  // to this node. If the peer is a member not yet connected, connects first.
  // An undeliverable frame (unknown or dead peer, failed connection) leads
  // to handler->onPeerDown(peer, why).
  virtual void send(uint64_t peer, Envelope envelope, std::vector<Tensor> tensors) = 0;

  // Fault injection and tests: sends `frame` to `peer` exactly as given,
  // unchecked (garbage, truncated or lying frames), over the authenticated
  // endpoint. Dropped if there is no such endpoint.
  virtual void sendRawFrame(uint64_t peer, std::vector<std::byte> frame) = 0;

  // The latest membership the coordinator sent (empty before the first).
  virtual std::vector<Member> members() const = 0;
  // Waits until at least `count` members are known; a timeout is an error.
  virtual Status waitForMembers(size_t count, std::chrono::milliseconds timeout) const = 0;

  virtual NodeStats stats() const = 0;

  // Injects message faults below this node's reliable links from now on
  // (transport/link_faults.h); null stops injecting. Fails when the node's
  // links are not reliable (NodeOptions::reliableLinks).
  virtual Status setLinkFaults(std::shared_ptr<LinkFaults> faults) = 0;

  // Caller-driven progress, for a thread that waits for a frame and wants it
  // without a hand-over from the progress thread (small collectives).
  // pollOnce() progresses the node on this thread if no other thread is
  // doing so at the moment, handing what arrives to the handler here;
  // returns whether anything was done. Not from a handler callback (returns
  // false there). Between beginPolling() and endPolling(), and for 1 ms
  // after, the progress thread backs off (it would only compete for the
  // worker and the cores; it still runs timers and queued work every
  // 200 us). handBackProgress() ends the back-off, for a caller that is
  // about to sleep or to compute for a while: with now = true the progress
  // thread is woken at once (a syscall), else it resumes at its next timer
  // tick (within 200 us).
  virtual bool pollOnce() = 0;
  virtual void beginPolling() = 0;
  virtual void endPolling() = 0;
  virtual void handBackProgress(bool now) = 0;

 protected:
  Node() = default;
};

// Parses "host:port" (IPv4 dotted quad or "localhost"); fails naming the text.
Expected<std::pair<std::string, uint16_t>> parseHostPort(const std::string& text);

}  // namespace troupe::transport
