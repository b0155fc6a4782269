// Supervision (DESIGN.md, Supervision and fault tolerance): restart what
// fails, within a budget, and escalate when the budget is spent.
//
// RestartBudget is the policy as a value: at most maxRestarts restarts in
// any window of `window`. The supervisor actor below applies it one-for-one
// to local children; the coordinator (actors/coordinator.h) applies the same
// budget to member processes, whose "restart" is a replacement process. A
// child's down message is read the same way whether the child is a local
// actor or a remote actor's proxy (lossOf, errors.h): a normal exit ends the
// child, anything else (a failure, or its process departing) is a failure.
//
// The supervisor actor:
//   - starts every child with its spec's start function and monitors it;
//   - a child that fails is started again while the budget allows (its
//     spec's `restart`); when it does not, or the spec says no restarts, the
//     supervisor escalates: it sends ChildFailed to its parent and quits
//     with Errc::kRestartsExhausted, taking the other children down with it;
//   - a child that exits normally is done and is not started again; when
//     every child is done, the supervisor quits normally;
//   - (which_atom, name) -> caf::actor: the current incarnation of a child
//     (an invalid handle when it is done or unknown).
// Time is the actor clock's, so CAF's test scheduler can move it.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/atom.hpp>
#include <caf/fwd.hpp>
#include <caf/meta/type_name.hpp>

#include "actors/errors.h"

namespace troupe::actors {

struct RestartPolicy {
  int64_t maxRestarts = 3;             // supervision.max_restarts
  std::chrono::milliseconds window{60000};  // supervision.restart_window_s
};

class RestartBudget {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  explicit RestartBudget(RestartPolicy policy = {}) : policy_(policy) {}
  // Spends one restart at `now` if fewer than maxRestarts were spent in the
  // window before it; false (nothing spent) when the budget is gone.
  bool take(TimePoint now);
  // Restarts spent in the window before `now`.
  int64_t spent(TimePoint now) const;
  const RestartPolicy& policy() const { return policy_; }

 private:
  void forget(TimePoint now) const;
  RestartPolicy policy_;
  mutable std::deque<TimePoint> taken_;
};

struct ChildSpec {
  std::string name;
  // Spawns the child (again). An invalid handle is a failed start, which
  // counts as a failure of the child.
  std::function<caf::actor(caf::actor_system&)> start;
  bool restart = true;  // false: its first failure escalates
};

// What a supervisor tells its parent when it gives up.
struct ChildFailed {
  std::string supervisor;
  std::string child;
  std::string reason;    // how its last incarnation went
  int64_t restarts = 0;  // restarts spent in the window
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ChildFailed& x) {
  return f(caf::meta::type_name("ChildFailed"), x.supervisor, x.child, x.reason, x.restarts);
}

using which_atom = caf::atom_constant<caf::atom("which")>;

struct SupervisorOptions {
  std::string name = "supervisor";
  RestartPolicy policy;
  std::vector<ChildSpec> children;
  caf::actor parent;  // gets ChildFailed; may be invalid
  // Told of every restart and of the escalation (the supervisor's thread).
  std::function<void(const std::string& child, const Loss& loss, bool restarted)> onFailure;
};

caf::actor spawnSupervisor(caf::actor_system& system, SupervisorOptions options);

}  // namespace troupe::actors
