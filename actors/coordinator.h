// The coordinator (DESIGN.md, Processes and roles; Supervision): the
// actor that keeps a job's membership and its lifecycle, whatever the job
// does. It
//   - gives every process that says Hello a rank of its role (the one it
//     asks for when free, else the lowest free one; a rank whose process was
//     lost is free for a replacement) and the job's config, and monitors the
//     process's agent;
//   - answers Ready with the Roster once every member is ready (for a
//     replacement, once every rank it may need is back: none is lost and
//     waiting for a new process; a rank moving into a live process has
//     that process's node);
//   - hears of a lost member the way every supervisor does (lossOf): its
//     agent's proxy goes down (crashed, timed out, left before it finished),
//     and asks the job's policy what the loss means: fail the job, go on
//     without the member, replace it, or move it into the live process of
//     another member of its role (Adopt: that process takes the rank as
//     well, and the two share its fate from then on). A replacement or a
//     move spends one restart of the rank's budget (supervision.max_restarts
//     in restart_window_s); a spent budget, or no replacement ready within
//     the replace timeout, is escalated to the policy again
//     (JobPolicy::onEscalation);
//   - fails the job when not every process is ready within the start
//     timeout, or when told to abort (Ctrl-C, a child that failed);
//   - when the job is over (JobContext::finish or fail), sends Shutdown to
//     every live agent and answers (run_atom) with the outcome.
// What the job itself says (progress, reports, the rendezvous of a
// communicator) is the policy's: its handlers are tried after the
// coordinator's own.
//
// Every decision runs on the coordinator actor; a JobPolicy is called only
// there. The actor is event-based, so CAF's test scheduler can drive it
// (tests/actors/coordinator_test.cc) with local actors standing in for the
// agents of other processes.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/fwd.hpp>
#include <caf/message_handler.hpp>

#include "actors/errors.h"
#include "actors/messages.h"
#include "actors/supervisor.h"
#include "common/status.h"

namespace troupe::actors {

struct RoleGroup {
  std::string role;
  int64_t count = 0;
};

enum class MemberState { kAwaited, kJoined, kReady, kFinished, kLost };

struct Member {
  std::string role;
  int64_t rank = 0;
  int64_t incarnation = -1;  // -1 before its first process joined
  MemberState state = MemberState::kAwaited;
  uint64_t node = 0;
  std::string address;
  int64_t pid = 0;
  caf::actor agent;  // monitored while it is a live member
  bool running = false;  // ready and given its roster: its role's actors run (it can take another rank)

  bool live() const { return state == MemberState::kJoined || state == MemberState::kReady; }
  // "worker 1 (127.0.0.1:4242)"
  std::string describe() const;
};

// What a loss means to the job.
struct LossDecision {
  enum class Action {
    kFail,      // the job ends with `why`
    kContinue,  // the others go on without the member (it stays lost)
    kReplace,   // a new process takes the rank
    kAdopt,     // the live process of rank `host` (same role) takes it as well
  } action = Action::kFail;
  std::string why;    // kFail: the job's error
  int64_t host = -1;  // kAdopt

  static LossDecision fail(std::string why) { return {Action::kFail, std::move(why), -1}; }
  static LossDecision goOn() { return {Action::kContinue, {}, -1}; }
  static LossDecision replace() { return {Action::kReplace, {}, -1}; }
  static LossDecision adopt(int64_t host) { return {Action::kAdopt, {}, host}; }
};

// One failure and what became of it (summary.json's "recovery").
struct RecoveryEvent {
  std::string what;          // "worker 1 (127.0.0.1:4242) crashed"
  std::string detectedBy;    // "crashed", "timed out", ... (the departure), or the error
  double lostAtSeconds = 0;  // since the job started
  double lostAtUnix = 0;     // wall clock (seconds since 1970), to set beside when the failure happened
  std::string action;        // "failed the job", "went on without it", "replaced", "moved to ...", "gave up"
  double recoveredAtSeconds = -1;  // when its replacement was ready; -1: not (yet)
  std::string role;                // the member lost: its role, rank and process
  int64_t rank = 0;
  int64_t incarnation = 0;
  // How it was found, in one word: "crashed", "timed out", "left" (its
  // transport departed), "hung" (the job found it making no progress),
  // "rolled back" (stopped by the job for another member's loss), "failed"
  // (it reported a failure).
  std::string cause;
};

// What the coordinator offers the job's policy (on the coordinator's thread).
class JobContext {
 public:
  virtual ~JobContext() = default;
  virtual caf::event_based_actor* self() = 0;
  virtual const std::vector<Member>& members(const std::string& role) const = 0;
  // Seconds since the coordinator started.
  virtual double elapsed() const = 0;
  // A published actor of a member's process (its proxy when remote).
  virtual caf::actor actorOf(const Member& m, const std::string& name) = 0;
  // The member finished its part: its departure is no loss from now on.
  // A second call changes nothing.
  virtual void finished(const std::string& role, int64_t rank) = 0;
  // The job is over: succeeded, or failed with `why` (the first call wins).
  virtual void finish() = 0;
  virtual void fail(const std::string& why) = 0;
  virtual bool over() const = 0;
  virtual const std::vector<RecoveryEvent>& events() const = 0;
  // The job's policy found a live member hung (alive, but no progress), or
  // needs it stopped (a rollback: Errc::kRolledBack, which spends no restart
  // of its budget): it is lost with `why` (its process stopped by
  // `terminate` when that can be done), and the policy's onLoss decides, as
  // for any other loss.
  virtual void declareLost(const std::string& role, int64_t rank, const caf::error& why) = 0;
};

class JobPolicy {
 public:
  virtual ~JobPolicy() = default;
  // The job's own messages, tried after the coordinator's.
  virtual caf::message_handler handlers(JobContext& job) = 0;
  // Every member is ready for the first time.
  virtual void onStart(JobContext& job) { (void)job; }
  // `m` is lost (its process went before it finished): what now.
  virtual LossDecision onLoss(JobContext& job, const Member& m, const Loss& loss) = 0;
  // A replacement was wanted but cannot be had (`why`: its restart budget
  // is spent, or none joined in time): fail or go on.
  virtual LossDecision onEscalation(JobContext& job, const Member& m, const std::string& why) {
    (void)job;
    (void)m;
    return LossDecision::fail(why);
  }
  // The replacement of a lost member is ready.
  virtual void onReplaced(JobContext& job, const Member& m) {
    (void)job;
    (void)m;
  }
  // The job is over (finished or failed): answer whatever still waits.
  virtual void onOver(JobContext& job) { (void)job; }
  // The config a joining member gets (CoordinatorOptions::config unless the
  // job changed since: a rollback, say).
  virtual std::string configFor(JobContext& job, const Member& m, const std::string& base) {
    (void)job;
    (void)m;
    return base;
  }
};

struct CoordinatorOptions {
  std::vector<RoleGroup> groups;  // e.g. {{"ps", 2}, {"worker", 2}}: the roster's order
  std::string config;             // the job's config (TOML), handed to every member
  std::chrono::milliseconds startTimeout{120000};
  std::chrono::milliseconds replaceTimeout{120000};
  RestartPolicy restarts;  // per rank
  // The actor published as `name` by node `node`'s process (a proxy through
  // transport::RemoteActors in a job; local actors in tests).
  std::function<caf::actor(uint64_t node, const std::string& name)> locate;
  // Starts a replacement process for a lost member (a local job); when
  // null, the coordinator waits for one to be launched.
  std::function<void(const Member& lost)> replace;
  // Makes sure a lost member's process is gone (by PID on this host): a
  // hung or stopped process must not come back. Called for a member that
  // crashed, timed out or hung, not for one that left or reported its own
  // failure (it is exiting). May be null.
  std::function<void(const Member& lost)> terminate;
  // A member joined (its rank and node are known now). May be null.
  std::function<void(const Member& joined)> joined;
};

// (run_atom) -> JobResult, answered when the job is over;
// (abort_atom, std::string why): the job fails with `why`.
struct JobResult {
  bool ok = false;
  std::string error;
  std::vector<RecoveryEvent> events;
  double endedAtSeconds = 0;  // since the coordinator started
  // What the coordinator's own links did (runCoordinator sets it; a job's
  // members tell theirs: LinkCounts).
  std::optional<LinkCounts> links;
};

caf::actor spawnCoordinator(caf::actor_system& system, CoordinatorOptions options,
                            std::shared_ptr<JobPolicy> policy);

}  // namespace troupe::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::JobResult)
