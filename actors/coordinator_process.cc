#include "actors/coordinator_process.h"

#include <thread>

#include <caf/all.hpp>

#include "actors/actor_system.h"
#include "common/check.h"
#include "common/logging.h"
#include "transport/remote_actors.h"

namespace troupe::actors {

using namespace std::chrono_literals;

JobResult runCoordinator(CoordinatorProcessOptions options, std::shared_ptr<JobPolicy> policy) {
  caf::actor_system_config cfg;
  configureActorSystem(cfg, {options.schedulerThreads});
  if (options.configure) options.configure(cfg);
  caf::actor_system system{cfg};
  transport::NodeOptions node = options.node;
  node.role = "coordinator";
  node.isCoordinator = true;
  node.coordinator.clear();
  transport::WireTypes types = lifecycleWireTypes();
  types.merge(options.types);
  auto remote = transport::RemoteActors::start(system, node, std::move(types));
  if (!remote.hasValue()) TROUPE_SETUP_ERROR("coordinator: {}", remote.status().message());
  transport::RemoteActors* proxies = remote->get();
  options.coordinator.locate = [proxies](uint64_t peer, const std::string& name) {
    return proxies->remoteActor(peer, name);
  };
  auto coord = spawnCoordinator(system, std::move(options.coordinator), std::move(policy));
  (*remote)->publish(coord, kCoordinatorName);
  logger("job")->info("coordinator listening on {}", (*remote)->node().address());
  if (options.onListening) options.onListening((*remote)->node().address());
  std::optional<JobResult> result;
  {
    caf::scoped_actor self{system};
    self->send(coord, run_atom::value);
    bool aborted = false;
    while (!result) {
      self->receive([&](JobResult& r) { result = std::move(r); },
                    [&](caf::error& e) { result = JobResult{false, "coordinator: " + describe(e), {}}; },
                    caf::after(100ms) >> [&] {
                      if (aborted || !options.checkAbort) return;
                      std::string why = options.checkAbort();
                      if (!why.empty()) {
                        aborted = true;
                        self->send(coord, abort_atom::value, why);
                      }
                    });
    }
    // Let the members receive their Shutdown before this node goes.
    std::this_thread::sleep_for(200ms);
    self->send_exit(coord, caf::exit_reason::user_shutdown);
  }
  return *result;
}

}  // namespace troupe::actors
