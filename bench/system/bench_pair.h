// The two processes of a system benchmark (troupe bench transport / ps).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <caf/fwd.hpp>

#include "actors/launcher.h"
#include "common/status.h"
#include "transport/node.h"

namespace troupe::transport {
class RemoteActors;
}

namespace troupe::bench {

// The two processes of a system benchmark: this one (the coordinator node,
// id `selfId`) and a serving process run as `childArgv` with
// "--coordinator <this node's address>" appended. A fresh job token is
// exported for the child. Returns once the child has joined, or an error
// naming what failed.
struct BenchPair {
  std::unique_ptr<transport::RemoteActors> remote;
  std::unique_ptr<actors::ChildProcess> child;
};
Expected<BenchPair> startBenchPair(caf::actor_system& system, transport::NodeOptions node, uint64_t selfId,
                                   std::vector<std::string> childArgv);
// The serving side: joins `coordinator` as node `selfId` with the token
// from the environment.
Expected<std::unique_ptr<transport::RemoteActors>> joinBenchPair(caf::actor_system& system,
                                                                 transport::NodeOptions node, uint64_t selfId,
                                                                 const std::string& role,
                                                                 const std::string& coordinator);

}  // namespace troupe::bench
