#include "actors/supervisor.h"

#include <caf/all.hpp>

#include "common/logging.h"

namespace troupe::actors {

void RestartBudget::forget(TimePoint now) const {
  while (!taken_.empty() && now - taken_.front() >= policy_.window) taken_.pop_front();
}

bool RestartBudget::take(TimePoint now) {
  forget(now);
  if (int64_t(taken_.size()) >= policy_.maxRestarts) return false;
  taken_.push_back(now);
  return true;
}

int64_t RestartBudget::spent(TimePoint now) const {
  forget(now);
  return int64_t(taken_.size());
}

namespace {

struct Child {
  ChildSpec spec;
  caf::actor current;
  RestartBudget budget;
  bool done = false;
};

struct SupervisorState {
  SupervisorOptions options;
  std::vector<Child> children;
  // Every child's current incarnation, shared with the exit hook that takes
  // them down with the supervisor (the state is gone by then).
  std::shared_ptr<std::vector<caf::actor>> live = std::make_shared<std::vector<caf::actor>>();
  bool stopped = false;  // stopping: no more restarts; quits once no child lives
  caf::error reason;      // the one it quits with
  std::shared_ptr<spdlog::logger> log = logger("actors");
  static inline const char* name = "supervisor";
};

using Self = caf::stateful_actor<SupervisorState>;

// Starts child i; false when the start failed.
bool startChild(Self* self, size_t i) {
  auto& c = self->state.children[i];
  c.current = c.spec.start ? c.spec.start(self->system()) : caf::actor();
  (*self->state.live)[i] = c.current;
  if (!c.current) return false;
  self->monitor(c.current);
  return true;
}

bool anyLive(const SupervisorState& st) {
  for (const auto& c : st.children) {
    if (c.current) return true;
  }
  return false;
}

// Stops every child and quits with `reason` once they are all down.
void stop(Self* self, caf::error reason) {
  auto& st = self->state;
  if (!st.stopped) {
    st.stopped = true;
    st.reason = std::move(reason);
    for (auto& c : st.children) {
      if (c.current) self->send_exit(c.current, caf::exit_reason::user_shutdown);
    }
  }
  if (!anyLive(st)) self->quit(st.reason);
}

void escalate(Self* self, size_t i, const Loss& loss) {
  auto& st = self->state;
  auto& c = st.children[i];
  const int64_t spent = c.budget.spent(self->clock().now());
  st.log->error("{}: {} failed ({}); {} — escalating", st.options.name, c.spec.name, loss.describe(),
                c.spec.restart ? fmt::format("{} restarts in {} s spent", spent,
                                             std::chrono::duration<double>(st.options.policy.window).count())
                               : std::string("it is not restarted"));
  if (st.options.onFailure) st.options.onFailure(c.spec.name, loss, false);
  if (st.options.parent) {
    self->send(st.options.parent, ChildFailed{st.options.name, c.spec.name, loss.describe(), spent});
  }
  stop(self, caf::make_error(Errc::kRestartsExhausted, fmt::format("{}: {}", c.spec.name, loss.describe())));
}

// Restarts child i after a failure while its budget allows; escalates
// otherwise. A failed start counts as another failure.
void onChildFailed(Self* self, size_t i, Loss loss) {
  auto& st = self->state;
  for (;;) {
    auto& c = st.children[i];
    c.current = caf::actor();
    (*st.live)[i] = caf::actor();
    if (!c.spec.restart || !c.budget.take(self->clock().now())) return escalate(self, i, loss);
    st.log->warn("{}: {} failed ({}); restarting it ({} of {} restarts in {} s)", st.options.name, c.spec.name,
                 loss.describe(), c.budget.spent(self->clock().now()), st.options.policy.maxRestarts,
                 std::chrono::duration<double>(st.options.policy.window).count());
    if (st.options.onFailure) st.options.onFailure(c.spec.name, loss, true);
    if (startChild(self, i)) return;
    loss = lossOf(caf::make_error(Errc::kBadMessage, "its start function gave no actor"));
  }
}

caf::behavior supervisor(Self* self, SupervisorOptions options) {
  auto& st = self->state;
  st.options = std::move(options);
  for (auto& spec : st.options.children) st.children.push_back(Child{spec, caf::actor(), RestartBudget(st.options.policy)});
  self->set_down_handler([=](caf::down_msg& dm) {
    auto& st = self->state;
    for (size_t i = 0; i < st.children.size(); ++i) {
      auto& c = st.children[i];
      if (!c.current || c.current.address() != dm.source) continue;
      const Loss loss = lossOf(dm.reason);
      if (loss.kind == Loss::Kind::kNormal || st.stopped) {
        c.done = loss.kind == Loss::Kind::kNormal;
        c.current = caf::actor();
        (*st.live)[i] = caf::actor();
        st.log->debug("{}: {} {}", st.options.name, c.spec.name, st.stopped ? "stopped" : "finished");
      } else {
        onChildFailed(self, i, loss);
      }
      break;
    }
    if (st.stopped) return stop(self, st.reason);
    for (const auto& c : st.children) {
      if (!c.done) return;
    }
    stop(self, caf::error());
  });
  // Told to stop (by its owner): the children first, then itself.
  self->set_exit_handler([=](caf::exit_msg& em) { stop(self, std::move(em.reason)); });
  // Children go down with their supervisor, however it ends.
  self->attach_functor([live = st.live](const caf::error&) {
    for (auto& c : *live) {
      if (c) caf::anon_send_exit(c, caf::exit_reason::user_shutdown);
    }
  });
  st.live->resize(st.children.size());
  for (size_t i = 0; i < st.children.size() && !st.stopped; ++i) {
    if (!startChild(self, i)) {
      onChildFailed(self, i, lossOf(caf::make_error(Errc::kBadMessage, "its start function gave no actor")));
    }
  }
  return {
      [=](which_atom, const std::string& name) -> caf::actor {
        for (const auto& c : self->state.children) {
          if (c.spec.name == name) return c.current;
        }
        return caf::actor();
      },
  };
}

}  // namespace

caf::actor spawnSupervisor(caf::actor_system& system, SupervisorOptions options) {
  return system.spawn(supervisor, std::move(options));
}

}  // namespace troupe::actors
