#include "actors/node_agent.h"

#include <unistd.h>

#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <thread>

#include <caf/all.hpp>

#include "actors/actor_system.h"
#include "actors/errors.h"
#include "actors/fault_injector.h"
#include "common/check.h"
#include "common/logging.h"
#include "common/mailbox.h"
#include "transport/remote_actors.h"

namespace troupe::actors {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using lost_atom = caf::atom_constant<caf::atom("lost")>;
using watch_atom = caf::atom_constant<caf::atom("watch")>;
using linktick_atom = caf::atom_constant<caf::atom("linktick")>;

// How the process's wait ends; set from the agent, read by the main thread
// and the watchdog.
struct Signals {
  std::mutex mutex;
  std::condition_variable changed;
  enum class End { kNone, kShutdown, kCoordinatorLost, kFailed } end = End::kNone;
  std::string why;
  bool stopped = false;  // the main thread is done stopping (the watchdog stands down)
  std::deque<Adopt> adoptions;  // ranks moved into this process, for the main thread

  void adopt(Adopt a) {
    std::lock_guard<std::mutex> lock(mutex);
    adoptions.push_back(std::move(a));
    changed.notify_all();
  }

  void set(End e, std::string w) {
    std::lock_guard<std::mutex> lock(mutex);
    if (end != End::kNone) return;
    end = e;
    why = std::move(w);
    changed.notify_all();
  }
  End current() {
    std::lock_guard<std::mutex> lock(mutex);
    return end;
  }
};

int statusOf(Signals::End end) {
  switch (end) {
    case Signals::End::kCoordinatorLost: return kExitCoordinatorLost;
    case Signals::End::kFailed: return kExitFailed;
    default: return kExitOk;
  }
}

// A supervisor of a rank's actors, and the rank (the process's own, or one
// moved into it).
struct Watched {
  caf::actor supervisor;
  int64_t rank = -1, incarnation = 0;
  bool reported = false;  // its failure was told
};

struct AgentState {
  caf::actor coordinator;
  std::vector<Watched> supervisors;  // the ranks' actors; watched once they run
  std::chrono::milliseconds confirmTimeout{6000};
  std::shared_ptr<Signals> signals;
  std::string role;
  int64_t rank = -1, incarnation = 0;
  bool reported = false;
  std::function<transport::NodeStats()> stats;  // this process's node's
  bool ticking = false;                         // LinkCounts to the coordinator every second
  static inline const char* name = "node_agent";
};

using Agent = caf::stateful_actor<AgentState>;

// A rank moved into this process failed (its supervisor gave up): the
// coordinator hears it as that rank's loss, and the process goes on with
// its own.
void reportMovedFailure(Agent* self, Watched& w, const std::string& why) {
  if (w.reported) return;
  w.reported = true;
  logger("job")->error("{} {}: {}", self->state.role, w.rank, why);
  self->send(self->state.coordinator, MemberFailed{self->state.role, w.rank, w.incarnation, why});
}

// The member failed: the coordinator is told, then the process exits. When
// the coordinator does not take the report, it is gone or hung; if it is
// gone its down message (which says how) is on its way, as its proxy is
// killed right after its requests fail, and wins; otherwise this is the
// member's own failure.
void reportFailure(Agent* self, const std::string& why) {
  auto& st = self->state;
  if (st.reported) return;
  st.reported = true;
  self->request(st.coordinator, st.confirmTimeout, MemberFailed{st.role, st.rank, st.incarnation, why})
      .then([=](int64_t) { self->state.signals->set(Signals::End::kFailed, why); },
            [=](caf::error& err) {
              self->delayed_send(self, 200ms, lost_atom::value,
                                 fmt::format("{} (the coordinator did not take the report: {})", why, describe(err)));
            });
}

caf::behavior agent(Agent* self, caf::actor coordinator, std::shared_ptr<Signals> signals, std::string role,
                    std::chrono::milliseconds heartbeatTimeout, std::function<transport::NodeStats()> stats) {
  auto& st = self->state;
  st.coordinator = coordinator;
  st.stats = std::move(stats);
  st.confirmTimeout = 2 * heartbeatTimeout;
  st.signals = std::move(signals);
  st.role = std::move(role);
  self->monitor(coordinator);
  self->set_down_handler([=](caf::down_msg& dm) {
    auto& st = self->state;
    if (dm.source == st.coordinator.address()) {
      st.signals->set(Signals::End::kCoordinatorLost, lossOf(dm.reason).describe());
    } else {
      for (auto& w : st.supervisors) {
        if (dm.source != w.supervisor.address()) continue;
        // It ended without escalating (an exception in a handler, say): the
        // rank's actors are gone all the same. (Stopped because the process
        // ends, it failed nothing: no report, no request left pending.)
        const Loss loss = lossOf(dm.reason);
        if (loss.kind == Loss::Kind::kNormal || st.signals->current() != Signals::End::kNone) continue;
        const std::string why = "its supervisor stopped: " + loss.describe();
        if (w.rank == st.rank) {
          reportFailure(self, why);
        } else {
          reportMovedFailure(self, w, why);
        }
      }
    }
  });
  self->set_error_handler([=](caf::error& err) { logger("job")->warn("agent: ignored an error: {}", describe(err)); });
  self->set_default_handler([=](caf::scheduled_actor*, caf::message_view& x) -> caf::result<caf::message> {
    logger("job")->warn("agent: refused an unknown message {}", caf::to_string(x.content()));
    return caf::make_error(Errc::kBadMessage, "the agent does not take this message");
  });
  return {
      [=](const Shutdown& s) { self->state.signals->set(Signals::End::kShutdown, s.why); },
      [=](const Welcome& w) {
        self->state.rank = w.rank;
        self->state.incarnation = w.incarnation;
      },
      [=](watch_atom, caf::actor supervisor, int64_t rank, int64_t incarnation) {
        self->state.supervisors.push_back(Watched{supervisor, rank, incarnation});
        self->monitor(supervisor);
      },
      [=](const Adopt& a) {
        // Only the coordinator moves a rank here.
        const auto& sender = self->current_sender();
        if (!sender || sender->node() != self->state.coordinator.node() || a.role != self->state.role) {
          logger("job")->warn("agent: refused an Adopt of {} {} that did not come from the coordinator", a.role,
                              a.rank);
          return;
        }
        self->state.signals->adopt(a);
      },
      [=](const Inject& x) {
        // Only the coordinator injects a fault (its plan says which).
        const auto& sender = self->current_sender();
        if (!sender || sender->node() != self->state.coordinator.node()) {
          logger("job")->warn("agent: refused an Inject of fault {} that did not come from the coordinator", x.fault);
          return;
        }
        if (x.kind == "kill") {
          killThisProcess(x.fault);
        } else if (x.kind == "kill-actor") {
          // The actor of the rank (this process's own, or one moved into
          // it): its supervisor names the child; a child that stands for
          // another (a driver for its training loop) names that one.
          auto& st = self->state;
          const int64_t rank = x.rank >= 0 ? x.rank : st.rank;
          // The newest supervisor of the rank (one moved away and back has an older, stopped one).
          for (auto it = st.supervisors.rbegin(); it != st.supervisors.rend(); ++it) {
            const Watched& w = *it;
            if (w.rank != rank) continue;
            const int64_t fault = x.fault;
            const std::string name = x.actor;
            self->request(w.supervisor, 5s, which_atom::value, name)
                .then(
                    [=](const caf::actor& child) {
                      if (!child) {
                        logger("job")->warn("fault {}: kill-actor: rank {} has no '{}' actor now", fault, rank, name);
                        return;
                      }
                      self->request(child, 5s, which_atom::value, name)
                          .then([=](const caf::actor& inner) { killActor(fault, name, inner ? inner : child); },
                                [=](caf::error&) { killActor(fault, name, child); });
                    },
                    [=](caf::error& e) {
                      logger("job")->warn("fault {}: kill-actor: the supervisor did not answer: {}", fault, describe(e));
                    });
            return;
          }
          logger("job")->warn("fault {}: kill-actor: this process runs no actors of rank {}", x.fault, rank);
        } else if (x.kind == "stop" && x.durationMs > 0 && x.durationMs <= 24 * 3600 * 1000) {
          stopThisProcess(x.fault, std::chrono::milliseconds(x.durationMs));
        } else {
          logger("job")->warn("agent: refused an Inject of fault {}: kind '{}' for {} ms", x.fault, x.kind,
                              x.durationMs);
        }
      },
      [=](const ChildFailed& f) {
        // From the supervisor of the process's own rank, or of a rank moved here.
        auto& st = self->state;
        const std::string why = fmt::format("{}: {}", f.child, f.reason);
        const auto from = caf::actor_cast<caf::actor_addr>(self->current_sender());
        for (auto& w : st.supervisors) {
          if (from == w.supervisor.address() && w.rank != st.rank) {
            return reportMovedFailure(self, w, why);
          }
        }
        reportFailure(self, why);
      },
      [=](lost_atom, const std::string& why) { self->state.signals->set(Signals::End::kFailed, why); },
      [=](links_atom) -> LinkCounts {
        auto& st = self->state;
        LinkCounts c = linkCountsOf(st.stats(), st.role, st.rank, st.incarnation);
        c.mailbox = mailboxDepth(self);
        return c;
      },
      [=](linktick_atom) {
        // From this process only: the plan has message faults, and the
        // coordinator hears what the links did every second (the last
        // word of a process killed later).
        auto& st = self->state;
        if (self->current_sender() != self->ctrl() || st.rank < 0) return;
        self->send(st.coordinator, linkCountsOf(st.stats(), st.role, st.rank, st.incarnation));
        self->delayed_send(self, 1s, linktick_atom::value);
      },
  };
}

uint64_t findCoordinator(transport::Node& node, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    for (const auto& m : node.members()) {
      if (m.role == "coordinator") return m.nodeId;
    }
    std::this_thread::sleep_for(10ms);
  }
  return 0;
}

// From the moment the process is told to end (Shutdown, a lost coordinator,
// a failure), the main thread has kStopGrace to stop; a process still stuck
// then (a set-up or a collective waiting on a dead peer) exits hard, with
// the status its end calls for.
class Watchdog {
 public:
  Watchdog(std::shared_ptr<Signals> signals, std::string who) : signals_(std::move(signals)) {
    thread_ = std::thread([signals = signals_, who = std::move(who)] {
      std::unique_lock<std::mutex> lock(signals->mutex);
      signals->changed.wait(lock, [&] { return signals->stopped || signals->end != Signals::End::kNone; });
      if (signals->changed.wait_for(lock, kStopGrace, [&] { return signals->stopped; })) return;
      const int status = statusOf(signals->end);
      logger("job")->error("{}: told to end ({}), but not stopped within {} s; exiting now with status {}", who,
                           signals->why.empty() ? "the job is over" : signals->why, kStopGrace.count(), status);
      spdlog::shutdown();
      std::_Exit(status);
    });
  }
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(signals_->mutex);
      signals_->stopped = true;
      signals_->changed.notify_all();
    }
    thread_.join();
  }

 private:
  std::shared_ptr<Signals> signals_;
  std::thread thread_;
};

// A rank's role in this process: set up (Role::prepare), Ready and the
// roster, then its actors under a supervisor the agent watches. Throws
// SetupError (`notStarted` names what did not happen).
caf::actor startRole(caf::scoped_actor& self, const caf::actor& coord, const caf::actor& agentActor, Role& role,
                     MemberContext& ctx, const std::string& name, const std::string& notStarted,
                     Roster* rosterOut = nullptr) {
  role.prepare(ctx);
  std::optional<Roster> roster;
  std::string error;
  const auto readyTimeout = std::chrono::seconds(ctx.config.getInt("cluster.start_timeout_s")) + 30s;
  self->request(coord, readyTimeout, Ready{ctx.role, ctx.welcome.rank, ctx.welcome.incarnation})
      .receive([&](Roster& r) { roster = std::move(r); }, [&](caf::error& e) { error = describe(e); });
  if (!roster) TROUPE_SETUP_ERROR("{}: {}", notStarted, error);
  if (rosterOut) *rosterOut = *roster;
  SupervisorOptions so;
  so.name = name;
  so.children = role.start(ctx, *roster);
  so.parent = agentActor;
  caf::actor supervisor = spawnSupervisor(ctx.system, std::move(so));
  self->send(agentActor, watch_atom::value, supervisor, ctx.welcome.rank, ctx.welcome.incarnation);
  return supervisor;
}

}  // namespace

int runMember(const MemberOptions& options, Role& role) {
  auto log = logger("job");
  caf::actor_system_config cfg;
  configureActorSystem(cfg, {options.schedulerThreads});
  if (options.configure) options.configure(cfg);
  caf::actor_system system{cfg};
  transport::NodeOptions nodeOptions = options.node;
  nodeOptions.role = options.role;
  nodeOptions.isCoordinator = false;
  transport::WireTypes types = lifecycleWireTypes();
  types.merge(options.types);
  auto remote = transport::RemoteActors::start(system, nodeOptions, std::move(types));
  if (!remote.hasValue()) {
    log->error("{}: {}", options.role, remote.status().message());
    return kExitFailed;
  }
  transport::Node& node = (*remote)->node();
  const uint64_t coordinatorNode = findCoordinator(node, nodeOptions.joinTimeout);
  if (coordinatorNode == 0) {
    log->error("{}: joined {}, but no coordinator is among its members", options.role, nodeOptions.coordinator);
    return kExitFailed;
  }
  caf::actor coord = (*remote)->remoteActor(coordinatorNode, kCoordinatorName);
  auto signals = std::make_shared<Signals>();
  auto agentActor = system.spawn(agent, coord, signals, options.role, nodeOptions.heartbeatTimeout,
                                 [&node] { return node.stats(); });
  (*remote)->publish(agentActor, kAgentName);
  caf::scoped_actor self{system};
  std::string who = options.role;
  int status = kExitOk;
  caf::actor supervisor;
  std::optional<Welcome> welcome;
  // Ranks moved into this process (Adopt): their roles and supervisors.
  std::vector<std::unique_ptr<Role>> adopted;
  std::vector<std::unique_ptr<MemberContext>> adoptedContexts;  // as long as the process (Role's contract)
  std::vector<caf::actor> adoptedSupervisors;
  auto adoptRank = [&](const Adopt& a) {
    const std::string name = fmt::format("{} {}", a.role, a.rank);
    std::unique_ptr<Role> other = options.anotherRole ? options.anotherRole() : nullptr;
    if (!other) {
      log->error("{}: cannot take {} as well (this process runs one rank)", who, name);
      self->send(coord, MemberFailed{a.role, a.rank, a.incarnation, "its process cannot take another rank", true});
      return;
    }
    log->warn("{}: takes {} into this process as well (process {} of its rank)", who, name, a.incarnation + 1);
    try {
      Config config(troupeConfigSchema());
      config.loadString(a.config, "the coordinator");
      auto ctx = std::make_unique<MemberContext>(
          MemberContext{system, **remote, coord, a.role, Welcome{a.rank, a.incarnation, a.config}, std::move(config)});
      adoptedSupervisors.push_back(
          startRole(self, coord, agentActor, *other, *ctx, name, name + " did not rejoin the job"));
      adopted.push_back(std::move(other));
      adoptedContexts.push_back(std::move(ctx));
    } catch (const std::exception& e) {
      const bool setup = dynamic_cast<const SetupError*>(&e) != nullptr;
      const std::string why = setup ? e.what() : fmt::format("internal error: {}", e.what());
      log->error("{}: {}", name, why);
      other->release();
      self->send(coord, MemberFailed{a.role, a.rank, a.incarnation, why, setup});
    }
  };
  {
    Watchdog watchdog(signals, who);
    std::string failure;  // set-up or internal errors, said once below
    int failureStatus = kExitOk;
    try {
      // A place in the job.
      std::string error;
      self->request(coord, std::max<std::chrono::milliseconds>(nodeOptions.joinTimeout, 30s),
                    Hello{options.role, options.requestedRank, node.id(), node.address(), int64_t(::getpid())})
          .receive([&](Welcome& w) { welcome = std::move(w); }, [&](caf::error& e) { error = describe(e); });
      if (!welcome) TROUPE_SETUP_ERROR("the coordinator did not take this process: {}", error);
      who = fmt::format("{} {}", options.role, welcome->rank);
      self->send(agentActor, *welcome);
      Config config(troupeConfigSchema());
      config.loadString(welcome->config, "the coordinator");
      // The plan's message faults, on this process's links from the start
      // (the plan was checked by the coordinator against the same counts).
      // (Only its message faults are taken here: any rank is let through.)
      std::shared_ptr<transport::LinkFaults> linkFaults;
      MemberContext ctx{system, **remote, coord, options.role, *welcome, std::move(config)};
      if (!ctx.config.getStringList("faults.plan").empty()) {
        const FaultPlan plan = parseFaultPlan(ctx.config, int64_t(1) << 20, int64_t(1) << 20);
        linkFaults = injectMessageFaults(node, plan, fmt::format("{}:{}", options.role, welcome->rank));
        if (linkFaults) {
          linkFaults->name(coordinatorNode, "coordinator");
          caf::send_as(agentActor, agentActor, linktick_atom::value);
        }
      }
      // Everyone ready: the roster, then the role's actors.
      Roster roster;
      supervisor = startRole(self, coord, agentActor, role, ctx, who, "the job did not start", &roster);
      if (linkFaults) nameMembers(*linkFaults, roster, coordinatorNode);
    } catch (const SetupError& e) {
      failure = e.what();
      failureStatus = kExitSetup;
    } catch (const std::exception& e) {
      failure = fmt::format("internal error: {}", e.what());
      failureStatus = kExitFailed;
    }
    if (!failure.empty() && signals->current() != Signals::End::kCoordinatorLost) {
      log->error("{}: {}", who, failure);
      status = failureStatus;
      // The coordinator hears why, rather than only that this process left.
      if (welcome) {
        self->send(coord, MemberFailed{options.role, welcome->rank, welcome->incarnation, failure,
                                       failureStatus == kExitSetup});
      }
      signals->set(Signals::End::kFailed, failure);
    }
    // Until the job is over, the coordinator goes, or the work fails
    // (taking the ranks moved here meanwhile). The coordinator's
    // heartbeats bound the wait.
    std::string why;
    Signals::End end;
    {
      std::unique_lock<std::mutex> lock(signals->mutex);
      while (signals->end == Signals::End::kNone) {
        if (!signals->adoptions.empty() && failure.empty()) {
          const Adopt a = std::move(signals->adoptions.front());
          signals->adoptions.pop_front();
          lock.unlock();
          adoptRank(a);
          lock.lock();
          continue;
        }
        signals->changed.wait_for(lock, 1s);
      }
      end = signals->end;
      why = signals->why;
    }
    switch (end) {
      case Signals::End::kShutdown:
        if (!why.empty()) log->info("{}: the job ended: {}", who, why);
        break;
      case Signals::End::kCoordinatorLost:
        log->error("{}: lost the coordinator ({}); stopping", who, why);
        status = kExitCoordinatorLost;
        break;
      case Signals::End::kFailed:
        if (failure.empty()) {
          log->error("{}: failed: {}", who, why);
          status = kExitFailed;
        }
        break;
      case Signals::End::kNone: break;
    }
    for (const auto& sup : adoptedSupervisors) self->send_exit(sup, caf::exit_reason::user_shutdown);
    if (supervisor) self->send_exit(supervisor, caf::exit_reason::user_shutdown);
    // Their children go first; bounded by the watchdog.
    for (const auto& sup : adoptedSupervisors) self->wait_for(sup);
    if (supervisor) self->wait_for(supervisor);
    adoptedSupervisors.clear();
    for (auto& other : adopted) other->release();
    adopted.clear();
    role.release();
  }
  // The agent is gone before the transport is (its handlers read the
  // node's counters); it has nothing to finish, so a second is plenty.
  self->monitor(agentActor);
  self->send_exit(agentActor, caf::exit_reason::user_shutdown);
  for (bool gone = false; !gone;) {
    self->receive([&](const caf::down_msg& dm) { gone = dm.source == agentActor.address(); },
                  caf::after(std::chrono::seconds(1)) >> [&] {
                    log->warn("{}: the agent did not stop within 1 s", who);
                    gone = true;
                  });
  }
  const transport::NodeStats links = node.stats();
  if (links.framesResent + links.duplicatesSuppressed + links.framesHeldOutOfOrder + links.gapsFound + links.faultsDropped +
          links.faultsDuplicated + links.faultsDelayed + links.faultsReordered + links.faultsCorrupted +
          links.faultsPartitioned + links.malformedDropped >
      0) {
    log->info("{}: {}", who, linkSummary(links));
  }
  log->info("{} exits ({})", who, status);
  return status;
}

}  // namespace troupe::actors
