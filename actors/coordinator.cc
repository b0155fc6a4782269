#include "actors/coordinator.h"

#include <algorithm>

#include <caf/all.hpp>

#include "common/logging.h"

namespace troupe::actors {

std::string Member::describe() const {
  return fmt::format("{} {}{}", role, rank, address.empty() ? "" : fmt::format(" ({})", address));
}

namespace {

std::string causeOf(const Loss& loss) {
  if (loss.kind == Loss::Kind::kDeparted) return transport::departureName(loss.departure);
  if (loss.reason == Errc::kRolledBack) return "rolled back";
  if (loss.reason == Errc::kStalled) return "hung";
  return "failed";
}

using Clock = std::chrono::steady_clock;
using replace_atom = caf::atom_constant<caf::atom("replace")>;

struct Slot {
  Member member;
  RestartBudget budget;
  bool replacing = false;     // a replacement is wanted and not yet ready
  int64_t replaceRound = 0;   // counts the replacements wanted (names the timer of each)
  int64_t eventIndex = -1;    // its open RecoveryEvent while replacing
  bool moved = false;         // it lives in the process of another rank (Adopt)
};

// Whether a lost member's process may still exist and must be stopped for
// good: it crashed in a way that may have left it running, or hung.
bool mayStillRun(const Loss& loss) {
  if (loss.kind == Loss::Kind::kDeparted) {
    return loss.departure != transport::Departure::kLeft && loss.departure != transport::Departure::kShutdown;
  }
  return loss.kind == Loss::Kind::kFailed && (loss.reason == Errc::kStalled || loss.reason == Errc::kRolledBack);
}

struct CoordinatorState;
using Self = caf::stateful_actor<CoordinatorState>;

struct CoordinatorState : JobContext {
  Self* actor = nullptr;
  CoordinatorOptions options;
  std::shared_ptr<JobPolicy> policy;
  std::vector<std::vector<Slot>> groups;  // as options.groups
  mutable std::vector<std::vector<Member>> view;  // members(role), rebuilt on demand
  std::vector<caf::typed_response_promise<Roster>> readyWaiters;
  std::vector<caf::typed_response_promise<Roster>> lateWaiters;  // replacements, until no rank is missing

  void answerLate() {
    if (lateWaiters.empty()) return;
    // A rank being moved into a live process is not missing: its node is
    // that process's (and the process takes its ranks one at a time).
    for (const auto& g : groups) {
      for (const auto& s : g) {
        if (s.replacing && !s.moved) return;
      }
    }
    const Roster r = roster();
    for (auto& w : lateWaiters) w.deliver(r);
    lateWaiters.clear();
    markRunning();
  }
  bool started = false;
  bool over_ = false;
  double endedAt_ = 0;
  bool ok = false;
  std::string error;
  int64_t generation = 0;
  std::vector<RecoveryEvent> events_;
  caf::typed_response_promise<JobResult> result;
  bool haveResult = false;
  Clock::time_point born = Clock::now();
  std::shared_ptr<spdlog::logger> log = logger("job");
  static inline const char* name = "coordinator";

  // ---- JobContext
  caf::event_based_actor* self() override { return actor; }
  const std::vector<Member>& members(const std::string& role) const override {
    static const std::vector<Member> none;
    for (size_t g = 0; g < groups.size(); ++g) {
      if (options.groups[g].role != role) continue;
      view[g].clear();
      for (const auto& s : groups[g]) view[g].push_back(s.member);
      return view[g];
    }
    return none;
  }
  double elapsed() const override { return std::chrono::duration<double>(Clock::now() - born).count(); }
  caf::actor actorOf(const Member& m, const std::string& name) override {
    return m.node && options.locate ? options.locate(m.node, name) : caf::actor();
  }
  void finished(const std::string& role, int64_t rank) override {
    Slot* s = slot(role, rank);
    if (!s || s->member.state == MemberState::kFinished || s->member.state == MemberState::kLost) return;
    s->member.state = MemberState::kFinished;
  }
  void finish() override { end(true, ""); }
  void fail(const std::string& why) override { end(false, why); }
  bool over() const override { return over_; }
  const std::vector<RecoveryEvent>& events() const override { return events_; }

  // ---- the lifecycle
  Slot* slot(const std::string& role, int64_t rank) {
    for (size_t g = 0; g < groups.size(); ++g) {
      if (options.groups[g].role == role && rank >= 0 && rank < int64_t(groups[g].size())) {
        return &groups[g][size_t(rank)];
      }
    }
    return nullptr;
  }
  std::vector<Slot>* group(const std::string& role) {
    for (size_t g = 0; g < groups.size(); ++g) {
      if (options.groups[g].role == role) return &groups[g];
    }
    return nullptr;
  }

  Roster roster() const {
    Roster r;
    r.generation = generation;
    for (size_t g = 0; g < groups.size(); ++g) {
      r.roles.push_back(options.groups[g].role);
      r.counts.push_back(int64_t(groups[g].size()));
      for (const auto& s : groups[g]) r.nodes.push_back(s.member.live() ? s.member.node : 0);
    }
    return r;
  }

  // Every ready member has its roster now.
  void markRunning() {
    for (auto& g : groups) {
      for (auto& s : g) s.member.running = s.member.state == MemberState::kReady || s.member.state == MemberState::kFinished;
    }
  }

  bool everyoneReady() const {
    for (const auto& g : groups) {
      for (const auto& s : g) {
        if (s.member.state != MemberState::kReady) return false;
      }
    }
    return true;
  }

  void end(bool success, const std::string& why) {
    if (over_) return;
    over_ = true;
    endedAt_ = elapsed();
    ok = success;
    error = why;
    if (success) {
      log->info("the job is over");
    } else {
      log->error("job failed: {}", why);
    }
    for (auto& w : readyWaiters) w.deliver(caf::make_error(Errc::kJobFailed, why));
    readyWaiters.clear();
    for (auto& w : lateWaiters) w.deliver(caf::make_error(Errc::kJobFailed, why));
    lateWaiters.clear();
    std::vector<caf::actor_addr> told;  // one Shutdown per process (a process may run several ranks)
    for (auto& g : groups) {
      for (auto& s : g) {
        if (s.member.agent && s.member.state != MemberState::kLost &&
            std::find(told.begin(), told.end(), s.member.agent.address()) == told.end()) {
          told.push_back(s.member.agent.address());
          actor->send(s.member.agent, Shutdown{why});
        }
        if (s.replacing && s.eventIndex >= 0) events_[size_t(s.eventIndex)].action = "not replaced: the job ended";
      }
    }
    policy->onOver(*this);
    deliver();
  }

  void deliver() {
    if (!over_ || !haveResult) return;
    JobResult r;
    r.ok = ok;
    r.error = error;
    r.events = events_;
    r.endedAtSeconds = endedAt_;
    result.deliver(std::move(r));
    haveResult = false;
  }

  void onMemberDown(Slot& s, const Loss& loss) {
    Member& m = s.member;
    if (m.state == MemberState::kLost) return;
    const bool wasFinished = m.state == MemberState::kFinished;
    // A rank moved into another's process: its loss stops that process
    // through its agent (below), not by the PID of the rank's own.
    const bool wasMoved = s.moved;
    s.moved = false;
    m.state = MemberState::kLost;
    m.running = false;
    caf::actor agent = std::move(m.agent);
    m.agent = caf::actor();
    if (over_) return;
    if (wasFinished) {
      log->info("{} {} after it finished", m.describe(), loss.describe());
      return;
    }
    const std::string what = fmt::format("{} {}", m.describe(), loss.describe());
    RecoveryEvent e{what, loss.describe(), elapsed(),
                    std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(), "",
                    -1, m.role, m.rank, m.incarnation, causeOf(loss)};
    if (mayStillRun(loss)) {
      // Stop it for good: by PID where that can be done, and in any case by
      // telling its agent (a hung role's agent still answers).
      if (loss.kind == Loss::Kind::kFailed && agent) actor->send(agent, Shutdown{what});
      if (options.terminate && !wasMoved) options.terminate(m);
    }
    const LossDecision d = policy->onLoss(*this, m, loss);
    // A member stopped for a rollback did nothing wrong: its restart is free.
    apply(s, d, std::move(e), loss.reason == Errc::kRolledBack);
  }

  // The loss of a member the coordinator itself declared (hung): its
  // process is stopped and the loss handled like any other.
  void declareLost(const std::string& role, int64_t rank, const caf::error& why) override {
    Slot* s = slot(role, rank);
    if (s == nullptr || !s->member.live() || over_) return;
    onMemberDown(*s, lossOf(why));
  }

  void apply(Slot& s, const LossDecision& d, RecoveryEvent e, bool free = false) {
    Member& m = s.member;
    switch (d.action) {
      case LossDecision::Action::kFail: {
        e.action = "failed the job";
        const std::string why = d.why.empty() ? e.what : d.why;
        events_.push_back(std::move(e));
        return end(false, why);
      }
      case LossDecision::Action::kContinue:
        e.action = "went on without it";
        log->warn("{}; the job goes on without it", e.what);
        events_.push_back(std::move(e));
        return;
      case LossDecision::Action::kReplace: {
        if (!free && !takeRestart(s, e)) return;
        e.action = "replaced";
        s.replacing = true;
        s.replaceRound += 1;
        s.eventIndex = int64_t(events_.size());
        events_.push_back(std::move(e));
        log->warn("{}; replacing it ({} of {} restarts in {} s)", events_.back().what,
                  s.budget.spent(actor->clock().now()), s.budget.policy().maxRestarts,
                  std::chrono::duration<double>(s.budget.policy().window).count());
        if (options.replace) {
          options.replace(m);
        } else {
          log->warn("waiting up to {} s for a process to take {} {} (troupe launch --role {} --rank {})",
                    std::chrono::duration<double>(options.replaceTimeout).count(), m.role, m.rank, m.role, m.rank);
        }
        actor->delayed_send(actor, options.replaceTimeout, replace_atom::value, m.role, m.rank, s.replaceRound);
        return;
      }
      case LossDecision::Action::kAdopt: {
        Slot* host = slot(m.role, d.host);
        // A process whose role runs (one still waiting for its roster
        // takes no other rank), and not one going with this one.
        if (host == &s || host == nullptr || !host->member.agent || host->member.node == m.node ||
            !host->member.running ||
            (host->member.state != MemberState::kReady && host->member.state != MemberState::kFinished)) {
          e.action = "failed the job";
          events_.push_back(std::move(e));
          return end(false, fmt::format("{}; it was to move into the process of {} {}, which is not running",
                                        events_.back().what, m.role, d.host));
        }
        if (!takeRestart(s, e)) return;
        const Member& h = host->member;
        e.action = fmt::format("moved to the process of {} {}", h.role, h.rank);
        s.replacing = true;
        s.moved = true;
        s.replaceRound += 1;
        s.eventIndex = int64_t(events_.size());
        events_.push_back(std::move(e));
        m.incarnation += 1;
        m.state = MemberState::kJoined;
        m.running = false;
        m.node = h.node;
        m.address = h.address;
        m.pid = h.pid;
        m.agent = h.agent;  // monitored already, as the host's
        log->warn("{}; {} {} takes it into its process (pid {})", events_.back().what, h.role, h.rank, h.pid);
        actor->send(m.agent, Adopt{m.role, m.rank, m.incarnation, policy->configFor(*this, m, options.config)});
        actor->delayed_send(actor, options.replaceTimeout, replace_atom::value, m.role, m.rank, s.replaceRound);
        answerLate();  // replacements waiting for this rank's process wait no more
        return;
      }
    }
  }

  // One restart of the rank's budget for its replacement or move; when the
  // budget is spent the loss is escalated instead (false).
  bool takeRestart(Slot& s, RecoveryEvent& e) {
    if (s.budget.take(actor->clock().now())) return true;
    const std::string why = fmt::format(
        "{}; its restart budget is spent ({} restarts in {} s, supervision.max_restarts)", e.what,
        s.budget.policy().maxRestarts, std::chrono::duration<double>(s.budget.policy().window).count());
    e.action = "gave up";
    s.eventIndex = int64_t(events_.size());
    events_.push_back(std::move(e));
    escalate(s, why);
    return false;
  }

  // A wanted replacement cannot be had: the policy decides what now.
  void escalate(Slot& s, const std::string& why) {
    s.replacing = false;
    RecoveryEvent* event = s.eventIndex >= 0 ? &events_[size_t(s.eventIndex)] : nullptr;
    s.eventIndex = -1;
    const LossDecision d = policy->onEscalation(*this, s.member, why);
    if (d.action != LossDecision::Action::kContinue) {
      if (event) event->action = "gave up; failed the job";
      return end(false, d.action == LossDecision::Action::kFail && !d.why.empty() ? d.why : why);
    }
    log->warn("{}; the job goes on without it", why);
    if (event) event->action = "gave up; went on without it";
    answerLate();
  }
};

caf::behavior coordinator(Self* self, CoordinatorOptions options, std::shared_ptr<JobPolicy> policy) {
  auto& st = self->state;
  st.actor = self;
  st.options = std::move(options);
  st.policy = std::move(policy);
  for (const auto& g : st.options.groups) {
    std::vector<Slot> slots;
    for (int64_t r = 0; r < g.count; ++r) {
      Slot s{Member{}, RestartBudget(st.options.restarts)};
      s.member.role = g.role;
      s.member.rank = r;
      slots.push_back(std::move(s));
    }
    st.groups.push_back(std::move(slots));
  }
  st.view.resize(st.groups.size());
  self->set_error_handler([=](caf::error& err) {
    self->state.log->warn("coordinator: ignored an error message: {}", describe(err));
  });
  self->set_default_handler([=](caf::scheduled_actor*, caf::message_view& x) -> caf::result<caf::message> {
    self->state.log->warn("coordinator: refused an unknown message {}", caf::to_string(x.content()));
    return caf::make_error(Errc::kBadMessage, "the coordinator does not take this message");
  });
  self->set_down_handler([=](caf::down_msg& dm) {
    // Every member of the process (a rank moved into it goes with it).
    std::vector<std::pair<size_t, size_t>> of;
    for (size_t g = 0; g < self->state.groups.size(); ++g) {
      for (size_t r = 0; r < self->state.groups[g].size(); ++r) {
        const auto& m = self->state.groups[g][r].member;
        if (m.agent && m.agent.address() == dm.source) of.emplace_back(g, r);
      }
    }
    for (auto [g, r] : of) self->state.onMemberDown(self->state.groups[g][r], lossOf(dm.reason));
  });
  self->delayed_send(self, st.options.startTimeout, deadline_atom::value);
  caf::message_handler lifecycle{
      [=](run_atom) -> caf::typed_response_promise<JobResult> {
        auto& st = self->state;
        auto promise = self->make_response_promise<JobResult>();
        // Asked once, by its own process (the coordinator is published:
        // another process could send this too).
        const auto& sender = self->current_sender();
        if (st.haveResult || (sender && sender->node() != self->node())) {
          promise.deliver(caf::make_error(Errc::kBadMessage, "the coordinator's outcome is asked for once, locally"));
          return promise;
        }
        st.result = promise;
        st.haveResult = true;
        st.deliver();
        return st.result;
      },
      [=](abort_atom, const std::string& why) { self->state.fail(why); },
      [=](deadline_atom) {
        auto& st = self->state;
        if (st.over_ || st.started) return;
        std::vector<std::string> missing;
        for (const auto& g : st.groups) {
          for (const auto& s : g) {
            if (s.member.state != MemberState::kReady) {
              missing.push_back(fmt::format("{} {}{}", s.member.role, s.member.rank,
                                            s.member.state == MemberState::kJoined ? " (joined)" : ""));
            }
          }
        }
        st.fail(fmt::format("not every process was ready within cluster.start_timeout_s = {} s; missing: {}",
                            std::chrono::duration<double>(st.options.startTimeout).count(), fmt::join(missing, ", ")));
      },
      [=](replace_atom, const std::string& role, int64_t rank, int64_t round) {
        // The replacement wanted in `round` is not ready in time (none
        // joined, or the one that did never said Ready).
        auto& st = self->state;
        Slot* s = st.slot(role, rank);
        if (st.over_ || !s || !s->replacing || s->replaceRound != round) return;
        const std::string why = fmt::format("no process took {} {} within supervision.replace_timeout_s = {} s", role,
                                            rank, std::chrono::duration<double>(st.options.replaceTimeout).count());
        st.log->error("{}", why);
        if (s->member.live()) {
          // One joined but is not ready: it is not coming (a rank moved
          // into a live process leaves that process alone).
          if (st.options.terminate && !s->moved) st.options.terminate(s->member);
          s->member.state = MemberState::kLost;
          s->member.running = false;
          s->moved = false;
          s->member.agent = caf::actor();
        }
        st.escalate(*s, why);
      },
      [=](const Hello& h) -> caf::result<Welcome> {
        auto& st = self->state;
        if (st.over_) return caf::make_error(Errc::kJobFailed, "the job is over: " + st.error);
        std::vector<Slot>* list = st.group(h.role);
        if (!list) return caf::make_error(Errc::kNotInJob, fmt::format("the job has no role '{}'", h.role));
        // The same process saying hello again gets the same answer.
        for (auto& s : *list) {
          if (s.member.live() && !s.moved && s.member.node == h.node) {
            return Welcome{s.member.rank, s.member.incarnation, st.policy->configFor(st, s.member, st.options.config)};
          }
        }
        auto free = [](const Slot& s) {
          return s.member.state == MemberState::kAwaited || (s.member.state == MemberState::kLost && s.replacing);
        };
        Slot* chosen = nullptr;
        if (h.requestedRank >= 0 && h.requestedRank < int64_t(list->size()) && free((*list)[size_t(h.requestedRank)])) {
          chosen = &(*list)[size_t(h.requestedRank)];
        }
        for (auto& s : *list) {
          if (!chosen && s.member.state == MemberState::kAwaited) chosen = &s;
        }
        for (auto& s : *list) {
          if (!chosen && free(s)) chosen = &s;
        }
        if (!chosen) {
          return caf::make_error(Errc::kRankTaken, fmt::format("the job has {} {} processes and every rank is taken",
                                                               list->size(), h.role));
        }
        Member& m = chosen->member;
        chosen->moved = false;
        const bool replacement = m.state == MemberState::kLost;
        m.incarnation += 1;
        m.state = MemberState::kJoined;
        m.running = false;
        m.node = h.node;
        m.address = h.address;
        m.pid = h.pid;
        m.agent = st.options.locate ? st.options.locate(h.node, kAgentName) : caf::actor();
        if (m.agent) self->monitor(m.agent);
        st.log->info("{} joined{}", m.describe(),
                     replacement ? fmt::format(" (replacement {} of rank {})", m.incarnation, m.rank) : "");
        if (st.options.joined) st.options.joined(m);
        return Welcome{m.rank, m.incarnation, st.policy->configFor(st, m, st.options.config)};
      },
      [=](const MemberFailed& f) -> int64_t {
        auto& st = self->state;
        Slot* s = st.slot(f.role, f.rank);
        // A stale report (an earlier process of the rank) or a second one changes nothing.
        if (!s || !s->member.live() || s->member.incarnation != f.incarnation) return f.rank;
        st.onMemberDown(*s, lossOf(caf::make_error(f.setup ? Errc::kSetupFailed : Errc::kMemberFailed, f.why)));
        return f.rank;
      },
      [=](const Ready& r) -> caf::typed_response_promise<Roster> {
        auto& st = self->state;
        auto promise = self->make_response_promise<Roster>();
        Slot* s = st.slot(r.role, r.rank);
        if (st.over_ || !s || s->member.incarnation != r.incarnation || !s->member.live()) {
          promise.deliver(caf::make_error(Errc::kNotInJob, fmt::format("{} {} (incarnation {}) is not in the job",
                                                                       r.role, r.rank, r.incarnation)));
          return promise;
        }
        s->member.state = MemberState::kReady;
        if (s->replacing) {
          s->replacing = false;
          if (s->eventIndex >= 0) st.events_[size_t(s->eventIndex)].recoveredAtSeconds = st.elapsed();
          s->eventIndex = -1;
        }
        if (st.started) {
          // A replacement: the others run already. Its roster comes once
          // no rank is waiting for its own replacement.
          st.generation += 1;
          st.log->info("{} is ready; it replaces the lost process", s->member.describe());
          st.lateWaiters.push_back(promise);
          st.policy->onReplaced(st, s->member);
          st.answerLate();
          return promise;
        }
        st.readyWaiters.push_back(promise);
        if (st.everyoneReady()) {
          st.started = true;
          const Roster roster = st.roster();
          for (auto& w : st.readyWaiters) w.deliver(roster);
          st.markRunning();
          st.readyWaiters.clear();
          st.policy->onStart(st);
        }
        return promise;
      },
  };
  return caf::behavior{lifecycle.or_else(st.policy->handlers(st))};
}

}  // namespace

caf::actor spawnCoordinator(caf::actor_system& system, CoordinatorOptions options, std::shared_ptr<JobPolicy> policy) {
  return system.spawn(coordinator, std::move(options), std::move(policy));
}

}  // namespace troupe::actors
