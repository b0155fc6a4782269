#include "bench/system/bench_pair.h"

#include <cstdlib>

#include "transport/node_config.h"
#include "transport/remote_actors.h"

namespace troupe::bench {

Expected<BenchPair> startBenchPair(caf::actor_system& system, transport::NodeOptions node, uint64_t selfId,
                                   std::vector<std::string> childArgv) {
  const std::string token = transport::newJobToken();
  ::setenv(transport::kJobTokenVariable, token.c_str(), 1);
  node.nodeId = selfId;
  node.role = "bench";
  node.isCoordinator = true;
  node.token = token;
  auto remote = transport::RemoteActors::start(system, node);
  if (!remote.hasValue()) return remote.status();
  BenchPair pair;
  pair.remote = std::move(*remote);
  childArgv.insert(childArgv.end(), {"--coordinator", pair.remote->node().address()});
  pair.child = std::make_unique<actors::ChildProcess>(childArgv);
  Status joined = pair.remote->node().waitForMembers(2, std::chrono::seconds(30));
  if (!joined.isOk()) {
    return Status::unavailable(fmt::format("the serving process did not join: {}", joined.message()));
  }
  return pair;
}

Expected<std::unique_ptr<transport::RemoteActors>> joinBenchPair(caf::actor_system& system,
                                                                 transport::NodeOptions node, uint64_t selfId,
                                                                 const std::string& role,
                                                                 const std::string& coordinator) {
  node.nodeId = selfId;
  node.role = role;
  node.token = transport::jobTokenFromEnvironment();
  node.coordinator = coordinator;
  return transport::RemoteActors::start(system, node);
}

}  // namespace troupe::bench
