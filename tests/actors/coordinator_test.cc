// The coordinator's decisions on CAF's deterministic scheduler, with no
// process: local actors stand in for the agents of member processes (a
// loss is such an actor going down the way a proxy does when its process
// departs), a scoped actor says Hello and Ready for them, and a scripted
// policy answers losses. Ranks, the ready barrier, the start deadline,
// fail / go on / replace, the restart budget, the replace timeout, duplicate
// and stale messages, and the job's own handlers.
#include "actors/coordinator.h"
#include "actors/fault_injector.h"

#include <map>
#include <set>
#include <memory>
#include <string>
#include <vector>

#include "tests/actors/deterministic.h"
#include "transport/remote_actors.h"

namespace troupe::actors {
namespace {

using namespace std::chrono_literals;
using ping_atom = caf::atom_constant<caf::atom("ping")>;
using depart_atom = caf::atom_constant<caf::atom("depart")>;
using finish_atom = caf::atom_constant<caf::atom("finish")>;
using written_atom = caf::atom_constant<caf::atom("written")>;

// A member process's agent: records the Shutdown it gets, departs on demand.
struct AgentLog {
  std::vector<std::string> shutdowns;
  std::vector<std::string> adopts;  // "worker 0 #1 the config"
  std::vector<std::string> injects;  // "2 stop 3000"
};

caf::behavior fakeAgent(caf::event_based_actor* self, std::shared_ptr<AgentLog> log) {
  return {
      [=](const Shutdown& s) { log->shutdowns.push_back(s.why); },
      [=](const Adopt& a) { log->adopts.push_back(fmt::format("{} {} #{} {}", a.role, a.rank, a.incarnation, a.config)); },
      [=](const Inject& x) { log->injects.push_back(fmt::format("{} {} {}", x.fault, x.kind, x.durationMs)); },
      [=](depart_atom, uint8_t how) { self->quit(caf::make_error(transport::Departure(how), "test")); },
  };
}

struct ScriptedPolicy final : JobPolicy {
  std::vector<LossDecision> decisions;  // answered in order; fail when none is left
  std::vector<LossDecision> escalations;
  std::vector<std::string> losses, replaced, escalated;
  int starts = 0, overs = 0;
  JobContext* job = nullptr;
  std::unique_ptr<FaultInjector> faults;  // a job with a fault plan

  caf::message_handler handlers(JobContext& j) override {
    job = &j;
    caf::message_handler own{
        [this](ping_atom, int64_t x) { return x + 1; },
        [this](const std::string& role, int64_t rank) { job->finished(role, rank); },
        [this](finish_atom) { job->finish(); },
        [this](written_atom, int64_t n) {
          if (faults) faults->checkpointWritten(*job, n);
        },
    };
    return faults ? own.or_else(faults->handlers(j)) : own;
  }
  void onStart(JobContext& j) override {
    ++starts;
    if (faults) faults->start(j);
  }
  LossDecision onLoss(JobContext&, const Member& m, const Loss& loss) override {
    losses.push_back(fmt::format("{} {} {}", m.role, m.rank, loss.describe()));
    if (decisions.empty()) return LossDecision::fail("no decision scripted");
    auto d = decisions.front();
    decisions.erase(decisions.begin());
    return d;
  }
  LossDecision onEscalation(JobContext&, const Member& m, const std::string& why) override {
    escalated.push_back(why);
    if (escalations.empty()) return LossDecision::fail(why);
    auto d = escalations.front();
    escalations.erase(escalations.begin());
    return d;
  }
  void onReplaced(JobContext&, const Member& m) override {
    replaced.push_back(fmt::format("{} {} #{}", m.role, m.rank, m.incarnation));
  }
  void onOver(JobContext&) override { ++overs; }
};

class CoordinatorTest : public testing::Deterministic {
 protected:
  CoordinatorTest() { policy_ = std::make_shared<ScriptedPolicy>(); }

  void startJob(int servers, int workers, RestartPolicy restarts = {}, bool withReplace = true) {
    CoordinatorOptions o;
    o.groups = {{"ps", servers}, {"worker", workers}};
    o.config = "the config";
    o.startTimeout = 30s;
    o.replaceTimeout = 20s;
    o.restarts = restarts;
    o.locate = [this](uint64_t node, const std::string& name) {
      EXPECT_EQ(name, kAgentName);
      return agents_.count(node) ? agents_[node] : caf::actor();
    };
    if (withReplace) o.replace = [this](const Member& m) { replacements_.push_back(m.describe()); };
    o.terminate = [this](const Member& m) { terminated_.push_back(m.describe()); };
    coord_ = spawnCoordinator(system(), std::move(o), policy_);
    stopAtEnd(coord_);
    self()->send(coord_, run_atom::value);
    run();
  }
  // A process on node `node` says hello; its answer.
  caf::expected<Welcome> hello(const std::string& role, int64_t rank, uint64_t node) {
    if (!agents_.count(node)) {
      logs_[node] = std::make_shared<AgentLog>();
      agents_[node] = system().spawn(fakeAgent, logs_[node]);
      stopAtEnd(agents_[node]);
    }
    self()->send(coord_, Hello{role, rank, node, fmt::format("10.0.0.{}:7000", node), int64_t(1000 + node)});
    run();
    if (auto w = take<Welcome>()) return *w;
    return caf::make_error(caf::sec::unexpected_response, "no welcome");
  }
  caf::error helloError(const std::string& role, int64_t rank, uint64_t node) {
    logs_[node] = std::make_shared<AgentLog>();
    agents_[node] = system().spawn(fakeAgent, logs_[node]);
    stopAtEnd(agents_[node]);
    self()->send(coord_, Hello{role, rank, node, "x:1", 1});
    run();
    auto e = take<caf::error>();
    return e ? *e : caf::error();
  }
  void ready(const std::string& role, int64_t rank, int64_t incarnation = 0) {
    self()->send(coord_, Ready{role, rank, incarnation});
    run();
  }
  void depart(uint64_t node, transport::Departure how = transport::Departure::kCrashed) {
    self()->send(agents_[node], depart_atom::value, uint8_t(how));
    run();
  }
  // Joins and readies every member: ps on nodes 1.., workers on nodes 11...
  void everyoneReady(int servers, int workers) {
    for (int s = 0; s < servers; ++s) ASSERT_TRUE(hello("ps", s, 1 + uint64_t(s)));
    for (int w = 0; w < workers; ++w) ASSERT_TRUE(hello("worker", w, 11 + uint64_t(w)));
    for (int s = 0; s < servers; ++s) ready("ps", s);
    for (int w = 0; w < workers; ++w) ready("worker", w);
    // One roster per Ready.
    for (int i = 0; i < servers + workers; ++i) ASSERT_TRUE(take<Roster>()) << i;
  }
  std::optional<JobResult> result() { return take<JobResult>(); }
  // The replacement timers of earlier losses run out and change nothing;
  // then the job finishes: its outcome.
  std::optional<JobResult> timersThenFinish() {
    advance(30s);
    EXPECT_FALSE(result()) << "a replacement timer ended the job";
    self()->send(coord_, finish_atom::value);
    run();
    return result();
  }

  std::shared_ptr<ScriptedPolicy> policy_;
  caf::actor coord_;
  std::map<uint64_t, caf::actor> agents_;
  std::map<uint64_t, std::shared_ptr<AgentLog>> logs_;
  std::vector<std::string> replacements_, terminated_;
};

TEST_F(CoordinatorTest, GivesRanksAsAskedOrTheLowestFreeAndRefusesTheRest) {
  startJob(1, 3);
  auto w2 = hello("worker", 2, 11);
  ASSERT_TRUE(w2);
  EXPECT_EQ(w2->rank, 2);
  EXPECT_EQ(w2->incarnation, 0);
  EXPECT_EQ(w2->config, "the config");
  auto taken = hello("worker", 2, 12);  // 2 is taken: the lowest free
  ASSERT_TRUE(taken);
  EXPECT_EQ(taken->rank, 0);
  auto any = hello("worker", -1, 13);
  ASSERT_TRUE(any);
  EXPECT_EQ(any->rank, 1);
  EXPECT_EQ(helloError("worker", -1, 14), Errc::kRankTaken);
  EXPECT_EQ(helloError("gardener", -1, 15), Errc::kNotInJob);
  // The same process saying hello again gets the same answer and changes nothing.
  auto again = hello("worker", 0, 11);
  ASSERT_TRUE(again);
  EXPECT_EQ(again->rank, 2);
  EXPECT_EQ(again->incarnation, 0);
  auto ps = hello("ps", 5, 1);  // a rank out of range: the lowest free
  ASSERT_TRUE(ps);
  EXPECT_EQ(ps->rank, 0);
}

TEST_F(CoordinatorTest, TheRosterComesOnceEveryoneIsReadyInTheJobsOrder) {
  startJob(2, 2);
  ASSERT_TRUE(hello("worker", 1, 21));
  ASSERT_TRUE(hello("ps", 1, 7));
  ASSERT_TRUE(hello("worker", 0, 20));
  ready("worker", 1);
  ready("ps", 1);
  ready("worker", 0);
  EXPECT_FALSE(take<Roster>()) << "ps 0 has not joined";
  ASSERT_TRUE(hello("ps", 0, 6));
  ready("ps", 0);
  std::vector<Roster> rosters;
  while (auto r = take<Roster>()) rosters.push_back(*r);
  ASSERT_EQ(rosters.size(), 4u);
  for (const auto& r : rosters) {
    EXPECT_EQ(r.roles, (std::vector<std::string>{"ps", "worker"}));
    EXPECT_EQ(r.counts, (std::vector<int64_t>{2, 2}));
    EXPECT_EQ(r.nodes, (std::vector<uint64_t>{6, 7, 20, 21}));
    EXPECT_EQ(r.nodesOf("worker"), (std::vector<uint64_t>{20, 21}));
    EXPECT_EQ(r.generation, 0);
  }
  EXPECT_EQ(policy_->starts, 1);
  // A Ready for a rank that never joined, or of another incarnation, is refused.
  self()->send(coord_, Ready{"worker", 7, 0});
  run();
  auto e = take<caf::error>();
  ASSERT_TRUE(e);
  EXPECT_EQ(*e, Errc::kNotInJob);
}

TEST_F(CoordinatorTest, NotEveryoneReadyInTimeFailsNamingWhoIsMissing) {
  startJob(1, 2);
  ASSERT_TRUE(hello("ps", 0, 1));
  ASSERT_TRUE(hello("worker", 0, 11));
  ready("ps", 0);
  advance(29s);
  EXPECT_FALSE(result());
  advance(2s);
  auto r = result();
  ASSERT_TRUE(r);
  EXPECT_FALSE(r->ok);
  EXPECT_NE(r->error.find("cluster.start_timeout_s = 30 s; missing: worker 0 (joined), worker 1"), std::string::npos)
      << r->error;
  // The process that joined is told.
  ASSERT_EQ(logs_[1]->shutdowns.size(), 1u);
  EXPECT_EQ(logs_[1]->shutdowns[0], r->error);
  EXPECT_EQ(policy_->overs, 1);
}

TEST_F(CoordinatorTest, ALossThePolicyCannotTakeFailsTheJobAndStopsEveryoneElse) {
  startJob(1, 2);
  everyoneReady(1, 2);
  policy_->decisions = {LossDecision::fail("worker 1 is gone and BSP needs it")};
  depart(12, transport::Departure::kTimedOut);
  ASSERT_EQ(policy_->losses.size(), 1u);
  EXPECT_EQ(policy_->losses[0], "worker 1 timed out");
  EXPECT_EQ(terminated_, (std::vector<std::string>{"worker 1 (10.0.0.12:7000)"})) << "a hung process must not come back";
  auto r = result();
  ASSERT_TRUE(r);
  EXPECT_FALSE(r->ok);
  EXPECT_EQ(r->error, "worker 1 is gone and BSP needs it");
  ASSERT_EQ(r->events.size(), 1u);
  EXPECT_EQ(r->events[0].what, "worker 1 (10.0.0.12:7000) timed out");
  EXPECT_EQ(r->events[0].detectedBy, "timed out");
  EXPECT_EQ(r->events[0].action, "failed the job");
  for (uint64_t node : {1, 11}) EXPECT_EQ(logs_[node]->shutdowns.size(), 1u) << node;
  EXPECT_TRUE(logs_[12]->shutdowns.empty());
  // Later messages change nothing.
  depart(11);
  EXPECT_EQ(policy_->losses.size(), 1u);
}

TEST_F(CoordinatorTest, GoingOnWithoutALostMemberAndFinishing) {
  startJob(1, 2);
  everyoneReady(1, 2);
  policy_->decisions = {LossDecision::goOn()};
  depart(11);
  EXPECT_FALSE(result());
  // A member that finished may leave: no loss.
  self()->send(coord_, std::string("worker"), int64_t(1));
  run();
  depart(12, transport::Departure::kLeft);
  EXPECT_EQ(policy_->losses.size(), 1u);
  // The job's own handlers answer through the coordinator.
  self()->send(coord_, ping_atom::value, int64_t(41));
  run();
  EXPECT_EQ(take<int64_t>(), 42);
  self()->send(coord_, finish_atom::value);
  run();
  auto r = result();
  ASSERT_TRUE(r);
  EXPECT_TRUE(r->ok);
  ASSERT_EQ(r->events.size(), 1u);
  EXPECT_EQ(r->events[0].action, "went on without it");
  EXPECT_EQ(logs_[1]->shutdowns, (std::vector<std::string>{""}));
}

TEST_F(CoordinatorTest, AReplacementTakesTheLostRankAndGetsTheRosterAtOnce) {
  startJob(1, 2, RestartPolicy{2, 60s});
  everyoneReady(1, 2);
  policy_->decisions = {LossDecision::replace()};
  advance(5s);
  depart(12);
  EXPECT_EQ(replacements_, (std::vector<std::string>{"worker 1 (10.0.0.12:7000)"}));
  EXPECT_FALSE(result());
  // A launch asking for any rank gets the lost one, as its next incarnation.
  auto w = hello("worker", -1, 30);
  ASSERT_TRUE(w);
  EXPECT_EQ(w->rank, 1);
  EXPECT_EQ(w->incarnation, 1);
  ready("worker", 1, 1);
  auto roster = take<Roster>();
  ASSERT_TRUE(roster);
  EXPECT_EQ(roster->nodesOf("worker"), (std::vector<uint64_t>{11, 30}));
  EXPECT_EQ(roster->generation, 1);
  EXPECT_EQ(policy_->replaced, (std::vector<std::string>{"worker 1 #1"}));
  // The replacement timer of the lost process finds it replaced.
  auto r = timersThenFinish();
  ASSERT_TRUE(r);
  EXPECT_TRUE(r->ok);
  ASSERT_EQ(r->events.size(), 1u);
  EXPECT_EQ(r->events[0].action, "replaced");
  EXPECT_GE(r->events[0].recoveredAtSeconds, r->events[0].lostAtSeconds);
  EXPECT_EQ(logs_[30]->shutdowns.size(), 1u) << "the replacement is a member like any other";
}

// A lost rank moved into a live process (shrink): that process's agent is
// told, no new process is started, the rank's Ready gets the roster at once
// (with the host's node), and when the host goes, every rank it runs goes
// with it, a moving rank holding no other one back.
TEST_F(CoordinatorTest, ALostRankMovesIntoALiveProcessAndGoesWithIt) {
  startJob(0, 3, RestartPolicy{3, 60s});
  everyoneReady(0, 3);
  policy_->decisions = {LossDecision::adopt(1)};
  depart(11);
  EXPECT_TRUE(replacements_.empty()) << "no new process";
  EXPECT_EQ(terminated_, (std::vector<std::string>{"worker 0 (10.0.0.11:7000)"}));
  EXPECT_EQ(logs_[12]->adopts, (std::vector<std::string>{"worker 0 #1 the config"}));
  ready("worker", 0, 1);
  auto roster = take<Roster>();
  ASSERT_TRUE(roster);
  EXPECT_EQ(roster->nodesOf("worker"), (std::vector<uint64_t>{12, 12, 13}));
  EXPECT_EQ(policy_->replaced, (std::vector<std::string>{"worker 0 #1"}));
  // The host's process goes: both its ranks are lost, and move on.
  terminated_.clear();
  policy_->decisions = {LossDecision::adopt(2), LossDecision::adopt(2)};
  depart(12);
  EXPECT_EQ(policy_->losses.size(), 3u);
  // The process is stopped as worker 1's; worker 0, moved into it, names no process of its own.
  EXPECT_EQ(terminated_, (std::vector<std::string>{"worker 1 (10.0.0.12:7000)"}));
  EXPECT_EQ(logs_[13]->adopts, (std::vector<std::string>{"worker 0 #2 the config", "worker 1 #1 the config"}));
  // Rank 1 is ready first: rank 0, still moving, does not hold its roster.
  ready("worker", 1, 1);
  roster = take<Roster>();
  ASSERT_TRUE(roster);
  EXPECT_EQ(roster->nodesOf("worker"), (std::vector<uint64_t>{13, 13, 13}));
  ready("worker", 0, 2);
  ASSERT_TRUE(take<Roster>());
  // The moves' timers find them done.
  auto r = timersThenFinish();
  ASSERT_TRUE(r);
  EXPECT_TRUE(r->ok);
  ASSERT_EQ(r->events.size(), 3u);
  EXPECT_EQ(r->events[0].action, "moved to the process of worker 1");
  EXPECT_EQ(r->events[1].action, "moved to the process of worker 2");
  EXPECT_EQ(r->events[2].action, "moved to the process of worker 2");
  for (const auto& e : r->events) EXPECT_GE(e.recoveredAtSeconds, e.lostAtSeconds);
  EXPECT_EQ(logs_[13]->shutdowns.size(), 1u) << "one process, one Shutdown";
}

// A move into a process that is not running fails the job saying so: the
// lost rank's own process (here), one going with it (the host of a rank
// moved there) and one whose role does not run yet (it has no roster) in
// the two tests below.
TEST_F(CoordinatorTest, AMoveIntoAProcessThatDoesNotRunFailsTheJob) {
  startJob(0, 2, RestartPolicy{3, 60s});
  everyoneReady(0, 2);
  policy_->decisions = {LossDecision::adopt(0)};
  depart(11);
  auto r = result();
  ASSERT_TRUE(r);
  EXPECT_FALSE(r->ok);
  EXPECT_NE(r->error.find("it was to move into the process of worker 0, which is not running"), std::string::npos)
      << r->error;
  EXPECT_TRUE(logs_[12]->adopts.empty());
}

TEST_F(CoordinatorTest, AMoveIntoTheProcessGoingWithTheLostRankFailsTheJob) {
  startJob(0, 3, RestartPolicy{3, 60s});
  everyoneReady(0, 3);
  policy_->decisions = {LossDecision::adopt(1)};
  depart(11);
  ready("worker", 0, 1);
  ASSERT_TRUE(take<Roster>());
  // Worker 1's process goes: worker 0 (in it) is lost first and may not
  // move into worker 1, which goes with it.
  policy_->decisions = {LossDecision::adopt(1)};
  depart(12);
  auto r = result();
  ASSERT_TRUE(r);
  EXPECT_FALSE(r->ok);
  EXPECT_NE(r->error.find("it was to move into the process of worker 1, which is not running"), std::string::npos)
      << r->error;
}

TEST_F(CoordinatorTest, AMoveIntoAProcessStillWaitingForItsRosterFailsTheJob) {
  startJob(0, 3, RestartPolicy{3, 60s});
  // Workers 0 and 1 ready, 2 joined: nobody has a roster yet.
  ASSERT_TRUE(hello("worker", 0, 11));
  ASSERT_TRUE(hello("worker", 1, 12));
  ASSERT_TRUE(hello("worker", 2, 13));
  ready("worker", 0);
  ready("worker", 1);
  policy_->decisions = {LossDecision::adopt(1)};
  depart(11);
  auto r = result();
  ASSERT_TRUE(r);
  EXPECT_FALSE(r->ok);
  EXPECT_NE(r->error.find("which is not running"), std::string::npos) << r->error;
  EXPECT_TRUE(logs_[12]->adopts.empty());
}

TEST_F(CoordinatorTest, AMoveSpendsTheRanksRestartBudget) {
  startJob(0, 2, RestartPolicy{0, 60s});
  everyoneReady(0, 2);
  policy_->decisions = {LossDecision::adopt(1)};
  depart(11);
  ASSERT_EQ(policy_->escalated.size(), 1u);
  EXPECT_NE(policy_->escalated[0].find("its restart budget is spent"), std::string::npos) << policy_->escalated[0];
  EXPECT_TRUE(logs_[12]->adopts.empty());
  auto r = result();
  ASSERT_TRUE(r);
  EXPECT_FALSE(r->ok);
}

TEST_F(CoordinatorTest, ASpentRestartBudgetIsEscalatedToThePolicy) {
  startJob(0, 1, RestartPolicy{1, 60s});
  everyoneReady(0, 1);
  policy_->decisions = {LossDecision::replace(), LossDecision::replace()};
  depart(11);
  ASSERT_TRUE(hello("worker", 0, 40));
  ready("worker", 0, 1);
  ASSERT_TRUE(take<Roster>());
  depart(40);
  EXPECT_EQ(replacements_.size(), 1u) << "no second replacement within the window";
  auto r = result();
  ASSERT_TRUE(r);
  EXPECT_FALSE(r->ok);
  EXPECT_NE(r->error.find("restart budget is spent (1 restarts in 60 s"), std::string::npos) << r->error;
  ASSERT_EQ(policy_->escalated.size(), 1u);
}

TEST_F(CoordinatorTest, NoReplacementInTimeIsEscalatedAndThePolicyMayGoOn) {
  startJob(1, 2, RestartPolicy{3, 60s}, /*withReplace=*/false);
  everyoneReady(1, 2);
  policy_->decisions = {LossDecision::replace()};
  policy_->escalations = {LossDecision::goOn()};
  depart(12);
  advance(19s);
  EXPECT_TRUE(policy_->escalated.empty());
  advance(2s);
  ASSERT_EQ(policy_->escalated.size(), 1u);
  EXPECT_NE(policy_->escalated[0].find("no process took worker 1 within supervision.replace_timeout_s = 20 s"),
            std::string::npos)
      << policy_->escalated[0];
  EXPECT_FALSE(result()) << "the policy went on";
  // The rank is no longer free for a late launch.
  EXPECT_EQ(helloError("worker", 1, 50), Errc::kRankTaken);
}

TEST_F(CoordinatorTest, AFailureReportIsALossAndStaleOrRepeatedReportsChangeNothing) {
  startJob(1, 1);
  everyoneReady(1, 1);
  policy_->decisions = {LossDecision::replace()};
  self()->send(coord_, MemberFailed{"worker", 0, 5, "an old process"});  // stale incarnation
  run();
  EXPECT_TRUE(policy_->losses.empty());
  self()->send(coord_, MemberFailed{"worker", 0, 0, "pull from shard 0: timeout"});
  self()->send(coord_, MemberFailed{"worker", 0, 0, "pull from shard 0: timeout"});
  run();
  ASSERT_EQ(policy_->losses.size(), 1u);
  EXPECT_EQ(policy_->losses[0], "worker 0 failed: pull from shard 0: timeout");
  // Its process leaving afterwards is the same loss, not a second one.
  depart(11, transport::Departure::kLeft);
  EXPECT_EQ(policy_->losses.size(), 1u);
  EXPECT_TRUE(terminated_.empty()) << "a process that reported its own failure exits by itself";
}

TEST_F(CoordinatorTest, AReplacementThatJoinsButIsNeverReadyIsGivenUpOnAndItsEventSaysSo) {
  startJob(0, 2, RestartPolicy{3, 60s});
  everyoneReady(0, 2);
  policy_->decisions = {LossDecision::replace(), LossDecision::goOn()};
  policy_->escalations = {LossDecision::goOn()};
  depart(12);
  ASSERT_TRUE(hello("worker", -1, 30));  // joins, never says Ready
  advance(10s);
  depart(11);  // another loss meanwhile: its own event
  advance(11s);
  ASSERT_EQ(policy_->escalated.size(), 1u);
  EXPECT_NE(policy_->escalated[0].find("no process took worker 1"), std::string::npos) << policy_->escalated[0];
  EXPECT_EQ(terminated_.back(), "worker 1 (10.0.0.30:7000)") << "the one that joined and hung is stopped";
  self()->send(coord_, finish_atom::value);
  run();
  auto r = result();
  ASSERT_TRUE(r);
  ASSERT_EQ(r->events.size(), 2u);
  EXPECT_EQ(r->events[0].what, "worker 1 (10.0.0.12:7000) crashed");
  EXPECT_EQ(r->events[0].action, "gave up; went on without it");
  EXPECT_EQ(r->events[0].recoveredAtSeconds, -1);
  EXPECT_EQ(r->events[1].what, "worker 0 (10.0.0.11:7000) crashed");
  EXPECT_EQ(r->events[1].action, "went on without it");
}

TEST_F(CoordinatorTest, ALossBeforeTheStartIsReplacedAndTheStartWaitsForIt) {
  startJob(0, 2, RestartPolicy{3, 60s});
  ASSERT_TRUE(hello("worker", 0, 11));
  ASSERT_TRUE(hello("worker", 1, 12));
  ready("worker", 0);
  policy_->decisions = {LossDecision::replace()};
  depart(12);
  ASSERT_TRUE(hello("worker", 1, 13));
  ready("worker", 1, 1);
  std::vector<Roster> rosters;
  while (auto r = take<Roster>()) rosters.push_back(*r);
  ASSERT_EQ(rosters.size(), 2u);
  EXPECT_EQ(rosters[0].nodes, (std::vector<uint64_t>{11, 13}));
  EXPECT_EQ(policy_->starts, 1);
  self()->send(coord_, finish_atom::value);
  run();
  auto r = result();
  ASSERT_TRUE(r);
  ASSERT_EQ(r->events.size(), 1u);
  EXPECT_EQ(r->events[0].action, "replaced");
  EXPECT_GE(r->events[0].recoveredAtSeconds, 0);
}

TEST_F(CoordinatorTest, TheOutcomeIsAskedForOnce) {
  startJob(0, 1);
  self()->send(coord_, run_atom::value);
  run();
  auto e = take<caf::error>();
  ASSERT_TRUE(e);
  EXPECT_EQ(*e, Errc::kBadMessage);
}

TEST_F(CoordinatorTest, AbortFailsTheJobWithTheReason) {
  startJob(1, 1);
  self()->send(coord_, abort_atom::value, std::string("interrupted (Ctrl-C)"));
  run();
  auto r = result();
  ASSERT_TRUE(r);
  EXPECT_FALSE(r->ok);
  EXPECT_EQ(r->error, "interrupted (Ctrl-C)");
  auto late = helloError("worker", 0, 60);
  EXPECT_EQ(late, Errc::kJobFailed);
}


// ---- the fault injector on the coordinator (actors/fault_injector.h) ----

FaultPlan planOf(std::vector<std::string> specs, int64_t seed, int64_t workers, int64_t servers) {
  Config c(troupeConfigSchema());
  c.setValue("faults.seed", seed);
  c.setValue("faults.plan", std::move(specs));
  return parseFaultPlan(c, workers, servers);
}

TEST_F(CoordinatorTest, TimedFaultsHitTheProcessOfTheirTargetWhenDueCountingFromTheStart) {
  policy_->faults = std::make_unique<FaultInjector>(
      planOf({"kind=kill,target=worker:1,at_s=5", "kind=stop,target=ps:0,at_s=2,duration_s=3"}, 1, 2, 1));
  startJob(1, 2);
  advance(10s);  // before the start nothing fires, however long it takes
  for (auto& [node, log] : logs_) EXPECT_TRUE(log->injects.empty());
  everyoneReady(1, 2);
  advance(1900ms);
  EXPECT_TRUE(logs_[1]->injects.empty());
  advance(100ms);
  EXPECT_EQ(logs_[1]->injects, std::vector<std::string>({"2 stop 3000"}));
  advance(2900ms);
  EXPECT_TRUE(logs_[12]->injects.empty());
  advance(100ms);
  EXPECT_EQ(logs_[12]->injects, std::vector<std::string>({"1 kill 0"}));
  EXPECT_TRUE(logs_[11]->injects.empty());
  advance(100s);  // each fires once
  EXPECT_EQ(logs_[1]->injects.size(), 1u);
  EXPECT_EQ(logs_[12]->injects.size(), 1u);
  const auto& in = policy_->faults->injections();
  ASSERT_EQ(in.size(), 2u);
  EXPECT_EQ(in[0].fault, 2);
  EXPECT_EQ(in[0].role, "ps");
  EXPECT_EQ(in[0].rank, 0);
  EXPECT_EQ(in[0].pid, 1001);
  EXPECT_EQ(in[1].fault, 1);
  EXPECT_EQ(in[1].rank, 1);
  EXPECT_EQ(in[1].pid, 1012);
  EXPECT_FALSE(in[0].skipped || in[1].skipped);
}

TEST_F(CoordinatorTest, AFaultAfterACheckpointCountsItsSecondsFromThatCheckpoint) {
  policy_->faults = std::make_unique<FaultInjector>(
      planOf({"kind=kill,target=ps:1,after_checkpoint=2,at_s=1"}, 1, 1, 2));
  startJob(2, 1);
  everyoneReady(2, 1);
  advance(30s);
  EXPECT_TRUE(logs_[2]->injects.empty()) << "no checkpoint yet";
  self()->send(coord_, written_atom::value, int64_t{1});
  run();
  advance(30s);
  EXPECT_TRUE(logs_[2]->injects.empty()) << "one checkpoint is not two";
  self()->send(coord_, written_atom::value, int64_t{2});
  run();
  advance(900ms);
  EXPECT_TRUE(logs_[2]->injects.empty());
  advance(100ms);
  EXPECT_EQ(logs_[2]->injects, std::vector<std::string>({"1 kill 0"}));
  self()->send(coord_, written_atom::value, int64_t{3});
  run();
  advance(30s);
  EXPECT_EQ(logs_[2]->injects.size(), 1u) << "once";
}

TEST_F(CoordinatorTest, AFaultWhoseTargetHasNoRunningProcessIsSkippedAndRecordedSo) {
  policy_->decisions = {LossDecision::replace()};
  policy_->faults = std::make_unique<FaultInjector>(planOf({"kind=kill,target=worker:0,at_s=1"}, 1, 2, 0));
  startJob(0, 2);
  everyoneReady(0, 2);
  depart(11);  // worker 0's process is gone; its replacement has not come
  advance(1s);
  EXPECT_TRUE(logs_[11]->injects.empty());
  EXPECT_TRUE(logs_[12]->injects.empty());
  const auto& in = policy_->faults->injections();
  ASSERT_EQ(in.size(), 1u);
  EXPECT_TRUE(in[0].skipped);
  EXPECT_EQ(in[0].rank, 0);
}

TEST_F(CoordinatorTest, ARepeatedFaultFiresCountTimesAtRandomRanksThatTheSeedAloneDecides) {
  // Each firing: the node hit and the half second it came in.
  auto campaign = [this](int64_t seed) {
    policy_ = std::make_shared<ScriptedPolicy>();
    agents_.clear();
    logs_.clear();
    policy_->faults = std::make_unique<FaultInjector>(
        planOf({"kind=stop,target=worker,every_s=4,count=6,duration_s=1"}, seed, 4, 0));
    startJob(0, 4);
    everyoneReady(0, 4);
    std::vector<std::pair<uint64_t, int>> hits;
    std::map<uint64_t, size_t> seen;
    for (int tick = 1; tick <= 400; ++tick) {  // 200 s
      advance(500ms);
      for (auto& [node, log] : logs_) {
        for (; seen[node] < log->injects.size(); ++seen[node]) {
          EXPECT_EQ(log->injects[seen[node]], "1 stop 1000");
          hits.emplace_back(node, tick);
        }
      }
    }
    EXPECT_EQ(policy_->faults->injections().size(), 6u);
    self()->send(coord_, finish_atom::value);
    run();
    return hits;
  };
  const auto a = campaign(7), again = campaign(7), other = campaign(8);
  ASSERT_EQ(a.size(), 6u) << "count=6";
  EXPECT_EQ(a, again) << "the same seed, the same ranks at the same times";
  EXPECT_NE(a, other) << "another seed, other draws";
  std::set<uint64_t> nodes;
  for (const auto& [node, tick] : a) nodes.insert(node);
  EXPECT_GT(nodes.size(), 1u) << "a random rank each time, not always the same";
}

TEST_F(CoordinatorTest, AFaultAMemberFiresItselfIsRecordedAndOneNotInThePlanIsRefused) {
  policy_->faults = std::make_unique<FaultInjector>(planOf({"kind=kill,target=worker:1,at_step=30"}, 1, 2, 0));
  startJob(0, 2);
  everyoneReady(0, 2);
  self()->send(coord_, FaultFired{1, "worker", 1, 0, 30});
  run();
  auto id = take<int64_t>();
  ASSERT_TRUE(id);
  EXPECT_EQ(*id, 1);
  self()->send(coord_, FaultFired{1, "worker", 1, 0, 30});  // said again
  run();
  auto again = take<int64_t>();
  ASSERT_TRUE(again);
  EXPECT_EQ(*again, 1);
  // Not in the plan; another rank's; a later process of the rank.
  for (const FaultFired& bad : {FaultFired{9, "worker", 1, 0, 30}, FaultFired{1, "worker", 0, 0, 30},
                                FaultFired{1, "worker", 1, 1, 30}, FaultFired{1, "ps", 1, 0, 30},
                                FaultFired{1, "worker", 7, 0, 30}}) {
    self()->send(coord_, bad);
    run();
    auto refused = take<caf::error>();
    ASSERT_TRUE(refused) << bad.fault << " " << bad.rank;
    EXPECT_EQ(*refused, Errc::kBadMessage);
  }
  const auto& in = policy_->faults->injections();
  ASSERT_EQ(in.size(), 1u);
  EXPECT_EQ(in[0].step, 30);
  EXPECT_EQ(in[0].kind, FaultKind::kKill);
  EXPECT_EQ(in[0].pid, 1012);
}

}  // namespace
}  // namespace troupe::actors
