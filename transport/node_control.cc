// UcxNode::Impl's control messages: the token handshake, heartbeats, goodbye and
// the coordinator's membership (see node.h and internal/control.h).
#include "transport/internal/node_impl.h"

namespace troupe::transport {

void UcxNode::Impl::refuse(Connection* c, const std::string& reason) {
  if (c->state == State::kClosed || c->closeAt) return;
  counters_.refused++;
  sendControl(c, kRefused, encodeRefused(Refused{reason}));
  c->refused = true;
  c->peerId = 0;  // never authenticated: no peer goes down
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
      auto hello = decodeHello(body);
      if (!hello.hasValue()) {
        log()->warn("refused {}: {}", c->address, hello.status().message());
        return refuse(c, "malformed hello");
      }
      if (hello->jobHash != tokenFingerprint_) {
        log()->error("refused {} (claims node {:x}): it holds another job's token", c->address, hello->nodeId);
        return refuse(c, "wrong job token");
      }
      c->peerId = hello->nodeId;
      c->clientNonce = hello->nonce;
      c->serverNonce = randomNonce();
      const Mac mac = handshakeMac(options_.token, "server", c->clientNonce, c->serverNonce, c->peerId,
                                   options_.nodeId);
      c->state = State::kAwaitProof;
      sendControl(c, kChallenge, encodeChallenge(Challenge{options_.nodeId, c->serverNonce, mac}));
      return;
    }
    case kChallenge: {  // connecting side
      if (!c->outgoing || c->state != State::kHelloSent) return dropMalformed(c, "unexpected challenge");
      auto ch = decodeChallenge(body);
      if (!ch.hasValue()) {
        c->refused = true;
        return closeConnection(c, Status::corruption(fmt::format("{}: {}", c->address, ch.status().message())), true);
      }
      c->serverNonce = ch->nonce;
      const Mac expect = handshakeMac(options_.token, "server", c->clientNonce, c->serverNonce, options_.nodeId,
                                      ch->nodeId);
      if (!macEquals(expect, ch->mac.data(), ch->mac.size())) {
        counters_.refused++;
        log()->error("refused {} (node {:x}): it does not hold the job token", c->address, ch->nodeId);
        c->refused = true;
        return closeConnection(c, Status::unavailable(fmt::format("{} does not hold the job token", c->address)),
                               true);
      }
      if (c->peerId != 0 && c->peerId != ch->nodeId) {
        return closeConnection(
            c, Status::unavailable(fmt::format("{} is node {:x}, expected {:x}", c->address, ch->nodeId, c->peerId)),
            true);
      }
      c->peerId = ch->nodeId;
      const Mac proof = handshakeMac(options_.token, "client", c->clientNonce, c->serverNonce, options_.nodeId,
                                     ch->nodeId);
      c->state = State::kProofSent;
      sendControl(c, kProof, encodeProof(Proof{proof}));
      return;
    }
    case kProof: {  // listening side
      if (c->outgoing || c->state != State::kAwaitProof) return dropMalformed(c, "unexpected proof");
      auto proof = decodeProof(body);
      const Mac expect = handshakeMac(options_.token, "client", c->clientNonce, c->serverNonce, c->peerId,
                                      options_.nodeId);
      if (!proof.hasValue() || !macEquals(expect, proof->mac.data(), proof->mac.size())) {
        log()->error("refused {} (claims node {:x}): wrong job token", c->address, c->peerId);
        return refuse(c, "wrong job token");
      }
      sendControl(c, kWelcome, encodeEmpty());
      if (c->state == State::kClosed) return;
      return becomeReady(c);
    }
    case kWelcome:  // connecting side
      if (!c->outgoing || c->state != State::kProofSent) return dropMalformed(c, "unexpected welcome");
      return becomeReady(c);
    case kRefused: {  // connecting side
      if (!c->outgoing || c->state == State::kReady) return dropMalformed(c, "unexpected refusal");
      auto refused = decodeRefused(body);
      const std::string reason = refused.hasValue() ? refused->reason : std::string("no reason given");
      c->refused = true;
      return closeConnection(c, Status::unavailable(fmt::format("refused by {}: {}", c->address, reason)), true);
    }
    case kGoodbye:
      if (c->state != State::kReady) return;
      c->left = true;
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
  auto outbox = std::move(c->outbox);
  for (auto& [e, t] : outbox) sendRaw(sender, std::move(e), std::move(t));  // no-op once closed
  auto rawOutbox = std::move(c->rawOutbox);
  for (auto& bytes : rawOutbox) sendRawBytes(c->peerId, std::move(bytes));
  if (c->state == State::kClosed) return;
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
  handler_->onMembers(members);
}

}  // namespace troupe::transport
