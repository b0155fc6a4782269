// RemoteActors: actors in other processes as local CAF handles (DESIGN.md,
// Messages and location transparency).
//
// A proxy is a local actor (a caf::actor_proxy) standing for one actor of
// another process. Sending to it, requesting through it (with the usual CAF
// timeout) and monitoring it work as with a local actor:
//  - send/request: the message is encoded (transport/message_codec.h, with
//    the records listed at start) and
//    sent over the peer's UCX endpoint. A message whose elements cannot cross
//    processes is refused at once: a request gets an error reply.
//  - incoming: a message is delivered to the local actor it names, with a
//    proxy of its sender as the sender, so `self->current_sender()`, replies
//    and response promises route back to the remote requester.
//  - monitoring: when the peer goes down (it says goodbye, its endpoint
//    errors, its heartbeats stop for NodeOptions::heartbeatTimeout, or it
//    cannot be reached), every proxy of that peer is killed with an error
//    whose code is the Departure (node.h) and whose category is
//    kDepartureCategory: monitors get a down message saying how the peer
//    went (departureOf), and each request still waiting for a reply through
//    it gets sec::request_receiver_down at once.
//
// Naming: an actor published under a name is reachable as (node, name); the
// wire names it by a 64-bit hash of the name, so no lookup round trip is
// needed. Actors that send through a proxy become reachable by their id for
// replies and for messages sent back to their proxies.
//
// Threading: every method is thread-safe. Incoming messages are enqueued
// from the node's progress thread (or a caller in Node::pollOnce).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include <caf/actor.hpp>
#include <caf/error.hpp>
#include <caf/make_message.hpp>
#include <caf/fwd.hpp>

#include "common/status.h"
#include "transport/node.h"
#include "transport/record.h"

CAF_ERROR_CODE_ENUM(troupe::transport::Departure, "departure")

namespace troupe::transport {

inline constexpr caf::atom_value kDepartureCategory = caf::atom("departure");

// How a remote actor's process went, from a proxy's exit reason (a down
// message's reason); nullopt for any other error.
std::optional<Departure> departureOf(const caf::error& reason);

// Renders departure errors in logs ("departure: crashed (why)"); the actor
// system setup (actors/actor_system.h) calls it.
void addDepartureCategory(caf::actor_system_config& cfg);

// The envelope kind of an actor message.
inline constexpr uint16_t kActorMessageKind = kFirstUserKind;
// The envelope kind of collective traffic (collectives/ring_communicator.h).
inline constexpr uint16_t kCollectiveKind = kFirstUserKind + 1;
// Carries nothing: the kind under which collectives/peer_watch.h listens for
// peers going down.
inline constexpr uint16_t kPeerWatchKind = kFirstUserKind + 2;

// Receives the frames of one envelope kind other than actor messages: raw
// tensor traffic that should not pay for a mailbox (a communicator's
// chunks). Runs on the node's progress thread, or on a caller driving
// progress (Node::pollOnce), never two at once: keep it short, never block.
class FrameSink {
 public:
  virtual ~FrameSink() = default;
  virtual void onFrame(uint64_t peer, DecodedFrame frame, std::shared_ptr<const void> owner) = 0;
  // Every peer that goes down, whether or not it sent this sink anything.
  virtual void onPeerDown(uint64_t peer, Departure how, const Status& why) = 0;
};

struct RemoteActorsStats {
  uint64_t delivered = 0;       // messages handed to local actors
  uint64_t undeliverable = 0;   // no such local actor, or its decode failed
  uint64_t refused = 0;         // outgoing messages that cannot cross processes
  uint64_t peersDown = 0;
};

class RemoteActors final {
 public:
  // Starts the node (see Node::start); the actor system must outlive this.
  // `types`: the records (record.h) messages may carry, both ways.
  static Expected<std::unique_ptr<RemoteActors>> start(caf::actor_system& system, NodeOptions options,
                                                       WireTypes types = {});

  // Kills every proxy (monitors see Departure::kShutdown) and stops the
  // node.
  ~RemoteActors();
  RemoteActors(const RemoteActors&) = delete;
  RemoteActors& operator=(const RemoteActors&) = delete;

  Node& node();

  // Makes `actor` reachable from other processes as `name` on this node.
  void publish(const caf::actor& actor, const std::string& name);

  // The proxy of the actor published as `name` on node `peer` (the same
  // handle for the same pair while the peer is up). If the peer is already
  // down, the proxy is born dead: monitors see it at once. When `peer` is
  // this node, the local actor itself (if published).
  caf::actor remoteActor(uint64_t peer, const std::string& name);

  RemoteActorsStats stats() const;
  // Whether this node saw `peer` go down (and has had no frame from it since).
  bool peerDown(uint64_t peer) const;

  // Frames of `kind` (not kActorMessageKind) go to `sink` from now on; one
  // sink per kind, replaced by a later call. detachSink stops delivery (a
  // call already running finishes; the sink is kept alive until then).
  void attachSink(uint16_t kind, std::shared_ptr<FrameSink> sink);
  void detachSink(uint16_t kind);
  // Only while `sink` is the one attached (an owner going away must not
  // detach the sink of the one that replaced it).
  void detachSink(uint16_t kind, const FrameSink* sink);
  // Sends a raw frame (see Node::send); dropped once the node is shut down.
  void sendFrame(uint64_t peer, Envelope envelope, std::vector<Tensor> tensors);

  // Traffic accounting: the bytes that crossed the wire, by label, as the
  // node put frames on it (NodeStats::bytesSentByTraffic) and took replies
  // off it. A label is registered on first use; at most kTrafficLabels - 1.
  // The index to put in Envelope::traffic for `label` (0 when every index
  // is taken: not counted).
  uint8_t trafficLabel(const std::string& label);
  // Actor messages sent from this process whose first element is `leading`
  // count under `label`, and the replies this process receives to such
  // requests under label + "-reply".
  void countMessages(caf::atom_value leading, const std::string& label);
  struct TrafficCount {
    uint64_t frames = 0, bytes = 0;
  };
  // Every label used so far with its count (sent frames; "-reply" labels:
  // replies received).
  std::map<std::string, TrafficCount> traffic() const;

  class Core;

 private:
  explicit RemoteActors(std::shared_ptr<Core> core);
  std::shared_ptr<Core> core_;
};

// The wire id of a published name.
uint64_t publishedActorId(const std::string& name);

}  // namespace troupe::transport
