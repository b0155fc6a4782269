// UcxNode::Impl's control messages: the token handshake, heartbeats, goodbye and
// the coordinator's membership (see node.h and internal/control.h).
#include "transport/internal/node_impl.h"

namespace troupe::transport {

void UcxNode::Impl::refuse(Connection* c, const std::string& reason) {
  if (c->state == State::kClosed || c->closeAt) return;
  counters_.refused++;
  c->refused = true;
  c->peerId = 0;  // never authenticated: no peer goes down
  sendControl(c, kRefused, encodeRefused(Refused{reason}));
  if (c->state == State::kClosed) return;
  // Give the refusal a moment to leave, then force the endpoint closed (a
  // peer that never answers cannot hold it open). Nothing more is read.
  c->closeAt = Clock::now() + std::chrono::milliseconds(200);
}

void UcxNode::Impl::handleControl(Connection* c, const DecodedFrame& frame) {
  const uint16_t kind = frame.envelope.kind;
  const std::string& body = frame.envelope.body;
  switch (kind) {
    case kHello: {  // listening side, from anyone
      if (c->outgoing || c->state != State::kAwaitHello) return dropMalformed(c, "unexpected hello");
      c->server.emplace(options_.token, options_.nodeId, randomNonce(), options_.integrity);
      auto challenge = c->server->challenge(body);
      if (!challenge.hasValue()) {
        warnAboutHost(c->host, fmt::format("refused {}: {}", c->address, challenge.status().message()));
        return refuse(c, "malformed hello");
      }
      c->peerId = c->server->clientId();
      c->state = State::kAwaitProof;
      sendControl(c, kChallenge, *challenge);
      return;
    }
    case kChallenge: {  // connecting side
      if (!c->outgoing || c->state != State::kHelloSent || !c->client) {
        return dropMalformed(c, "unexpected challenge");
      }
      auto proof = c->client->proof(body);
      if (!proof.hasValue()) {
        c->refused = true;
        if (proof.status().code() == Status::Code::kCorruption) {
          return closeConnection(c, Status::corruption(fmt::format("{}: {}", c->address, proof.status().message())),
                                 true);
        }
        counters_.refused++;
        log()->error("refused {} (node {:x}): {}", c->address, c->client->serverId(), proof.status().message());
        // Say so (the listening side counts it), give it a moment to leave,
        // then close (onTimer), as a refusal the other way.
        const bool mismatch = proof.status().code() == Status::Code::kInvalidArgument;
        sendControl(c, kRefused, encodeRefused(Refused{mismatch ? proof.status().message() : "wrong job token"}));
        if (c->state == State::kClosed) return;
        c->closeWhy = Status::unavailable(fmt::format("{}: {}", c->address, proof.status().message()));
        c->closeAt = Clock::now() + std::chrono::milliseconds(200);
        return;
      }
      if (c->peerId != 0 && c->peerId != c->client->serverId()) {
        return closeConnection(c,
                               Status::unavailable(fmt::format("{} is node {:x}, expected {:x}", c->address,
                                                               c->client->serverId(), c->peerId)),
                               true);
      }
      c->peerId = c->client->serverId();
      c->state = State::kProofSent;
      // integrity = hmac: what the server sends from now on is sealed (its
      // welcome first); what this side sends after the proof is too.
      std::optional<FrameKeys> keys;
      if (options_.integrity == Integrity::kHmac) {
        keys = c->client->frameKeys();
        c->recvMac = std::make_unique<FrameMac>(keys->receive);
      }
      sendControl(c, kProof, *proof);
      if (c->state == State::kClosed) return;
      if (keys) c->sendMac = std::make_unique<FrameMac>(keys->send);
      return;
    }
    case kProof: {  // listening side
      if (c->outgoing || c->state != State::kAwaitProof || !c->server) return dropMalformed(c, "unexpected proof");
      if (Status st = c->server->verify(body); !st.isOk()) {
        warnAboutHost(c->host, fmt::format("refused {} (claims node {:x}): {}", c->address, c->peerId, st.message()));
        // A client of hmac takes only a sealed word once its proof is
        // sent: the refusal goes sealed (a holder of the token can read
        // it). One of another setting reads it as it is.
        if (options_.integrity == Integrity::kHmac && c->server->clientIntegrity() == uint8_t(Integrity::kHmac)) {
          c->sendMac = std::make_unique<FrameMac>(c->server->frameKeys().send);
        }
        // Another transport.integrity (with the right token) is said as it is.
        return refuse(c, st.code() == Status::Code::kInvalidArgument ? st.message() : "wrong job token");
      }
      if (options_.integrity == Integrity::kHmac) {  // the welcome is sealed, and all after it both ways
        const FrameKeys keys = c->server->frameKeys();
        c->sendMac = std::make_unique<FrameMac>(keys.send);
        c->recvMac = std::make_unique<FrameMac>(keys.receive);
      }
      sendControl(c, kWelcome, encodeEmpty());
      if (c->state == State::kClosed) return;
      return becomeReady(c);
    }
    case kWelcome:  // connecting side
      if (!c->outgoing || c->state != State::kProofSent) return dropMalformed(c, "unexpected welcome");
      return becomeReady(c);
    case kRefused: {
      if (!c->outgoing && c->state == State::kAwaitProof) {  // it found this node's proof wrong
        counters_.refused++;
        auto said = decodeRefused(body);
        warnAboutHost(c->host, fmt::format("{} (claims node {:x}) refused this node: {}", c->address, c->peerId,
                                           said.hasValue() ? said->reason : std::string("it holds another token")));
        return closeConnection(c, Status::ok(), false);
      }
      if (!c->outgoing || c->state == State::kReady) return dropMalformed(c, "unexpected refusal");
      auto refused = decodeRefused(body);
      const std::string reason = refused.hasValue() ? refused->reason : std::string("no reason given");
      c->refused = true;
      return closeConnection(c, Status::unavailable(fmt::format("refused by {}: {}", c->address, reason)), true);
    }
    case kGoodbye:
      if (c->state != State::kReady) return;
      if (c->saidGoodbye) {  // the answer to this node's own (shutdown)
        return closeConnection(c, Status::unavailable(fmt::format("node {:x} answered", c->peerId)), true);
      }
      c->left = true;  // (first: a send that fails closes the connection, as a departure then)
      // Answered in kind, after the frames that came before it on this
      // connection: the leaving node waits for the answer (or for this side
      // to close) before its process exits, since its sockets closing could
      // reach this node before frames still queued for it (shutdown).
      if (!c->goodbyeSent) sendControl(c, kGoodbye, encodeEmpty());  // (said already: this node is leaving too)
      // (A peer given up already, whose goodbye came on its other
      // connection: the answer made its link again; forgotten again.)
      if (links_ && downPeers_.count(c->peerId)) links_->forget(c->peerId);
      return closeConnection(c, Status::unavailable(fmt::format("node {:x} left the job", c->peerId)), true);
    case kHeartbeat:
      if (c->state == State::kReady) c->lastReceived = Clock::now();
      return;
    case kJoin: {
      if (c->state != State::kReady) {
        counters_.unauthenticated++;
        return;
      }
      if (!options_.isCoordinator) return dropMalformed(c, "join sent to a node that is not the coordinator");
      auto member = decodeJoin(body);
      if (!member.hasValue()) return dropMalformed(c, member.status().message());
      if (member->nodeId != c->peerId) return dropMalformed(c, fmt::format("join for node {:x}", member->nodeId));
      membership_[c->peerId] = *member;
      log()->info("node {:x} ({}) joined from {}:{}", c->peerId, member->role, member->host, member->port);
      return broadcastMembers();
    }
    case kMembers: {
      if (c->state != State::kReady) {
        counters_.unauthenticated++;
        return;
      }
      if (!isCoordinatorAddress(c->address) || !c->outgoing) {
        return dropMalformed(c, "member list from a node that is not the coordinator");
      }
      auto list = decodeMembers(body);
      if (!list.hasValue()) return dropMalformed(c, list.status().message());
      return setMembers(std::move(list->members));
    }
    default:
      return dropMalformed(c, fmt::format("unknown control kind {}", kind));
  }
}

void UcxNode::Impl::becomeReady(Connection* c) {
  c->state = State::kReady;
  c->lastReceived = Clock::now();
  downPeers_.erase(c->peerId);
  log()->debug("node {:x}: handshake with node {:x} ({}) done", options_.nodeId, c->peerId, c->address);
  if (connecting_.count(c->peerId) && connecting_[c->peerId] == c) connecting_.erase(c->peerId);
  if (!byPeer_.count(c->peerId)) byPeer_[c->peerId] = c;
  Connection* sender = byPeer_[c->peerId];
  // Every frame to the peer goes over `sender` from now on. Where both
  // sides connected at once, this node's own connection to the peer may
  // still be in its handshake, holding what was sent before this one was
  // ready: that goes first, here, or the frames sent from now on would
  // overtake it (and CAF's order between two actors would not hold).
  // That connection then carries nothing and stands for nothing: it
  // finishes its handshake (or fails to) as a spare, and its failure no
  // longer takes the peer down while this one serves.
  std::vector<Connection*> waiting;
  if (auto it = connecting_.find(c->peerId); it != connecting_.end() && it->second != c) {
    waiting.push_back(it->second);
    connecting_.erase(it);
  }
  waiting.push_back(c);
  for (Connection* w : waiting) {
    if (w != c) counters_.framesHandedOver += w->outbox.size() + w->rawOutbox.size();
    auto outbox = std::move(w->outbox);
    w->outbox.clear();
    for (auto& [e, t] : outbox) sendRaw(sender, std::move(e), std::move(t));  // no-op once closed
    auto rawOutbox = std::move(w->rawOutbox);
    w->rawOutbox.clear();
    for (auto& [bytes, flips] : rawOutbox) sendRawBytes(c->peerId, std::move(bytes), &flips);
    if (w != c && w->state != State::kClosed) releaseFarewell(w);  // a leaving node no longer waits for this spare
  }
  if (c->state == State::kClosed) return;
  if (leaving_) return sayGoodbye(c);  // ready while this node leaves: after what it held
  if (c->outgoing && !options_.isCoordinator && isCoordinatorAddress(c->address)) {
    sendControl(c, kJoin, encodeJoin(Member{options_.nodeId, options_.role, options_.listenHost, port_}));
  }
}

void UcxNode::Impl::broadcastMembers() {
  MemberList list;
  for (auto& [id, m] : membership_) list.members.push_back(m);
  list.epoch = ++membersEpoch_;
  setMembers(list.members);
  const std::string body = encodeMembers(list);
  std::vector<Connection*> targets;  // a send may close one and change both maps
  for (const Member& m : list.members) {
    if (m.nodeId == options_.nodeId) continue;
    if (auto it = byPeer_.find(m.nodeId); it != byPeer_.end()) targets.push_back(it->second);
  }
  for (Connection* c : targets) sendControl(c, kMembers, body);
}

void UcxNode::Impl::setMembers(std::vector<Member> members) {
  {
    std::lock_guard<std::mutex> lock(membersMutex_);
    members_ = members;
  }
  membersChanged_.notify_all();
  // (A coordinator's failed send can broadcast from up the stack of a
  // caller's send.)
  onPollingSide([this, members = std::move(members)] { handler_->onMembers(members); });
}

}  // namespace troupe::transport
