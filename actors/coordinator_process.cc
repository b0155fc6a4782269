#include "actors/coordinator_process.h"

#include <thread>

#include <caf/all.hpp>

#include "actors/actor_system.h"
#include "actors/fault_injector.h"
#include "common/config.h"
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
  // The plan's message faults on the coordinator's links too (a partition
  // cuts heartbeats to it as well); members are named as they join.
  std::shared_ptr<transport::LinkFaults> linkFaults;
  {
    Config config(troupeConfigSchema());
    config.loadString(options.coordinator.config, "the job's config");
    if (!config.getStringList("faults.plan").empty()) {
      // One clock for every process's fault windows: from now.
      if (config.getInt("faults.start_unix_ms") == 0) {
        config.setValue("faults.start_unix_ms",
                        int64_t(std::chrono::duration_cast<std::chrono::milliseconds>(
                                    std::chrono::system_clock::now().time_since_epoch())
                                    .count()));
        options.coordinator.config = config.toToml();
      }
      const FaultPlan plan = parseFaultPlan(config, int64_t(1) << 20, int64_t(1) << 20);
      linkFaults = injectMessageFaults((*remote)->node(), plan, "coordinator");
    }
  }
  if (linkFaults) {
    auto chained = options.coordinator.joined;
    options.coordinator.joined = [linkFaults, chained](const Member& m) {
      linkFaults->name(m.node, fmt::format("{}:{}", m.role, m.rank));
      if (chained) chained(m);
    };
  }
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
                    [&](caf::error& e) {
                      result = JobResult{};
                      result->error = "coordinator: " + describe(e);
                    },
                    caf::after(100ms) >> [&] {
                      if (options.onNodeStats) options.onNodeStats((*remote)->node().stats());
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
  if (options.onNodeStats) options.onNodeStats((*remote)->node().stats());
  if (linkFaults) {
    const transport::NodeStats stats = (*remote)->node().stats();
    logger("job")->info("coordinator: {}", linkSummary(stats));
    result->links = linkCountsOf(stats, "coordinator", 0, 0);
  }
  return *result;
}

}  // namespace troupe::actors
