// The fault injector (DESIGN.md, Supervision and fault tolerance): carries
// out a job's fault plan (actors/fault_plan.h).
//
// In a member process, killThisProcess and stopThisProcess are the faults
// themselves: a real SIGKILL, a real SIGSTOP (a child process it forks sends
// SIGCONT after the duration, unless the stopped process is gone by then:
// the coordinator, finding it hung, had it killed). The agent runs them on
// Inject from the coordinator; a worker runs its step-triggered ones itself.
//
// On the coordinator, FaultInjector fires the plan's timed faults (at_s,
// every_s) once every process was first ready: it sends Inject to the agent
// of the process that holds the target then (a firing whose target has no
// running process is recorded as skipped), and it records what members say
// they fire themselves (FaultFired). Its record, with the job's losses, is
// the fault report (workers/fault_report.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/atom.hpp>
#include <caf/message_handler.hpp>

#include "actors/coordinator.h"
#include "actors/fault_plan.h"
#include "actors/messages.h"
#include "transport/link_faults.h"
#include "transport/node.h"

namespace troupe::actors {

// The plan's message faults on this process's links: a filter installed on
// `node` (null when the plan has none); name the other processes in it
// with nameMembers as they become known. Throws SetupError when the node's
// links are not reliable (transport.reliable_links = false).
std::shared_ptr<transport::LinkFaults> injectMessageFaults(transport::Node& node, const FaultPlan& plan,
                                                           const std::string& self);
// Every rank of the roster as "role:rank", and the coordinator's node.
void nameMembers(transport::LinkFaults& faults, const Roster& roster, uint64_t coordinatorNode);
// What this process's links did: "links: ..." (resends, duplicates
// suppressed, ... and the message faults injected here), for its log.
std::string linkSummary(const transport::NodeStats& stats);
// The same counters as a record for the coordinator.
LinkCounts linkCountsOf(const transport::NodeStats& stats, const std::string& role, int64_t rank, int64_t incarnation);

// SIGKILL to this process, after a log line naming the fault.
[[noreturn]] void killThisProcess(int64_t fault);
// Kills `actor` (exit reason kill), after a log line naming the fault: an
// actor that dies, which its supervisor finds and handles as any failure.
void killActor(int64_t fault, const std::string& name, const caf::actor& actor);
// SIGSTOP to this process; returns once it is continued (SIGCONT after
// `duration`, from a child it forks; SIGHUP is ignored meanwhile). A
// SIGCONT from elsewhere before then is undone within 20 ms (stopped
// again) and said in the log; returns how many times that happened. Two
// stops asked for at once (a time fault from the agent, a step fault from
// the worker) take turns: the second begins when the first has ended, and
// SIGHUP is handled as before once both are over.
int stopThisProcess(int64_t fault, std::chrono::milliseconds duration);

// One fault that hit (or was to hit) a process.
struct Injection {
  int64_t fault = 0;  // its id in the plan
  FaultKind kind = FaultKind::kKill;
  std::string role;
  int64_t rank = 0;
  int64_t incarnation = 0;  // the process of the rank it hit
  int64_t pid = 0;          // its process id (on its host)
  double atSeconds = 0;     // since the coordinator started (as RecoveryEvent's times)
  int64_t step = -1;        // a step-triggered fault: the step
  bool skipped = false;     // its target had no running process then
  std::string actor;        // kKillActor: the actor killed
};

using fault_atom = caf::atom_constant<caf::atom("fault")>;

class FaultInjector {
 public:
  explicit FaultInjector(FaultPlan plan) : plan_(std::move(plan)) {}

  // Every process is ready for the first time: the timed faults count from now.
  void start(JobContext& job);
  // The run has written `written` checkpoints: the faults timed from that
  // (after_checkpoint) count from now.
  void checkpointWritten(JobContext& job, int64_t written);
  // (fault_atom, index, firing) timers and FaultFired.
  caf::message_handler handlers(JobContext& job);

  const FaultPlan& plan() const { return plan_; }
  const std::vector<Injection>& injections() const { return injections_; }

 private:
  void fire(JobContext& job, size_t index, int64_t firing);
  void schedule(JobContext& job, size_t index, int64_t firing, double afterSeconds);

  FaultPlan plan_;
  std::vector<Injection> injections_;
  std::set<int64_t> fired_;  // step faults the members said they fired
};

}  // namespace troupe::actors
