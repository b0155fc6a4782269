#include "actors/fault_injector.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>

#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>

#include "actors/launcher.h"
#include "common/check.h"
#include "common/logging.h"

namespace troupe::actors {

std::shared_ptr<transport::LinkFaults> injectMessageFaults(transport::Node& node, const FaultPlan& plan,
                                                           const std::string& self) {
  if (plan.messages.empty()) return nullptr;
  std::optional<std::chrono::system_clock::time_point> start;
  if (plan.startUnixMs > 0) start = std::chrono::system_clock::time_point(std::chrono::milliseconds(plan.startUnixMs));
  auto faults = std::make_shared<transport::LinkFaults>(plan.seed, plan.linkRules(), start);
  faults->name(node.id(), self);
  Status st = node.setLinkFaults(faults);
  if (!st.isOk()) TROUPE_SETUP_ERROR("the fault plan's message faults: {}", st.message());
  logger("job")->warn("{}: {} message fault{} on this process's links (seed {})", self, plan.messages.size(),
                      plan.messages.size() == 1 ? "" : "s", plan.seed);
  return faults;
}

void nameMembers(transport::LinkFaults& faults, const Roster& roster, uint64_t coordinatorNode) {
  for (const std::string& role : roster.roles) {
    const auto nodes = roster.nodesOf(role);
    for (size_t k = 0; k < nodes.size(); ++k) {
      if (nodes[k] != 0) faults.name(nodes[k], fmt::format("{}:{}", role, k));
    }
  }
  if (coordinatorNode != 0) faults.name(coordinatorNode, "coordinator");
}

std::string linkSummary(const transport::NodeStats& s) {
  return fmt::format(
      "links: {} sent again, {} duplicates suppressed, {} waited for an earlier one, {} gaps, {} malformed refused; "
      "injected here: {} dropped, {} duplicated, {} delayed, {} reordered, {} corrupted, {} cut by a partition",
      s.framesResent, s.duplicatesSuppressed, s.framesHeldOutOfOrder, s.gapsFound, s.malformedDropped, s.faultsDropped,
      s.faultsDuplicated, s.faultsDelayed, s.faultsReordered, s.faultsCorrupted, s.faultsPartitioned);
}

LinkCounts linkCountsOf(const transport::NodeStats& s, const std::string& role, int64_t rank, int64_t incarnation) {
  LinkCounts c;
  c.role = role;
  c.rank = rank;
  c.incarnation = incarnation;
  c.resent = int64_t(s.framesResent);
  c.duplicatesSuppressed = int64_t(s.duplicatesSuppressed);
  c.heldOutOfOrder = int64_t(s.framesHeldOutOfOrder);
  c.gaps = int64_t(s.gapsFound);
  c.malformedRefused = int64_t(s.malformedDropped);
  c.linksGivenUp = int64_t(s.linksGivenUp);
  c.dropped = int64_t(s.faultsDropped);
  c.duplicated = int64_t(s.faultsDuplicated);
  c.delayed = int64_t(s.faultsDelayed);
  c.reordered = int64_t(s.faultsReordered);
  c.corrupted = int64_t(s.faultsCorrupted);
  c.partitioned = int64_t(s.faultsPartitioned);
  c.framesSent = int64_t(s.framesSent);
  c.framesReceived = int64_t(s.framesReceived);
  c.bytesSent = int64_t(s.bytesSent);
  c.bytesReceived = int64_t(s.bytesReceived);
  return c;
}

void killThisProcess(int64_t fault) {
  logger("job")->warn("fault {}: kill: SIGKILL to this process (pid {})", fault, ::getpid());
  spdlog::apply_all([](const std::shared_ptr<spdlog::logger>& l) { l->flush(); });
  ::kill(::getpid(), SIGKILL);
  std::abort();  // not reached
}

void killActor(int64_t fault, const std::string& name, const caf::actor& actor) {
  logger("job")->warn("fault {}: kill-actor: kills this process's '{}' actor", fault, name);
  caf::anon_send_exit(actor, caf::exit_reason::kill);
}

namespace {

// How often a stop fault's waker looks at the stopped process.
constexpr int64_t kStopCheckMs = 20;

// Whether the process whose /proc/PID/stat is `statPath` is stopped (state
// T or t); async-signal-safe (open, read, close). Unreadable counts as
// stopped (nothing to do about it).
bool processStopped(const char* statPath) {
  const int fd = ::open(statPath, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return true;
  char buf[512];
  ssize_t n = 0;
  while ((n = ::read(fd, buf, sizeof buf - 1)) == -1 && errno == EINTR) {
  }
  ::close(fd);
  if (n <= 0) return true;
  buf[n] = '\0';
  // "pid (comm) S ...": the state follows the last ')' (comm may hold one).
  const char* close = nullptr;
  for (const char* p = buf; *p; ++p) {
    if (*p == ')') close = p;
  }
  if (close == nullptr || close[1] != ' ') return true;
  return close[2] == 'T' || close[2] == 't';
}

}  // namespace

int stopThisProcess(int64_t fault, std::chrono::milliseconds duration) {
  // One stop at a time: two at once would each save SIGHUP's handling, the
  // second saving the first's "ignored", and could leave it ignored for good.
  static std::mutex oneAtATime;
  std::lock_guard<std::mutex> turn(oneAtATime);
  const pid_t self = ::getpid();
  logger("job")->warn("fault {}: stop: SIGSTOP to this process (pid {}) for {:.3f} s", fault, self,
                      duration.count() / 1000.0);
  spdlog::apply_all([](const std::shared_ptr<spdlog::logger>& l) { l->flush(); });
  const int64_t ms = std::max<int64_t>(1, duration.count());
  const int maxFd = descriptorLimit();
  // The kernel's SIGCONT to an orphaned process group comes after a SIGHUP,
  // whose default action ends the process: while stopped, a hang-up is
  // this fault's own doing. It is ignored until the stop is over, then
  // handled as before.
  struct sigaction ignore = {}, hangup = {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  const bool hangupSaved = ::sigaction(SIGHUP, &ignore, &hangup) == 0;
  const std::string statPath = fmt::format("/proc/{}/stat", self);  // (made before the fork)
  const pid_t waker = ::fork();
  if (waker == 0) {
    // The child, async-signal-safe calls only: it stops its parent (so the
    // SIGCONT cannot come before the SIGSTOP), and wakes it after the
    // duration, unless the parent is gone (killed while stopped: the child
    // has another parent then, and the PID may be someone else's; it looks
    // every kStopCheckMs and leaves at once).
    // Stopped means stopped for the whole duration: a parent found running
    // before then was continued from outside (the kernel sends SIGCONT to
    // every process of a process group that became orphaned while one of
    // them was stopped, as when a CI runner's shell has gone and another
    // process of the job exits), and is stopped again. The exit status
    // counts those times (at most 255).
    // It holds none of its parent's files: a socket it kept open would
    // hide the parent's death from its peers.
    closeInheritedDescriptors(maxFd);
    ::kill(self, SIGSTOP);
    int again = 0;
    bool seenStopped = false;  // since the last SIGSTOP (one takes a moment on a busy machine)
    for (int64_t left = ms; left > 0 && ::getppid() == self;) {
      const int64_t step = left < kStopCheckMs ? left : kStopCheckMs;
      struct timespec t;
      t.tv_sec = 0;
      t.tv_nsec = long(step) * 1000000L;
      while (::nanosleep(&t, &t) == -1 && errno == EINTR) {
      }
      left -= step;
      if (left <= 0 || ::getppid() != self) break;
      if (processStopped(statPath.c_str())) {
        seenStopped = true;
      } else {
        // Continued from outside (counted), or not stopped yet: a SIGCONT
        // may have undone a SIGSTOP that had not taken effect.
        ::kill(self, SIGSTOP);
        if (seenStopped && again < 255) ++again;
        seenStopped = false;
      }
    }
    if (::getppid() == self) ::kill(self, SIGCONT);
    ::_exit(again);
  }
  if (waker < 0) {
    logger("job")->error("fault {}: stop: cannot fork the process that would stop and continue this one ({}); not "
                         "stopped",
                         fault, std::strerror(errno));
    if (hangupSaved) ::sigaction(SIGHUP, &hangup, nullptr);
    return 0;
  }
  // Stopped in here, then continued; the waker ends right after.
  int status = 0;
  while (::waitpid(waker, &status, 0) == -1 && errno == EINTR) {
  }
  if (hangupSaved) ::sigaction(SIGHUP, &hangup, nullptr);
  const int again = WIFEXITED(status) ? WEXITSTATUS(status) : 0;
  if (again > 0) {
    logger("job")->warn("fault {}: stop: continued (something else sent SIGCONT before the duration was up; stopped "
                        "again {} time{})",
                        fault, again, again == 1 ? "" : "s");
  } else {
    logger("job")->warn("fault {}: stop: continued", fault);
  }
  return again;
}

void FaultInjector::checkpointWritten(JobContext& job, int64_t written) {
  for (size_t i = 0; i < plan_.faults.size(); ++i) {
    const Fault& f = plan_.faults[i];
    if (f.afterCheckpoint != written) continue;
    logger("job")->info("fault {}: checkpoint {} of this run is written; its clock starts", f.id, written);
    schedule(job, i, 0, f.atSeconds >= 0 ? f.atSeconds : 0);
  }
}

void FaultInjector::start(JobContext& job) {
  for (size_t i = 0; i < plan_.faults.size(); ++i) {
    const Fault& f = plan_.faults[i];
    if (f.afterCheckpoint > 0) continue;
    if (f.atSeconds >= 0) {
      schedule(job, i, 0, f.atSeconds);
    } else if (f.everySeconds > 0) {
      schedule(job, i, 0, 0);  // the first gap is drawn like every other
    }
  }
}

void FaultInjector::schedule(JobContext& job, size_t index, int64_t firing, double afterSeconds) {
  const Fault& f = plan_.faults[index];
  if (f.everySeconds > 0) {
    // Exponential gaps of mean every_s: a Poisson process of failures.
    const double u = (double(faultRandom(plan_.seed, uint64_t(f.id), uint64_t(1'000'000 + firing)) >> 11) + 0.5) /
                     double(uint64_t(1) << 53);
    afterSeconds += -std::log(u) * f.everySeconds;
  }
  auto* self = job.self();
  self->delayed_send(self, std::chrono::microseconds(int64_t(afterSeconds * 1e6)), fault_atom::value,
                     int64_t(index), firing);
}

void FaultInjector::fire(JobContext& job, size_t index, int64_t firing) {
  if (job.over() || index >= plan_.faults.size()) return;
  const Fault& f = plan_.faults[index];
  const auto& members = job.members(f.role);
  if (members.empty()) return;
  const int64_t rank =
      f.rank >= 0 ? f.rank : int64_t(faultRandom(plan_.seed, uint64_t(f.id), uint64_t(firing + 1)) % members.size());
  Injection in;
  in.fault = f.id;
  in.kind = f.kind;
  in.role = f.role;
  in.rank = rank;
  in.atSeconds = job.elapsed();
  in.actor = f.actor;
  const Member* m = rank < int64_t(members.size()) ? &members[size_t(rank)] : nullptr;
  if (m == nullptr || !m->running || !m->agent || m->state != MemberState::kReady) {
    in.skipped = true;
    logger("job")->warn("fault {}: {} {} {}: it has no running process now; skipped", f.id, faultKindName(f.kind),
                        f.role, rank);
  } else {
    in.incarnation = m->incarnation;
    in.pid = m->pid;
    const int64_t ms = int64_t(std::llround(f.durationSeconds * 1000));
    logger("job")->warn("fault {}: {} {} {} (pid {}){}{}", f.id, faultKindName(f.kind), f.role, rank, m->pid,
                        f.kind == FaultKind::kStop ? fmt::format(" for {} s", f.durationSeconds) : "",
                        f.actor.empty() ? "" : ": its " + f.actor + " actor");
    job.self()->send(m->agent, Inject{f.id, faultKindName(f.kind), ms, f.actor, rank});
  }
  injections_.push_back(std::move(in));
  if (f.everySeconds > 0 && (f.count == 0 || firing + 1 < f.count)) schedule(job, index, firing + 1, 0);
}

caf::message_handler FaultInjector::handlers(JobContext& job) {
  return {
      [this, &job](fault_atom, int64_t index, int64_t firing) { fire(job, size_t(index), firing); },
      [this, &job](const FaultFired& x) -> caf::result<int64_t> {
        const Fault* f = plan_.byId(x.fault);
        // Only the first process of the fault's own rank fires it, once.
        const auto& members = job.members(x.role);
        const auto& sender = job.self()->current_sender();
        const Member* m = x.rank >= 0 && x.rank < int64_t(members.size()) ? &members[size_t(x.rank)] : nullptr;
        std::string wrong;
        if (f == nullptr || f->role != x.role || !f->stepTriggered() || f->rank != x.rank) {
          wrong = "not a step fault of that rank in the plan";
        } else if (x.incarnation != 0 || m == nullptr || m->incarnation != 0 || !m->agent || !sender ||
                   sender->node() != m->agent.node()) {
          wrong = "not from the rank's first process";
        }
        if (!wrong.empty()) {
          logger("job")->warn("refused a FaultFired of fault {} from {} {}: {}", x.fault, x.role, x.rank, wrong);
          return caf::make_error(Errc::kBadMessage, wrong);
        }
        if (!fired_.insert(x.fault).second) return x.fault;  // said again: recorded once
        Injection in;
        in.fault = x.fault;
        in.kind = f->kind;
        in.role = x.role;
        in.rank = x.rank;
        in.incarnation = x.incarnation;
        in.atSeconds = job.elapsed();
        in.step = x.step;
        in.pid = m->pid;
        in.actor = f->actor;
        logger("job")->warn("fault {}: {} {} {} at its step {}", x.fault, faultKindName(in.kind), x.role, x.rank,
                            x.step);
        injections_.push_back(std::move(in));
        return x.fault;
      },
  };
}

}  // namespace troupe::actors
