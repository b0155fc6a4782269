// Reliable links: what a node keeps per peer so that frames lost, doubled,
// delayed, reordered or corrupted on the way (by a fault plan:
// transport/link_faults.h) still arrive once each and in order, the way
// ps-lite's resender does for its dropped messages. Private to transport/.
//
// Every user frame (and a goodbye) gets the next number on its link. The
// receiver hands frames on in number order: one from the past or seen
// before is a duplicate (counted, suppressed); one from the future waits
// for the gap to fill. Every frame also carries what its sender received
// (linkAck: all before this number) and sent (linkSent: the highest
// number) on the link, so a gap is found by the next frame or heartbeat,
// at the tail too. The receiver asks for the missing range (a resend
// request, nackInterval after it saw the gap and again every nackInterval
// while it is missing; the sender resends a frame at most once per
// interval, backing off) and acknowledges
// what it received (on the frames it sends anyway, or in an ack of its own
// after ackEvery frames or ackDelay); the sender keeps each frame (its
// tensors' owners) until acknowledged. A gap still open after giveUpAfter
// ends the link: the peer is declared down, as when its heartbeats stop.
// Under a fault filter the sender also probes: when the oldest frame is
// still unacknowledged resendAfter after it went (backing off per probe),
// it sends an ack of its own, which carries linkSent, so the other side
// sees the gap and asks for what it lacks: a lost last frame of an
// exchange (a reply the other side waits for, with nothing behind it to
// show the gap) costs that long and a resend request, not a heartbeat
// interval, and nothing is sent again that arrived (a large frame still on
// its way is not doubled).
//
// The fault filter sits below: it sees each frame as it goes on the wire,
// resends included (a resend is a new attempt, drawn anew).
//
// Threading: thread-safe (one mutex); it never calls out, it returns what
// the node is to send and deliver.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "common/status.h"
#include "transport/frame.h"
#include "transport/link_faults.h"
#include "transport/node.h"
#include "transport/tensor.h"

namespace troupe::transport::internal {

using LinkClock = std::chrono::steady_clock;

// The transport's own kinds for reliable links (internal/control.h has the rest).
inline constexpr uint16_t kLinkAck = 10;     // carries linkAck only
inline constexpr uint16_t kLinkResend = 11;  // body: u64 from, u64 to (to exclusive)

struct LinkStats {
  uint64_t sequenced = 0;     // frames given a number
  uint64_t resent = 0;        // frames sent again on request
  uint64_t probes = 0;        // acks sent because a frame's acknowledgement was late
  uint64_t gaps = 0;          // resend requests made
  uint64_t duplicates = 0;    // frames that arrived again and were suppressed
  uint64_t heldOutOfOrder = 0;  // frames that waited for an earlier one
  uint64_t dropped = 0, duplicated = 0, delayed = 0, reordered = 0, corrupted = 0, partitioned = 0;  // injected
  uint64_t linksLost = 0;     // gaps that never filled
};

// The transport's own kinds that ride on a ready link (stamped with what
// it received and sent, and cut by a partition): the rest belong to the
// handshake.
bool linkCarried(uint16_t kind);
// Of those, the ones that are state (join, membership): numbered and
// resent like user frames, so that none is lost to a fault. (A goodbye is
// not: it goes as it did before reliable links, the last word of a process
// that is leaving.)
bool linkSequenced(uint16_t kind);

class Links {
 public:
  struct Options {
    std::chrono::milliseconds nackInterval{20};
    std::chrono::milliseconds ackDelay{5};
    size_t ackEvery = 16;
    std::chrono::milliseconds giveUpAfter{10000};
    std::chrono::milliseconds resendAfter{50};
  };

  // A frame to put on the wire now: an envelope with tensors, or raw
  // bytes (a frame a fault corrupts: the whole crc32c frame, and the bits
  // to flip once the node has guarded it as its connection's frames are).
  struct Wire {
    uint64_t peer = 0;
    Envelope envelope;
    std::vector<Tensor> tensors;
    bool raw = false;
    std::vector<std::byte> bytes;
    std::vector<uint64_t> flipBits;
  };
  // A frame to hand to the node's handler, in order.
  struct Delivery {
    uint64_t peer = 0;
    DecodedFrame frame;
    std::shared_ptr<const void> owner;
  };

  Links(uint64_t self, Options options, std::shared_ptr<LinkFaults> faults)
      : self_(self), options_(options), faults_(std::move(faults)) {}

  // A frame for `peer`: `sequenced` ones are numbered and kept until
  // acknowledged. What goes on the wire now is appended to `out`.
  // A frame's tensors are kept for a resend only while a fault filter is
  // set: the transports under us (UCX over TCP or shared memory) lose
  // nothing on a live connection, and keeping them would hold the caller's
  // buffers (a collective's) until the peer acknowledges. A frame asked for
  // again whose bytes were not kept ends the link.
  void send(uint64_t peer, Envelope envelope, std::vector<Tensor> tensors, bool sequenced, LinkClock::time_point now,
            std::vector<Wire>* out);
  // A decoded frame from `peer`: what to deliver now, in order (resend
  // requests and acks are consumed here), and what to send back.
  void receive(uint64_t peer, DecodedFrame frame, std::shared_ptr<const void> owner, LinkClock::time_point now,
               std::vector<Delivery>* deliver, std::vector<Wire>* out);
  // Delayed and held frames that are due, acks and repeated resend
  // requests; links whose gap never filled go to `lost`.
  void tick(LinkClock::time_point now, std::vector<Wire>* out, std::vector<std::pair<uint64_t, Status>>* lost);
  // When tick has something to do next (nullopt: nothing waits).
  std::optional<LinkClock::time_point> nextDue() const;
  // `peer` is gone: drop what was kept for it.
  void forget(uint64_t peer);

  LinkStats stats() const;
  void setFaults(std::shared_ptr<LinkFaults> faults) {
    std::lock_guard<std::mutex> lock(mu_);
    faults_ = std::move(faults);
  }

 private:
  struct Held {
    uint64_t seq = 0;
    Envelope envelope;
    std::vector<Tensor> tensors;
    uint64_t attempts = 0;
    bool bytesKept = true;  // false: its tensors were not kept (see send)
    LinkClock::time_point lastSent;
    uint64_t probes = 0;  // probes sent since it was last sent (see Options::resendAfter)
    LinkClock::time_point probedAt;
  };
  struct Waiting {
    DecodedFrame frame;
    std::shared_ptr<const void> owner;
  };
  struct Link {
    // Sending side.
    uint64_t nextSeq = 1;
    std::deque<Held> held;  // sent, not acknowledged, in number order
    std::optional<Wire> reordered;  // held back by a reorder fault
    LinkClock::time_point reorderedAt;
    // Receiving side.
    uint64_t expected = 1;
    uint64_t peerSent = 0;
    std::map<uint64_t, Waiting> early;  // arrived before `expected`'s turn
    size_t unacked = 0;                 // delivered since our last ack
    LinkClock::time_point firstUnacked;
    std::optional<LinkClock::time_point> gapSince;  // since `expected` last moved with a gap open
    LinkClock::time_point nextNack;
  };

  // Stamps ack/sent, applies the filter, appends what goes now.
  void emit(uint64_t peer, Link& link, Envelope envelope, std::vector<Tensor> tensors, uint64_t attempt,
            LinkClock::time_point now, std::vector<Wire>* out);
  void ackNow(uint64_t peer, Link& link, LinkClock::time_point now, std::vector<Wire>* out);
  void nackGap(uint64_t peer, Link& link, LinkClock::time_point now, std::vector<Wire>* out);
  // The frame a probe asks after (the oldest unacknowledged, under a fault
  // filter), and when.
  const Held* probed(const Link& link) const;
  LinkClock::time_point probeAt(const Held& h) const;
  bool gapOpen(const Link& link) const {
    return link.peerSent >= link.expected || (!link.early.empty() && link.early.begin()->first > link.expected);
  }

  const uint64_t self_;
  const Options options_;
  std::shared_ptr<LinkFaults> faults_;
  mutable std::mutex mu_;
  std::map<uint64_t, Link> links_;
  std::multimap<LinkClock::time_point, Wire> delayed_;
  std::vector<std::pair<uint64_t, Status>> lostNow_;  // for the next tick
  LinkStats stats_;
};

// Copies the link counters into a node's stats.
void addLinkStats(const LinkStats& links, NodeStats* stats);

}  // namespace troupe::transport::internal
