// LocalNetwork: the transport's in-process twin. Every node of a job is a
// thread of one process and a frame goes from one to another by ownership
// (encoded and decoded as over UCX, so the decoders see every byte), the way
// leveldb tests against an in-memory Env and gloo against a HashStore. A
// node joins it when NodeOptions::network is set; Node::start then returns
// a node of this network and everything above the transport (remote actors,
// the ring, the coordinator, shards and workers) runs unchanged.
//
// What it keeps of node.h's guarantees: the job token is checked before a
// link carries anything (a node holding another token is refused, and
// joining fails naming it); frames from one peer arrive in the order sent;
// every frame is decoded bounds-checked and a malformed one is counted and
// dropped; a peer is declared down exactly once, when it says goodbye, when
// it crashes, when nothing arrives from it for heartbeatTimeout (heartbeats
// flow as over UCX) or when it cannot be reached; the coordinator node keeps
// the membership. Handler callbacks run on the node's own thread (or a
// caller in pollOnce), one at a time.
//
// What it adds, for fault tests: crash (the SIGKILL of one node), freeze
// and thaw (SIGSTOP and SIGCONT: a frozen node handles and sends nothing;
// its peers time it out, and once thawed it finds them gone, fenced rather
// than let back in as if nothing happened).
//
// Threading: every method is thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"
#include "transport/node.h"

namespace troupe::transport {

class LocalNetwork final {
 public:
  static std::shared_ptr<LocalNetwork> create();
  ~LocalNetwork();
  LocalNetwork(const LocalNetwork&) = delete;
  LocalNetwork& operator=(const LocalNetwork&) = delete;

  // The node with this id crashes: it sends and receives nothing more. Every
  // peer linked to it sees it go as Departure::kCrashed (an endpoint error
  // over UCX), and its own handler sees every peer it was linked to go the
  // same way, as a process whose network vanished would. False when no such
  // node is up.
  bool crash(uint64_t node);
  // The node stops handling anything (frames and timers wait; its sends
  // wait in order) until thaw. False when no such node is up.
  bool freeze(uint64_t node);
  bool thaw(uint64_t node);

  // The ids of the nodes up now (started, not crashed, not gone).
  std::vector<uint64_t> nodes() const;

  class Shared;

 private:
  LocalNetwork();
  bool setFrozen(uint64_t node, bool frozen);
  std::shared_ptr<Shared> shared_;
  friend Expected<std::unique_ptr<Node>> startLocalNode(NodeOptions options, NodeHandler* handler);
};

// Node::start for options.network set.
Expected<std::unique_ptr<Node>> startLocalNode(NodeOptions options, NodeHandler* handler);

}  // namespace troupe::transport
