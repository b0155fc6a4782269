#include "collectives/peer_watch.h"

#include <mutex>
#include <unordered_map>

#include <fmt/format.h>

namespace troupe::collectives {

using Clock = std::chrono::steady_clock;

struct PeerWatch::Sink final : public transport::FrameSink {
  Sink(const std::vector<uint64_t>& nodes, int self, std::chrono::milliseconds grace) : self(self), grace(grace) {
    for (size_t r = 0; r < nodes.size(); ++r) rankOf[nodes[r]] = int(r);
  }

  void onFrame(uint64_t, transport::DecodedFrame, std::shared_ptr<const void>) override {}

  void onPeerDown(uint64_t peer, transport::Departure how, const Status& why) override {
    auto it = rankOf.find(peer);
    if (it == rankOf.end() || it->second == self) return;
    const bool left = how == transport::Departure::kLeft;
    std::lock_guard<std::mutex> lock(mutex);
    if (!down.isOk() && !(leftOnly && !left)) return;  // a crash outranks a goodbye
    down = Status::unavailable(fmt::format("rank {} (node {:x}) is down: {}", it->second, peer, why.message()));
    leftOnly = left;
    since = Clock::now();
  }

  const int self;
  const std::chrono::milliseconds grace;
  std::unordered_map<uint64_t, int> rankOf;
  mutable std::mutex mutex;
  Status down;
  bool leftOnly = false;
  Clock::time_point since;
};

PeerWatch::PeerWatch(transport::RemoteActors& remote, std::vector<uint64_t> nodes, int self,
                     std::chrono::milliseconds grace)
    : remote_(remote), sink_(std::make_shared<Sink>(nodes, self, grace)) {
  remote_.attachSink(transport::kPeerWatchKind, sink_);
  // The node reports only peers it has a connection with, and a backend
  // like NCCL sends nothing over the transport: an empty frame to every
  // member opens that connection, with its heartbeats and goodbye.
  for (size_t r = 0; r < nodes.size(); ++r) {
    if (int(r) == self) continue;
    transport::Envelope e;
    e.kind = transport::kPeerWatchKind;
    remote_.sendFrame(nodes[r], std::move(e), {});
  }
}

PeerWatch::~PeerWatch() { remote_.detachSink(transport::kPeerWatchKind); }

Status PeerWatch::status() const {
  std::lock_guard<std::mutex> lock(sink_->mutex);
  if (sink_->down.isOk()) return Status::ok();
  if (sink_->leftOnly && Clock::now() - sink_->since < sink_->grace) return Status::ok();
  return sink_->down;
}

}  // namespace troupe::collectives
