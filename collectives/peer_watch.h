// PeerWatch: the transport's view of a group's members, for a backend whose
// data does not cross the transport (NCCL) and so would not see a member go
// down by itself. Its status() is the backend's health callback.
//
// A member that crashed or lost its connection fails the group at once. A
// member that left the job (said goodbye) finished every collective before
// it left, so what it sent has arrived; its leaving fails the group only
// when a wait still goes on `grace` after it.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"
#include "transport/remote_actors.h"

namespace troupe::collectives {

class PeerWatch {
 public:
  // Listens on `remote` (which must outlive the watch) for the members in
  // `nodes` (node id of each rank; `self` is this one's rank), and sends
  // each an empty frame so the transport connects to it (the node watches
  // only the peers it is connected to).
  PeerWatch(transport::RemoteActors& remote, std::vector<uint64_t> nodes, int self,
            std::chrono::milliseconds grace = std::chrono::milliseconds(1000));
  ~PeerWatch();
  PeerWatch(const PeerWatch&) = delete;
  PeerWatch& operator=(const PeerWatch&) = delete;

  // OK while every member is up; else an error naming the first member
  // that went down (rank and node) and why.
  Status status() const;

  struct Sink;

 private:
  transport::RemoteActors& remote_;
  std::shared_ptr<Sink> sink_;
};

}  // namespace troupe::collectives
