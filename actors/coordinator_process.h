// The coordinator's process: its actor system, its transport node (the one
// every member joins) and the coordinator actor (actors/coordinator.h), run
// until the job is over.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include <caf/fwd.hpp>

#include "actors/coordinator.h"
#include "transport/node.h"
#include "transport/record.h"

namespace troupe::actors {

struct CoordinatorProcessOptions {
  CoordinatorOptions coordinator;  // `locate` is set here (the transport's proxies)
  transport::NodeOptions node;     // where to listen, the token
  transport::WireTypes types;      // the job's own records (the lifecycle's are added)
  std::function<void(caf::actor_system_config&)> configure;  // the job's message types
  int schedulerThreads = 2;
  // Called once the coordinator listens, with its address (a local job
  // starts its processes from here).
  std::function<void(const std::string& address)> onListening;
  // Polled about every 100 ms while the job runs: a non-empty answer fails
  // the job with it (Ctrl-C, a process that could not start).
  std::function<std::string()> checkAbort;
  // Polled as often with the coordinator's node's counters (handshakes
  // refused, timed out, idle connections closed...), and once more when the
  // job is over. May be null.
  std::function<void(const transport::NodeStats&)> onNodeStats;
};

// Runs the job's coordinator until the job is over. Throws SetupError when
// its node cannot start; a job that fails is a result, not an exception.
JobResult runCoordinator(CoordinatorProcessOptions options, std::shared_ptr<JobPolicy> policy);

}  // namespace troupe::actors
