// The job's lifecycle vocabulary (DESIGN.md, Processes and roles): what the
// coordinator and the processes of a job say to each other, whatever the
// job trains. Every message is a record (transport/record.h): a struct,
// registered with CAF's type ids, that crosses processes field by field and
// is checked field by field on arrival. A job adds its own records
// (workers/job_messages.h) beside these.
//
// A member process (ps, worker) publishes its agent as kAgentName and, in
// order:
//   Hello -> Welcome        the coordinator gives it a rank (the one asked
//                           for when free, or a lost rank to replace) and
//                           the job's config, and monitors its agent
//   Ready -> Roster         once every member is ready (a replacement gets
//                           the roster at once); the roster names every
//                           member's transport node
// A member whose work failed says MemberFailed before its process exits. A
// lost member may be moved into a live process of its role (Adopt, to that
// process's agent): the process takes the rank as well, as a replacement
// would (Ready -> Roster), and the two ranks share its fate from then on. The
// coordinator sends Shutdown to every agent when the job is over; an agent
// that loses its coordinator stops its process (actors/node_agent.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <caf/atom.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/type_id.hpp>

#include "transport/record.h"

namespace troupe::actors {

inline constexpr const char* kCoordinatorName = "coordinator";
inline constexpr const char* kAgentName = "agent";

struct Hello {
  std::string role;            // "ps", "worker", ...
  int64_t requestedRank = -1;  // -1: any free rank
  uint64_t node = 0;           // its transport node
  std::string address;         // host:port its node listens on
  int64_t pid = 0;             // its process id (on its host)
};

struct Welcome {
  int64_t rank = -1;
  int64_t incarnation = 0;  // 0: the rank's first process; n: its n-th replacement
  std::string config;       // the job's configuration (TOML)
};

struct Ready {
  std::string role;
  int64_t rank = 0;
  int64_t incarnation = 0;
};

// Every member's transport node, role group by role group in the job's
// order, by rank within a group (0 where a rank has no live process).
struct Roster {
  std::vector<std::string> roles;
  std::vector<int64_t> counts;
  std::vector<uint64_t> nodes;
  int64_t generation = 0;  // bumped whenever a member is replaced

  // The nodes of one role (empty when the job has no such role).
  std::vector<uint64_t> nodesOf(const std::string& role) const;
};

// To an agent, from the coordinator: this process takes `rank` of its role
// as well (a lost member the job goes on with in a live process), as
// incarnation `incarnation`, with the job's config.
struct Adopt {
  std::string role;
  int64_t rank = -1;
  int64_t incarnation = 0;
  std::string config;
};

// To an agent, from the coordinator: fault `fault` of the job's plan
// (actors/fault_plan.h) hits this process now: kind "kill" (SIGKILL),
// "stop" (SIGSTOP, and SIGCONT durationMs later) or "kill-actor" (the
// actor of the process's rank named `actor` is killed: its supervisor
// finds it down).
struct Inject {
  int64_t fault = 0;
  std::string kind;
  int64_t durationMs = 0;
  std::string actor;
  int64_t rank = -1;  // kill-actor: the rank whose actor it is (one moved into this process has its own)
};

// To the coordinator, from a member: a fault it arms itself (a worker's
// step-triggered one) fires now. Answered with the fault's id once it is
// in the job's record; the member then goes on with the fault.
struct FaultFired {
  int64_t fault = 0;
  std::string role;
  int64_t rank = 0;
  int64_t incarnation = 0;
  int64_t step = 0;
};

// What a process's links did (transport::NodeStats): from its agent to the
// coordinator once a second while the job's plan has message faults, and
// as the answer to (links_atom) from the coordinator. The fault report adds
// them up (the last word of a process killed since is at most a second old).
struct LinkCounts {
  std::string role;
  int64_t rank = 0, incarnation = 0;
  int64_t resent = 0, duplicatesSuppressed = 0, heldOutOfOrder = 0, gaps = 0, malformedRefused = 0, linksGivenUp = 0;
  // The message faults injected on this process's outgoing frames.
  int64_t dropped = 0, duplicated = 0, delayed = 0, reordered = 0, corrupted = 0, partitioned = 0;
  // Everything its node sent and received so far (frames and bytes).
  int64_t framesSent = 0, framesReceived = 0, bytesSent = 0, bytesReceived = 0;
  // Messages waiting in the agent's mailbox when it answered (links_atom
  // only; common/mailbox.h).
  int64_t mailbox = 0;
};

// To an agent: the job is over; its process stops.
struct Shutdown {
  std::string why;  // "" when the job succeeded
};

// From an agent: this member failed (its supervisor gave up on an actor of
// it); the process exits next. The coordinator handles it as the loss of
// the member, with `why`, and answers with the rank.
struct MemberFailed {
  std::string role;
  int64_t rank = 0;
  int64_t incarnation = 0;
  std::string why;
  bool setup = false;  // it could not set up (a bad config): a replacement would fail alike
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Hello& x) {
  return f(caf::meta::type_name("Hello"), x.role, x.requestedRank, x.node, x.address, x.pid);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Welcome& x) {
  return f(caf::meta::type_name("Welcome"), x.rank, x.incarnation, x.config);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Ready& x) {
  return f(caf::meta::type_name("Ready"), x.role, x.rank, x.incarnation);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Roster& x) {
  return f(caf::meta::type_name("Roster"), x.roles, x.counts, x.nodes, x.generation);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Adopt& x) {
  return f(caf::meta::type_name("Adopt"), x.role, x.rank, x.incarnation, x.config);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Inject& x) {
  return f(caf::meta::type_name("Inject"), x.fault, x.kind, x.durationMs, x.actor, x.rank);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, FaultFired& x) {
  return f(caf::meta::type_name("FaultFired"), x.fault, x.role, x.rank, x.incarnation, x.step);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, LinkCounts& x) {
  return f(caf::meta::type_name("LinkCounts"), x.role, x.rank, x.incarnation, x.resent, x.duplicatesSuppressed,
           x.heldOutOfOrder, x.gaps, x.malformedRefused, x.linksGivenUp, x.dropped, x.duplicated, x.delayed,
           x.reordered, x.corrupted, x.partitioned, x.framesSent, x.framesReceived, x.bytesSent, x.bytesReceived, x.mailbox);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Shutdown& x) {
  return f(caf::meta::type_name("Shutdown"), x.why);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, MemberFailed& x) {
  return f(caf::meta::type_name("MemberFailed"), x.role, x.rank, x.incarnation, x.why, x.setup);
}

// The lifecycle records, for RemoteActors::start (merge the job's own).
transport::WireTypes lifecycleWireTypes();

// Local messages (never cross processes).
using run_atom = caf::atom_constant<caf::atom("run")>;
using abort_atom = caf::atom_constant<caf::atom("abort")>;
using deadline_atom = caf::atom_constant<caf::atom("deadline")>;
// (links_atom) -> LinkCounts: an agent's process's link counters.
using links_atom = caf::atom_constant<caf::atom("links")>;

}  // namespace troupe::actors

CAF_BEGIN_TYPE_ID_BLOCK(troupe_actors, caf::first_custom_type_id)
CAF_ADD_TYPE_ID(troupe_actors, (troupe::actors::Hello))
CAF_ADD_TYPE_ID(troupe_actors, (troupe::actors::Welcome))
CAF_ADD_TYPE_ID(troupe_actors, (troupe::actors::Ready))
CAF_ADD_TYPE_ID(troupe_actors, (troupe::actors::Roster))
CAF_ADD_TYPE_ID(troupe_actors, (troupe::actors::Shutdown))
CAF_ADD_TYPE_ID(troupe_actors, (troupe::actors::MemberFailed))
CAF_ADD_TYPE_ID(troupe_actors, (troupe::actors::Adopt))
CAF_ADD_TYPE_ID(troupe_actors, (troupe::actors::Inject))
CAF_ADD_TYPE_ID(troupe_actors, (troupe::actors::FaultFired))
CAF_ADD_TYPE_ID(troupe_actors, (troupe::actors::LinkCounts))
CAF_END_TYPE_ID_BLOCK(troupe_actors)
