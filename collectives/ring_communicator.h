// RingCommunicator: the CPU backend of collectives/communicator.h, over the
// job's UCX transport (raw frames of kind kCollectiveKind beside the actor
// messages, so no mailbox and no serialisation: a chunk is a tensor that
// UCX moves zero-copy from the sender's buffer).
//
// Algorithms:
//  - allReduce of more than smallBytes, or any size on a group whose size is
//    not a power of two: ring reduce-scatter then ring all-gather, each of
//    the n segments cut into chunks of chunkBytes. A chunk is forwarded as
//    soon as it is reduced, so every link carries chunks of several steps at
//    once (pipelined); each rank sends and receives 2 (n-1)/n of the buffer.
//    The owner of a segment scales it for an average before the all-gather,
//    so every rank holds the same bits.
//  - allReduce of at most smallBytes on a power-of-two group: recursive
//    doubling (log2 n exchanges of the whole buffer; a + b == b + a, so both
//    partners hold the same bits).
//  - broadcast: a pipelined chain from the root; gathers: a ring.
//
// Failure: a peer that goes down (the transport's heartbeats, UCX errors, a
// goodbye), a collective that waits longer than `timeout`, or an abort
// message from a rank that failed its part ends the current and every
// later call with an error naming the rank; a failing rank tells the others
// (abort) so they need not wait for their own detection.
//
// Set-up: create() connects to every member (an all-to-all hello), so each
// pair's endpoint and heartbeats are up before the first collective.
//
// Threading: one caller at a time; frames arrive on the node's progress
// thread and are handed over under a mutex.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "collectives/communicator.h"
#include "transport/remote_actors.h"

namespace troupe::collectives {

struct RingOptions {
  int rank = 0;
  std::vector<uint64_t> nodes;  // node id of each rank (this one included)
  // Which group of these nodes this is: a group formed again after a rank
  // was replaced takes a new epoch, and frames of another epoch (an old
  // group's chunks or abort still on their way) are dropped.
  uint64_t epoch = 0;
  size_t chunkBytes = size_t{512} << 10;
  size_t smallBytes = size_t{32} << 10;
  std::chrono::milliseconds timeout{600000};  // one collective, as a last resort
  std::chrono::milliseconds connectTimeout{60000};
  // Waiting for a chunk spins this long before it sleeps (latency of small
  // collectives against CPU burnt while waiting).
  std::chrono::microseconds spin{50};
};

class RingCommunicator final : public Communicator {
 public:
  // Attaches to `remote` (which must outlive the communicator) and connects
  // to every member; fails naming who did not answer.
  static Expected<std::unique_ptr<RingCommunicator>> create(transport::RemoteActors& remote, RingOptions options);
  ~RingCommunicator() override;

  int rank() const override { return options_.rank; }
  int size() const override { return int(options_.nodes.size()); }
  const char* backend() const override { return "ring"; }

  Status allReduce(void* data, size_t count, DType dtype, ReduceOp op) override;
  Status broadcast(void* data, size_t bytes, int root) override;
  Status allGather(const void* in, void* out, size_t bytes) override;
  Expected<std::vector<std::vector<std::byte>>> allGatherV(const void* in, size_t bytes) override;
  Status barrier() override;
  // Direct sends to every rank (the endpoints are all up), in chunks.
  Status allToAll(const void* in, void* out, size_t bytes) override;
  void setTrafficLabel(const std::string& label) override { traffic_ = remote_.trafficLabel(label); }
  Status abort(Status why) override;
  // Recursive doubling (log2 n x the buffer) where allReduce takes it, else
  // the ring's 2 (n - 1) / n.
  double allReduceBytesSent(size_t count, DType dtype) const override;

  struct Inbox;

 private:
  RingCommunicator(transport::RemoteActors& remote, RingOptions options, std::shared_ptr<Inbox> inbox);
  Status connect();
  Status ringAllReduce(std::byte* data, size_t count, DType dtype, ReduceOp op);
  Status doublingAllReduce(std::byte* data, size_t count, DType dtype, ReduceOp op);
  // Ring all-gather of blocks[r] (rank r's bytes; this rank's already
  // filled, the others written here).
  Status ringGather(const std::vector<std::byte*>& blocks, const std::vector<size_t>& sizes);
  Status begin();
  Status finish(Status s);

  transport::RemoteActors& remote_;
  RingOptions options_;
  std::shared_ptr<Inbox> inbox_;
  uint64_t op_ = 0;
  uint8_t traffic_ = 0;  // Envelope::traffic of the data frames
};

}  // namespace troupe::collectives
