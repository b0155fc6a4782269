// A member process of a job (ps, worker, ...): what it does whatever its
// role (DESIGN.md, Processes and roles; Supervision).
//
// runMember
//  - starts the process's actor system and transport node and joins the
//    coordinator at options.node.coordinator;
//  - publishes the node agent (kAgentName): the coordinator monitors it and
//    sends it Shutdown when the job is over;
//  - says Hello and gets its rank and the job's config; lets the role set up
//    (Role::prepare: a shard publishes itself); says Ready and gets the
//    Roster; then runs the role's actors (Role::start) under a supervisor
//    (actors/supervisor.h: one-for-one, supervision.max_restarts in
//    supervision.restart_window_s). A child that the supervisor gives up on
//    is escalated: the agent tells the coordinator (MemberFailed) and the
//    process exits with kExitFailed;
//  - watches the coordinator: when it goes (crashed, timed out, left), the
//    process says so in one line, stops its actors and exits with
//    kExitCoordinatorLost; one that is still stuck after kStopGrace (a
//    collective waiting on a dead peer, say) exits hard;
//  - takes a lost rank of its role when the coordinator moves one into it
//    (Adopt): another role object (MemberOptions::anotherRole) goes through
//    prepare, Ready and start as a replacement process would, under a
//    supervisor of its own. The process's ranks share its fate: a failure
//    of either's actors ends the process;
//  - ends on Shutdown: it stops its actors, lets the roles release what
//    they hold (Role::release, before the transport goes) and exits 0.
// Every wait is bounded: the requests by their timeouts, the wait for
// Shutdown by the coordinator's liveness (its heartbeats), the stop by
// kStopGrace.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include "actors/messages.h"
#include "actors/supervisor.h"
#include "common/config.h"
#include "transport/node.h"
#include "transport/record.h"

namespace troupe::transport {
class RemoteActors;
}

namespace troupe::actors {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;            // its work failed, or the job did
inline constexpr int kExitSetup = 2;             // a bad config or set-up
inline constexpr int kExitCoordinatorLost = 3;   // the coordinator went away
inline constexpr std::chrono::seconds kStopGrace{10};

// What a role gets to work with. Lives as long as the process.
struct MemberContext {
  caf::actor_system& system;
  transport::RemoteActors& remote;
  caf::actor coordinator;  // its proxy
  std::string role;
  Welcome welcome;         // rank, incarnation, config text
  Config config;           // the job's config, parsed
};

// The role-specific part of a member process.
class Role {
 public:
  virtual ~Role() = default;
  // With its place in the job: set up and publish what other members need
  // before anyone starts (a shard). Throws SetupError on a bad config.
  virtual void prepare(MemberContext& ctx) = 0;
  // With the roster: the actors that do the role's work, supervised
  // one-for-one. A child that exits normally is done. Throws SetupError.
  virtual std::vector<ChildSpec> start(MemberContext& ctx, const Roster& roster) = 0;
  // The actors are gone: let go of what must not outlive the transport (a
  // communicator) and of every actor handle (the actor system waits for a
  // detached actor until its last handle is gone).
  virtual void release() {}
};

struct MemberOptions {
  std::string role;
  int64_t requestedRank = -1;   // -1: any
  transport::NodeOptions node;  // coordinator address and token set
  int schedulerThreads = 2;
  transport::WireTypes types;   // the job's own records (the lifecycle's are added)
  // Registers the job's own message types with the actor system.
  std::function<void(caf::actor_system_config&)> configure;
  // Another role object of the same kind, for a rank the coordinator moves
  // into this process (Adopt); null: the process takes no other rank.
  std::function<std::unique_ptr<Role>()> anotherRole;
};

// Runs a member process until the job ends; returns its exit status.
int runMember(const MemberOptions& options, Role& role);

}  // namespace troupe::actors
