#include "transport/internal/links.h"

#include <cstring>

#include "transport/internal/control.h"
#include "transport/node.h"

namespace troupe::transport::internal {
namespace {

std::string resendBody(uint64_t from, uint64_t to) {
  std::string b(16, '\0');
  std::memcpy(b.data(), &from, 8);
  std::memcpy(b.data() + 8, &to, 8);
  return b;
}

}  // namespace

bool linkCarried(uint16_t kind) {
  return kind >= kFirstUserKind || kind == kHeartbeat || kind == kGoodbye || kind == kJoin || kind == kMembers ||
         kind == kLinkAck || kind == kLinkResend;
}

bool linkSequenced(uint16_t kind) { return kind >= kFirstUserKind || kind == kJoin || kind == kMembers; }

void addLinkStats(const LinkStats& l, NodeStats* s) {
  s->framesResent = l.resent;
  s->duplicatesSuppressed = l.duplicates;
  s->framesHeldOutOfOrder = l.heldOutOfOrder;
  s->gapsFound = l.gaps;
  s->faultsDropped = l.dropped;
  s->faultsDuplicated = l.duplicated;
  s->faultsDelayed = l.delayed;
  s->faultsReordered = l.reordered;
  s->faultsCorrupted = l.corrupted;
  s->faultsPartitioned = l.partitioned;
  s->linksGivenUp = l.linksLost;
}

void Links::send(uint64_t peer, Envelope envelope, std::vector<Tensor> tensors, bool sequenced,
                 LinkClock::time_point now, std::vector<Wire>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  Link& link = links_[peer];
  if (sequenced) {
    envelope.linkSeq = link.nextSeq++;
    stats_.sequenced++;
    const bool keep = faults_ != nullptr || tensors.empty();
    link.held.push_back(Held{envelope.linkSeq, envelope, keep ? tensors : std::vector<Tensor>{}, 1, keep, now, 0, now});
  } else {
    envelope.linkSeq = 0;
  }
  emit(peer, link, std::move(envelope), std::move(tensors), 1, now, out);
}

void Links::emit(uint64_t peer, Link& link, Envelope envelope, std::vector<Tensor> tensors, uint64_t attempt,
                 LinkClock::time_point now, std::vector<Wire>* out) {
  envelope.sourceNode = self_;
  envelope.linkAck = link.expected;
  envelope.linkSent = link.nextSeq - 1;
  link.unacked = 0;  // this frame acknowledges what arrived
  const bool user = envelope.kind >= kFirstUserKind;
  LinkFaultAction a;
  if (faults_) a = faults_->decide(self_, peer, envelope.linkSeq, attempt, user && envelope.linkSeq != 0);
  // A frame held back by a reorder goes right after this one.
  auto flushReordered = [&] {
    if (link.reordered) {
      out->push_back(std::move(*link.reordered));
      link.reordered.reset();
    }
  };
  if (a.drop) {
    if (a.rule >= 0 && faults_->rules()[size_t(a.rule)].kind == LinkFaultKind::kPartition) {
      stats_.partitioned++;
    } else {
      stats_.dropped++;
    }
    return;
  }
  Wire w;
  w.peer = peer;
  if (!a.flipBits.empty()) {
    stats_.corrupted++;
    std::vector<TensorView> views;
    for (const Tensor& t : tensors) views.push_back(TensorView{t.data, t.bytes, t.dtype});
    w.raw = true;
    w.bytes = encodeFrame(envelope, views);
    w.flipBits = std::move(a.flipBits);  // the node flips them once the frame is guarded
  } else {
    w.envelope = std::move(envelope);
    w.tensors = std::move(tensors);
  }
  if (a.delay.count() > 0) {
    stats_.delayed++;
    delayed_.emplace(now + a.delay, std::move(w));
    return;
  }
  if (a.reorder && !link.reordered) {
    stats_.reordered++;
    link.reordered = std::move(w);
    link.reorderedAt = now;
    return;
  }
  if (a.copies > 1) {
    stats_.duplicated++;
    out->push_back(w);
  }
  out->push_back(std::move(w));
  flushReordered();
}

void Links::ackNow(uint64_t peer, Link& link, LinkClock::time_point now, std::vector<Wire>* out) {
  Envelope e;
  e.kind = kLinkAck;
  emit(peer, link, std::move(e), {}, 1, now, out);
}

void Links::nackGap(uint64_t peer, Link& link, LinkClock::time_point now, std::vector<Wire>* out) {
  if (!link.gapSince) {
    // A grace of one interval before the first request: what shows the gap
    // (a heartbeat on a second connection, say) may have overtaken the frame.
    link.gapSince = now;
    link.nextNack = now + options_.nackInterval;
    return;
  }
  if (now < link.nextNack) return;
  const uint64_t from = link.expected;
  const uint64_t to = link.early.empty() ? link.peerSent + 1 : std::min(link.early.begin()->first, link.peerSent + 1);
  if (to <= from) return;
  link.nextNack = now + options_.nackInterval;
  stats_.gaps++;
  Envelope e;
  e.kind = kLinkResend;
  e.body = resendBody(from, to);
  emit(peer, link, std::move(e), {}, 1, now, out);
}

void Links::receive(uint64_t peer, DecodedFrame frame, std::shared_ptr<const void> owner, LinkClock::time_point now,
                    std::vector<Delivery>* deliver, std::vector<Wire>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  Link& link = links_[peer];
  const Envelope& e = frame.envelope;
  // What the peer received from us: drop what it has.
  while (!link.held.empty() && link.held.front().seq < e.linkAck) link.held.pop_front();
  link.peerSent = std::max(link.peerSent, e.linkSent);
  if (e.kind == kLinkResend) {
    if (e.body.size() == 16) {
      uint64_t from, to;
      std::memcpy(&from, e.body.data(), 8);
      std::memcpy(&to, e.body.data() + 8, 8);
      std::vector<std::pair<Envelope, std::vector<Tensor>>> again;
      std::vector<uint64_t> attempts;
      for (Held& h : link.held) {
        if (h.seq >= to) break;
        if (h.seq < from) continue;
        if (!h.bytesKept) {
          stats_.linksLost++;
          lostNow_.emplace_back(peer, Status::unavailable(fmt::format(
                                          "node {:x} asked for frame {} again, whose bytes were not kept (no message "
                                          "faults are injected: a transport lost it)",
                                          peer, h.seq)));
          break;
        }
        // Backs off per frame: a large one may still be on its way.
        const auto backoff = options_.nackInterval * (int64_t(1) << std::min<uint64_t>(h.attempts - 1, 6));
        if (now - h.lastSent < backoff) continue;
        h.attempts++;
        h.lastSent = now;
        h.probes = 0;
        again.emplace_back(h.envelope, h.tensors);
        attempts.push_back(h.attempts);
      }
      for (size_t i = 0; i < again.size(); ++i) {
        stats_.resent++;
        emit(peer, link, std::move(again[i].first), std::move(again[i].second), attempts[i], now, out);
      }
    }
  } else if (e.kind != kLinkAck) {
    if (e.linkSeq == 0) {
      deliver->push_back(Delivery{peer, std::move(frame), std::move(owner)});
    } else if (e.linkSeq < link.expected || link.early.count(e.linkSeq)) {
      stats_.duplicates++;
      // It may have missed our ack: say it again soon.
      if (link.unacked == 0) link.firstUnacked = now;
      link.unacked++;
    } else if (e.linkSeq > link.expected) {
      stats_.heldOutOfOrder++;
      const uint64_t seq = e.linkSeq;
      link.early.emplace(seq, Waiting{std::move(frame), std::move(owner)});
    } else {
      deliver->push_back(Delivery{peer, std::move(frame), std::move(owner)});
      link.expected++;
      link.gapSince.reset();  // progress: a gap still open counts from now
      if (link.unacked++ == 0) link.firstUnacked = now;
      while (!link.early.empty() && link.early.begin()->first == link.expected) {
        auto node = link.early.extract(link.early.begin());
        deliver->push_back(Delivery{peer, std::move(node.mapped().frame), std::move(node.mapped().owner)});
        link.expected++;
        link.unacked++;
      }
    }
  }
  if (gapOpen(link)) {
    nackGap(peer, link, now, out);
  } else {
    link.gapSince.reset();
  }
  if (link.unacked >= options_.ackEvery) ackNow(peer, link, now, out);
}

void Links::tick(LinkClock::time_point now, std::vector<Wire>* out, std::vector<std::pair<uint64_t, Status>>* lost) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& l : lostNow_) lost->push_back(std::move(l));
  lostNow_.clear();
  while (!delayed_.empty() && delayed_.begin()->first <= now) {
    auto node = delayed_.extract(delayed_.begin());
    out->push_back(std::move(node.mapped()));
  }
  for (auto& [peer, link] : links_) {
    if (link.reordered && now - link.reorderedAt >= LinkFaults::kReorderHold) {
      out->push_back(std::move(*link.reordered));
      link.reordered.reset();
    }
    if (gapOpen(link)) {
      nackGap(peer, link, now, out);
      if (link.gapSince && now - *link.gapSince > options_.giveUpAfter) {
        stats_.linksLost++;
        lost->emplace_back(peer, Status::unavailable(fmt::format(
                                     "frames {}.. from node {:x} still missing after {} ms of resend requests",
                                     link.expected, peer, options_.giveUpAfter.count())));
        link.gapSince.reset();
      }
    }
    if (link.unacked > 0 && now - link.firstUnacked >= options_.ackDelay) ackNow(peer, link, now, out);
    if (const Held* h = probed(link); h && now >= probeAt(*h)) {
      Held& oldest = link.held.front();
      oldest.probes++;
      oldest.probedAt = now;
      stats_.probes++;
      ackNow(peer, link, now, out);
    }
  }
}

const Links::Held* Links::probed(const Link& link) const {
  if (!faults_ || link.held.empty() || !link.held.front().bytesKept) return nullptr;
  return &link.held.front();
}

LinkClock::time_point Links::probeAt(const Held& h) const {
  const LinkClock::time_point last = h.probes > 0 ? std::max(h.lastSent, h.probedAt) : h.lastSent;
  return last + options_.resendAfter * (int64_t(1) << std::min<uint64_t>(h.probes, 6));
}

std::optional<LinkClock::time_point> Links::nextDue() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::optional<LinkClock::time_point> due;
  auto earlier = [&](LinkClock::time_point t) {
    if (!due || t < *due) due = t;
  };
  if (!lostNow_.empty()) earlier(LinkClock::time_point{});
  if (!delayed_.empty()) earlier(delayed_.begin()->first);
  for (const auto& [peer, link] : links_) {
    if (link.reordered) earlier(link.reorderedAt + LinkFaults::kReorderHold);
    if (link.unacked > 0) earlier(link.firstUnacked + options_.ackDelay);
    if (gapOpen(link)) earlier(link.nextNack);
    if (const Held* h = probed(link)) earlier(probeAt(*h));
  }
  return due;
}

void Links::forget(uint64_t peer) {
  std::lock_guard<std::mutex> lock(mu_);
  links_.erase(peer);
  for (auto it = lostNow_.begin(); it != lostNow_.end();) it = it->first == peer ? lostNow_.erase(it) : std::next(it);
  for (auto it = delayed_.begin(); it != delayed_.end();) {
    it = it->second.peer == peer ? delayed_.erase(it) : std::next(it);
  }
}

LinkStats Links::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace troupe::transport::internal
