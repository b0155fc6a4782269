// The supervisor on CAF's deterministic scheduler: children that fail are
// restarted within the budget and escalated beyond it, the budget's window
// slides with the actor clock, finished children stay finished, a child
// whose process departed is handled like one that failed, and a stopped
// supervisor takes its children down before it goes.
#include "actors/supervisor.h"

#include <memory>
#include <string>
#include <vector>

#include "actors/errors.h"
#include "actors/fault_injector.h"
#include "tests/actors/deterministic.h"
#include "transport/remote_actors.h"

namespace troupe::actors {
namespace {

using namespace std::chrono_literals;
using fail_atom = caf::atom_constant<caf::atom("fail")>;
using finish_atom = caf::atom_constant<caf::atom("finish")>;
using depart_atom = caf::atom_constant<caf::atom("depart")>;

// A child that quits as told: with an error, normally, or as a proxy does
// when its process departs.
caf::behavior puppet(caf::event_based_actor* self) {
  return {
      [=](fail_atom) { self->quit(caf::make_error(caf::sec::runtime_error, "told to fail")); },
      [=](finish_atom) { self->quit(); },
      [=](depart_atom) { self->quit(caf::make_error(transport::Departure::kCrashed, "its process died")); },
  };
}

class SupervisorTest : public testing::Deterministic {
 protected:
  // A spec whose start function counts its calls.
  ChildSpec spec(const std::string& name, bool restart = true) {
    auto counter = std::make_shared<int>(0);
    starts_[name] = counter;
    return ChildSpec{name, [counter](caf::actor_system& sys) {
                       ++*counter;
                       return sys.spawn(puppet);
                     },
                     restart};
  }
  caf::actor start(std::vector<ChildSpec> children, RestartPolicy policy) {
    SupervisorOptions o;
    o.name = "test";
    o.policy = policy;
    o.children = std::move(children);
    o.parent = caf::actor(self());
    o.onFailure = [this](const std::string& child, const Loss& loss, bool restarted) {
      failures_.push_back(child + (restarted ? " restarted after " : " escalated after ") + loss.describe());
    };
    auto sup = spawnSupervisor(system(), std::move(o));
    self()->monitor(sup);
    run();
    return sup;
  }
  caf::actor child(const caf::actor& sup, const std::string& name) {
    self()->send(sup, which_atom::value, name);
    run();
    auto a = take<caf::actor>();
    return a ? *a : caf::actor();
  }
  int starts(const std::string& name) { return *starts_[name]; }

  std::map<std::string, std::shared_ptr<int>> starts_;
  std::vector<std::string> failures_;
};

TEST_F(SupervisorTest, RestartsAFailingChildUpToTheBudgetThenEscalates) {
  auto sup = start({spec("a"), spec("b")}, RestartPolicy{2, 60s});
  EXPECT_EQ(starts("a"), 1);
  EXPECT_EQ(starts("b"), 1);
  for (int i = 0; i < 2; ++i) {
    auto a = child(sup, "a");
    ASSERT_TRUE(a) << i;
    self()->send(a, fail_atom::value);
    run();
    EXPECT_EQ(starts("a"), 2 + i);
  }
  EXPECT_TRUE(idle()) << "no escalation while restarts are left";
  auto b = child(sup, "b");
  self()->monitor(b);
  self()->send(child(sup, "a"), fail_atom::value);
  run();
  EXPECT_EQ(starts("a"), 3) << "no third restart";
  auto failed = take<ChildFailed>();
  ASSERT_TRUE(failed);
  EXPECT_EQ(failed->supervisor, "test");
  EXPECT_EQ(failed->child, "a");
  EXPECT_EQ(failed->restarts, 2);
  EXPECT_NE(failed->reason.find("told to fail"), std::string::npos) << failed->reason;
  // The other child was stopped, then the supervisor quit with the reason.
  std::vector<caf::down_msg> downs;
  while (auto d = take<caf::down_msg>()) downs.push_back(*d);
  ASSERT_EQ(downs.size(), 2u);
  EXPECT_EQ(downs[0].source, b.address()) << "the child went first";
  EXPECT_EQ(downs[1].source, sup.address());
  EXPECT_EQ(downs[1].reason, Errc::kRestartsExhausted) << describe(downs[1].reason);
  EXPECT_EQ(starts("b"), 1) << "the healthy child was never restarted";
  ASSERT_EQ(failures_.size(), 3u);
  EXPECT_EQ(failures_[0].rfind("a restarted after", 0), 0u) << failures_[0];
  EXPECT_EQ(failures_[2].rfind("a escalated after", 0), 0u) << failures_[2];
}

TEST_F(SupervisorTest, TheBudgetWindowSlidesWithTheClock) {
  auto sup = start({spec("a")}, RestartPolicy{2, 10s});
  // Two failures 6 s apart, five times: never more than two in 10 s.
  for (int i = 0; i < 5; ++i) {
    self()->send(child(sup, "a"), fail_atom::value);
    run();
    advance(6s);
  }
  EXPECT_EQ(starts("a"), 6);
  EXPECT_FALSE(take<ChildFailed>()) << "five restarts spread out are within the budget";
  // Three within one window are not (the window is empty again after 10 s).
  advance(10s);
  for (int i = 0; i < 2; ++i) {
    self()->send(child(sup, "a"), fail_atom::value);
    run();
  }
  EXPECT_TRUE(idle());
  self()->send(child(sup, "a"), fail_atom::value);
  run();
  auto failed = take<ChildFailed>();
  ASSERT_TRUE(failed);
  EXPECT_EQ(failed->restarts, 2);
}

TEST_F(SupervisorTest, AChildWhoseProcessDepartedIsRestartedLikeOneThatFailed) {
  auto sup = start({spec("remote")}, RestartPolicy{1, 60s});
  self()->send(child(sup, "remote"), depart_atom::value);
  run();
  EXPECT_EQ(starts("remote"), 2);
  ASSERT_EQ(failures_.size(), 1u);
  EXPECT_EQ(failures_[0], "remote restarted after crashed");
  self()->send(child(sup, "remote"), depart_atom::value);
  run();
  auto failed = take<ChildFailed>();
  ASSERT_TRUE(failed);
  EXPECT_EQ(failed->reason, "crashed");
}

TEST_F(SupervisorTest, FinishedChildrenStayFinishedAndTheSupervisorEndsWithThem) {
  auto sup = start({spec("a"), spec("b")}, RestartPolicy{3, 60s});
  self()->send(child(sup, "a"), finish_atom::value);
  run();
  EXPECT_FALSE(child(sup, "a")) << "a finished child has no current actor";
  EXPECT_EQ(starts("a"), 1);
  EXPECT_TRUE(idle());
  self()->send(child(sup, "b"), finish_atom::value);
  run();
  auto down = take<caf::down_msg>();
  ASSERT_TRUE(down);
  EXPECT_EQ(down->source, sup.address());
  EXPECT_FALSE(down->reason) << describe(down->reason);
  EXPECT_FALSE(take<ChildFailed>());
}

TEST_F(SupervisorTest, AChildThatIsNotRestartedEscalatesAtOnce) {
  auto sup = start({spec("shard", false)}, RestartPolicy{5, 60s});
  self()->send(child(sup, "shard"), fail_atom::value);
  run();
  EXPECT_EQ(starts("shard"), 1);
  auto failed = take<ChildFailed>();
  ASSERT_TRUE(failed);
  EXPECT_EQ(failed->restarts, 0);
  ASSERT_EQ(failures_.size(), 1u);
  EXPECT_EQ(failures_[0].rfind("shard escalated after", 0), 0u);
}

// A fault plan's kill of one actor (actors::killActor): the supervisor
// finds the child down, restarts it where its spec allows, and escalates
// (its process then reports the failure) where it does not.
TEST_F(SupervisorTest, AnActorKilledByAFaultIsRestartedOrEscalatedByItsSpec) {
  auto sup = start({spec("tables", true), spec("train-loader", false)}, RestartPolicy{3, 60s});
  killActor(1, "tables", child(sup, "tables"));
  run();
  EXPECT_EQ(starts("tables"), 2) << "restarted in place";
  EXPECT_FALSE(take<ChildFailed>());
  auto loader = child(sup, "train-loader");
  ASSERT_TRUE(loader);
  killActor(2, "train-loader", loader);
  run();
  EXPECT_EQ(starts("train-loader"), 1);
  auto failed = take<ChildFailed>();
  ASSERT_TRUE(failed);
  EXPECT_EQ(failed->child, "train-loader");
  EXPECT_EQ(failed->restarts, 0);
  ASSERT_EQ(failures_.size(), 2u);
  EXPECT_EQ(failures_[0].rfind("tables restarted after", 0), 0u) << failures_[0];
  EXPECT_EQ(failures_[1].rfind("train-loader escalated after", 0), 0u) << failures_[1];
}

TEST_F(SupervisorTest, AStartThatGivesNoActorCountsAsAFailure) {
  auto tries = std::make_shared<int>(0);
  ChildSpec broken{"broken", [tries](caf::actor_system&) {
                     ++*tries;
                     return caf::actor();
                   }};
  start({broken}, RestartPolicy{2, 60s});
  EXPECT_EQ(*tries, 3) << "the first start and two restarts";
  auto failed = take<ChildFailed>();
  ASSERT_TRUE(failed);
  EXPECT_EQ(failed->child, "broken");
}

TEST_F(SupervisorTest, AStoppedSupervisorTakesItsChildrenDownFirst) {
  auto sup = start({spec("a"), spec("b")}, RestartPolicy{3, 60s});
  auto a = child(sup, "a"), b = child(sup, "b");
  self()->monitor(a);
  self()->monitor(b);
  self()->send_exit(sup, caf::exit_reason::user_shutdown);
  run();
  std::vector<caf::actor_addr> order;
  while (auto d = take<caf::down_msg>()) order.push_back(d->source);
  ASSERT_EQ(order.size(), 3u);
  EXPECT_EQ(order[2], sup.address()) << "the supervisor goes last";
  EXPECT_EQ(starts("a"), 1) << "a stopped child is not restarted";
  EXPECT_EQ(starts("b"), 1);
  EXPECT_FALSE(take<ChildFailed>());
}

TEST(RestartBudget, CountsOnlyTheWindow) {
  using TP = RestartBudget::TimePoint;
  RestartBudget b(RestartPolicy{2, 10s});
  const TP t0{};
  EXPECT_TRUE(b.take(t0));
  EXPECT_TRUE(b.take(t0 + 1s));
  EXPECT_FALSE(b.take(t0 + 9s));
  EXPECT_EQ(b.spent(t0 + 9s), 2);
  EXPECT_EQ(b.spent(t0 + 10s), 1) << "the first restart left the window";
  EXPECT_TRUE(b.take(t0 + 10s));
  EXPECT_FALSE(b.take(t0 + 10s));
  RestartBudget none(RestartPolicy{0, 10s});
  EXPECT_FALSE(none.take(t0));
}

}  // namespace
}  // namespace troupe::actors
