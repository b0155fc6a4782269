// Fault plans (actors/fault_plan.h): written as [[faults]] tables or
// --fault specs, read field by field, and refused with a message naming
// the fault and the field when anything is wrong.
#include "actors/fault_plan.h"

#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/check.h"
#include "common/config.h"

namespace troupe::actors {
namespace {

Config configWith(const std::vector<std::string>& specs, int64_t seed = 1) {
  Config c(troupeConfigSchema());
  c.setValue("faults.seed", seed);
  for (const auto& s : specs) c.append("faults.plan", s);
  return c;
}

// The message of the SetupError a plan is refused with ("" if none).
std::string refusal(const std::vector<std::string>& specs, int64_t workers = 2, int64_t servers = 2) {
  try {
    parseFaultPlan(configWith(specs), workers, servers);
  } catch (const SetupError& e) {
    return e.what();
  }
  return "";
}

TEST(FaultPlan, ReadsEveryFieldOfEveryKind) {
  const FaultPlan p = parseFaultPlan(
      configWith({"kind=kill,target=worker:1,at_step=40", "kind=stop, target=ps:0, at_s=2.5, duration_s=8",
                  "kind=kill,target=ps,every_s=20,count=3", "kind=slow,target=worker:0,factor=3,at_step=10,steps=50",
                  "kind=slow,target=worker:1,delay_ms=25"},
                 42),
      2, 2);
  EXPECT_EQ(p.seed, 42u);
  ASSERT_EQ(p.faults.size(), 5u);
  const Fault& kill = p.faults[0];
  EXPECT_EQ(kill.id, 1);
  EXPECT_EQ(kill.kind, FaultKind::kKill);
  EXPECT_EQ(kill.role, "worker");
  EXPECT_EQ(kill.rank, 1);
  EXPECT_EQ(kill.atStep, 40);
  EXPECT_TRUE(kill.stepTriggered());
  const Fault& stop = p.faults[1];
  EXPECT_EQ(stop.kind, FaultKind::kStop);
  EXPECT_EQ(stop.role, "ps");
  EXPECT_EQ(stop.rank, 0);
  EXPECT_DOUBLE_EQ(stop.atSeconds, 2.5);
  EXPECT_DOUBLE_EQ(stop.durationSeconds, 8);
  EXPECT_FALSE(stop.stepTriggered());
  const Fault& every = p.faults[2];
  EXPECT_EQ(every.rank, -1) << "no rank: drawn at each firing";
  EXPECT_DOUBLE_EQ(every.everySeconds, 20);
  EXPECT_EQ(every.count, 3);
  const Fault& slow = p.faults[3];
  EXPECT_EQ(slow.kind, FaultKind::kSlow);
  EXPECT_DOUBLE_EQ(slow.factor, 3);
  EXPECT_EQ(slow.atStep, 10);
  EXPECT_EQ(slow.steps, 50);
  EXPECT_EQ(p.faults[4].delayMs, 25);
  EXPECT_EQ(p.faults[4].atStep, 0) << "a slow fault starts at the first step unless told";
  // Worker 1's step faults: the kill and the second slow one.
  const auto mine = p.stepFaultsOf(1);
  ASSERT_EQ(mine.size(), 2u);
  EXPECT_EQ(mine[0].id, 1);
  EXPECT_EQ(mine[1].id, 5);
  EXPECT_EQ(p.stepFaultsOf(0).size(), 1u);
}

TEST(FaultPlan, MessageFaultsBecomeLinkRules) {
  const FaultPlan p = parseFaultPlan(configWith({"kind=drop,from=worker,to=ps:1,p=0.05",
                                                 "kind=delay,from=ps,to=worker:0,p=0.1,delay_ms=2-30,at_s=1,duration_s=4",
                                                 "kind=kill,target=worker:1,at_step=40",
                                                 "kind=partition,target=ps:0,at_s=5,duration_s=2",
                                                 "kind=corrupt,p=1,bits=3,both_ways=true"}),
                                     2, 2);
  ASSERT_EQ(p.faults.size(), 1u);
  EXPECT_EQ(p.faults[0].id, 3);
  ASSERT_EQ(p.messages.size(), 4u);
  const auto rules = p.linkRules();
  EXPECT_EQ(p.messages[0].id, 1);
  EXPECT_EQ(rules[0].kind, transport::LinkFaultKind::kDrop);
  EXPECT_EQ(rules[0].from, "worker");
  EXPECT_EQ(rules[0].to, "ps:1");
  EXPECT_DOUBLE_EQ(rules[0].probability, 0.05);
  EXPECT_EQ(rules[1].delayMin, std::chrono::milliseconds(2));
  EXPECT_EQ(rules[1].delayMax, std::chrono::milliseconds(30));
  EXPECT_DOUBLE_EQ(rules[1].startSeconds, 1);
  EXPECT_DOUBLE_EQ(rules[1].endSeconds, 5);
  EXPECT_EQ(p.messages[2].id, 4);
  EXPECT_EQ(rules[2].kind, transport::LinkFaultKind::kPartition);
  EXPECT_EQ(rules[2].from, "ps:0");
  EXPECT_EQ(rules[2].to, "*");
  EXPECT_DOUBLE_EQ(rules[2].endSeconds, 7);
  EXPECT_EQ(rules[3].from, "*");
  EXPECT_EQ(rules[3].bits, 3);
  EXPECT_TRUE(rules[3].bothWays);
}

// A kill that names one actor of the process: a fault of its own kind,
// armed in the worker (a step) or sent by the coordinator (a time).
TEST(FaultPlan, AKillOfOneActorNamesAnActorOfItsTargetsRole) {
  Config c = configWith({"kind=kill,target=worker:1,actor=train-loader,at_step=7", "kind=kill-actor,target=ps:0,actor=shard,at_s=1.5",
                         "kind=kill,target=ps:1,actor=backup,every_s=5,count=2"});
  c.setValue("ps.replicas", int64_t{2});
  const FaultPlan p = parseFaultPlan(c, 2, 2);
  ASSERT_EQ(p.faults.size(), 3u);
  EXPECT_EQ(p.faults[0].kind, FaultKind::kKillActor);
  EXPECT_EQ(p.faults[0].actor, "train-loader");
  EXPECT_EQ(p.faults[0].atStep, 7);
  EXPECT_EQ(p.faults[1].kind, FaultKind::kKillActor);
  EXPECT_EQ(p.faults[1].actor, "shard");
  EXPECT_EQ(p.faults[2].actor, "backup");
  EXPECT_EQ(std::string(faultKindName(FaultKind::kKillActor)), "kill-actor");
  ASSERT_EQ(p.stepFaultsOf(1).size(), 1u);
  EXPECT_EQ(p.stepFaultsOf(1)[0].actor, "train-loader");
  struct Case {
    std::string spec, expected;
  };
  for (const Case& k : std::vector<Case>{
           {"kind=stop,target=worker:1,actor=worker,at_s=1,duration_s=1",
            "fault 1 (kind=stop,target=worker:1,actor=worker,at_s=1,duration_s=1): actor: a stop fault hits a "
            "process, not one of its actors"},
           {"kind=kill,target=worker:0,actor=shard,at_s=1",
            "actor: a worker has no actor 'shard' (worker, train-loader, test-loader, tables)"},
           {"kind=kill,target=ps:0,actor=loader,at_s=1", "actor: a ps has no actor 'loader' (shard, backup)"},
           {"kind=kill,target=ps:0,actor=backup,at_s=1", "actor: a parameter server holds a backup only with ps.replicas = 2"},
           {"kind=kill-actor,target=worker:0,at_step=3", "a kill-actor fault needs actor"},
           {"kind=kill,target=worker:0,actor=worker,at_step=3,duration_s=2", "duration_s: a kill fault has no duration"},
       }) {
    EXPECT_NE(refusal({k.spec}).find(k.expected), std::string::npos) << k.spec << " -> " << refusal({k.spec});
  }
}

// A slow fault holds back exactly its steps, by its delay or its factor.
TEST(FaultPlan, ASlowFaultHoldsBackItsStepsByItsDelayOrItsFactor) {
  const FaultPlan p = parseFaultPlan(
      configWith({"kind=slow,target=worker:0,delay_ms=25,at_step=10,steps=5", "kind=slow,target=worker:1,factor=3",
                  "kind=kill,target=worker:0,at_step=3"}),
      2, 2);
  const Fault& delay = p.faults[0];
  const Fault& factor = p.faults[1];
  std::vector<int64_t> slowed;
  for (int64_t step = 0; step < 30; ++step) {
    if (slowsStep(delay, step)) slowed.push_back(step);
  }
  EXPECT_EQ(slowed, (std::vector<int64_t>{10, 11, 12, 13, 14}));
  EXPECT_EQ(slowDelayOf(delay, 0.5), std::chrono::microseconds(25000)) << "a fixed delay, whatever the step took";
  EXPECT_TRUE(slowsStep(factor, 0)) << "from the first step, to the end";
  EXPECT_TRUE(slowsStep(factor, 1'000'000));
  EXPECT_EQ(slowDelayOf(factor, 0.010), std::chrono::microseconds(20000)) << "a 10 ms step takes 30 ms";
  EXPECT_EQ(slowDelayOf(factor, 1e9), std::chrono::microseconds(int64_t(2 * 3600 * 1e6))) << "an hour's step at most";
  EXPECT_FALSE(slowsStep(p.faults[2], 5)) << "a kill slows nothing";
}

TEST(FaultPlan, RefusesEachBadFieldNamingTheFaultAndTheField) {
  struct Case {
    std::string spec, expected;
  };
  for (const Case& c : std::vector<Case>{
           {"kind=kill,target=worker:1,at_stpe=3", "unknown field 'at_stpe'"},
           {"target=worker:1,at_step=3", "kind is missing"},
           {"kind=explode,target=worker:1,at_step=3", "kind: 'explode' is not a fault kind"},
           {"kind=drop,target=worker:1,at_step=3", "unknown field 'at_step' for a message fault"},
           {"kind=drop,from=worker:1,to=ps", "a drop fault needs p"},
           {"kind=drop,from=worker:1,p=0", "p: 0 must be more than 0"},
           {"kind=drop,from=worker:1,p=1.5", "p: 1.5 must be at most 1"},
           {"kind=drop,from=worker:7,p=0.1", "from: worker 7 is not in the job"},
           {"kind=drop,from=gardener,p=0.1", "from: 'gardener' is not worker[:RANK], ps[:RANK], coordinator or *"},
           {"kind=drop,target=ps:0,p=0.1", "target: a drop fault names its links with from and to"},
           {"kind=dup,from=*,p=0.1,delay_ms=3", "delay_ms: a dup fault takes no delay"},
           {"kind=delay,from=*,p=0.1", "a delay fault needs delay_ms"},
           {"kind=delay,from=*,p=0.1,delay_ms=30-2", "delay_ms: 2 is less than 30"},
           {"kind=delay,from=*,p=0.1,delay_ms=0", "delay_ms: a delay of 0 ms"},
           {"kind=corrupt,from=*,p=0.1,bits=0", "bits: 0 is less than 1"},
           {"kind=reorder,from=*,p=0.1,bits=2", "bits: a reorder fault flips no bits"},
           {"kind=partition,target=ps:1,duration_s=2,p=0.5", "p: a partition drops everything"},
           {"kind=partition,target=ps:1", "a partition needs duration_s"},
           {"kind=partition,duration_s=1", "a partition needs target"},
           {"kind=partition,target=*,duration_s=1", "target: a partition cuts one side off the rest"},
           {"kind=partition,target=ps:1,from=ps:0,duration_s=1", "target: give target or from, not both"},
           {"kind=drop,from=*,p=0.1,both_ways=maybe", "both_ways: true or false"},
           {"kind=kill,at_step=3", "target is missing"},
           {"kind=kill,target=gardener:1,at_step=3", "target: 'gardener:1' is not worker[:RANK] or ps[:RANK]"},
           {"kind=kill,target=worker:5,at_step=3", "target: worker 5 is not in the job (2 worker ranks: 0 to 1)"},
           {"kind=kill,target=worker:x,at_step=3", "target: 'x' is not an integer"},
           {"kind=kill,target=worker:-1,at_step=3", "target: -1 is less than 0"},
           {"kind=kill,target=worker:1", "exactly one of at_step, at_s and every_s"},
           {"kind=kill,target=worker:1,at_step=3,at_s=2", "exactly one of at_step, at_s and every_s"},
           {"kind=kill,target=worker:1,at_step=0", "at_step: 0 is less than 1"},
           {"kind=kill,target=worker:1,at_s=-2", "at_s: -2 must be at least 0"},
           {"kind=kill,target=worker:1,at_s=soon", "at_s: 'soon' is not a number"},
           {"kind=kill,target=worker:1,every_s=0", "every_s: 0 must be at least 0.1"},
           {"kind=kill,target=worker:1,every_s=1e-300", "every_s: 1e-300 must be at least 0.1"},
           {"kind=kill,target=worker:1,at_s=1e13", "at_s: 10000000000000 must be at most 604800"},
           {"kind=kill,target=worker:1,at_s=nan", "at_s: 'nan' is not a number"},
           {"kind=kill,target=worker:1,at_s=inf", "at_s: 'inf' is not a number"},
           {"kind=kill,target=worker:1,at_step=99999999999999999999", "at_step: '99999999999999999999' is not an integer we can hold"},
           {"kind=kill,target=worker:1,at_step=2000000000000", "at_step: 2000000000000 is more than 1000000000000"},
           {"kind=kill,target=worker:1,every_s=5,count=9999999", "count: 9999999 is more than 1000000"},
           {"kind=stop,target=worker:1,at_s=1,duration_s=1e9", "duration_s: 1000000000 must be at most 86400"},
           {"kind=stop,target=worker:1,at_s=1,duration_s=0.0001", "duration_s: 0.0001 must be at least 0.001"},
           {"kind=slow,target=worker:1,delay_ms=9223372036854775807", "delay_ms: 9223372036854775807 is more than 3600000"},
           {"kind=slow,target=worker:1,factor=1e300", "factor: 1e+300 must be at most 1000"},
           {"kind=slow,target=worker:1,factor=2,steps=-1", "steps: -1 is less than 0"},
           {"kind=kill,target=worker:1,at_step=3,", ""},  // a trailing comma is fine: see below
           {"kind=,target=worker:1,at_step=3", "kind: '' is not a fault kind"},
           {"kind=kill,target=ps:1,at_step=3,after_checkpoint=1", "after_checkpoint: it goes with at_s or every_s"},
           {"kind=kill,target=ps:1,at_s=3,after_checkpoint=0", "after_checkpoint: 0 is less than 1"},
           {"kind=kill,target=worker:1,at_s=1,count=2", "count: count goes with every_s"},
           {"kind=kill,target=ps:1,at_step=3", "at_step: only a worker has steps of its own"},
           {"kind=kill,target=worker:1,at_s=1,duration_s=2", "duration_s: a kill fault has no duration"},
           {"kind=stop,target=worker:1,at_s=1", "a stop fault needs duration_s"},
           {"kind=stop,target=worker:1,at_s=1,duration_s=0", "duration_s: 0 must be at least 0.001"},
           {"kind=kill,target=worker:1,at_s=1,factor=2", "factor: a kill fault takes no such field"},
           {"kind=slow,target=worker:1", "a slow fault takes one of factor and delay_ms"},
           {"kind=slow,target=worker:1,factor=2,delay_ms=3", "a slow fault takes one of factor and delay_ms"},
           {"kind=slow,target=worker:1,factor=1", "factor: 1 must be more than 1"},
           {"kind=slow,target=ps:1,factor=2", "target: only a worker is slowed"},
           {"kind=slow,target=worker:1,factor=2,at_s=3", "at_s: a slow fault starts at a step"},
           {"kind=kill,kind=stop,target=worker:1,at_s=1", "kind is given twice"},
           {"kind=kill,target=worker:1,at_s", "'at_s' is not field=value"},
       }) {
    SCOPED_TRACE(c.spec);
    const std::string why = refusal({"kind=kill,target=worker:0,at_step=1", c.spec});
    if (c.expected.empty()) {
      EXPECT_EQ(why, "");
      continue;
    }
    EXPECT_NE(why.find("fault 2 (" + c.spec + ")"), std::string::npos) << why;
    EXPECT_NE(why.find(c.expected), std::string::npos) << why;
  }
  EXPECT_NE(refusal({"kind=kill,target=ps:0,at_s=1"}, 2, 0).find("the job has no parameter-server process"),
            std::string::npos);
}

TEST(FaultPlan, AStepFaultWithoutARankGetsOneFromTheSeedTheSameEverywhere) {
  std::set<int64_t> ranks;
  for (int64_t seed = 1; seed <= 20; ++seed) {
    const auto a = parseFaultPlan(configWith({"kind=kill,target=worker,at_step=5"}, seed), 4, 0);
    const auto b = parseFaultPlan(configWith({"kind=kill,target=worker:*,at_step=5"}, seed), 4, 0);
    ASSERT_EQ(a.faults.size(), 1u);
    EXPECT_EQ(a.faults[0].rank, b.faults[0].rank);
    EXPECT_GE(a.faults[0].rank, 0);
    EXPECT_LT(a.faults[0].rank, 4);
    ranks.insert(a.faults[0].rank);
  }
  EXPECT_GT(ranks.size(), 2u) << "twenty seeds draw more than two of four ranks";
}

TEST(FaultPlan, TomlTablesAreThePlanAndTheResolvedConfigKeepsIt) {
  Config c(troupeConfigSchema());
  c.loadString(R"([[faults]]
kind = "kill"
target = "worker:1"
at_step = 40

[[faults]]
kind = "stop"
target = "ps:0"
at_s = 2.5
duration_s = 8
)",
               "plan.toml");
  EXPECT_EQ(c.getStringList("faults.plan"),
            (std::vector<std::string>{"at_step=40,kind=kill,target=worker:1", "at_s=2.5,duration_s=8,kind=stop,target=ps:0"}));
  // With a seed: [faults] and [[faults.plan]].
  Config d(troupeConfigSchema());
  d.loadString("[faults]\nseed = 9\n[[faults.plan]]\nkind = \"kill\"\ntarget = \"worker:0\"\nat_s = 1\n", "seeded.toml");
  EXPECT_EQ(d.getInt("faults.seed"), 9);
  EXPECT_EQ(d.getStringList("faults.plan"), (std::vector<std::string>{"at_s=1,kind=kill,target=worker:0"}));
  // What a run directory keeps (and every process of the job reads) is the same plan.
  d.append("faults.plan", "kind=slow,target=worker:1,factor=2.5");
  Config e(troupeConfigSchema());
  e.loadString(d.toToml(), "config.toml");
  EXPECT_EQ(e.getStringList("faults.plan"), d.getStringList("faults.plan"));
  EXPECT_EQ(e.getInt("faults.seed"), 9);
  const auto plan = parseFaultPlan(e, 2, 1);
  ASSERT_EQ(plan.faults.size(), 2u);
  EXPECT_DOUBLE_EQ(plan.faults[1].factor, 2.5);
}

TEST(FaultPlan, ATomlPlanWithABadItemIsRefusedNamingTheLine) {
  auto refusalOf = [](const std::string& toml) -> std::string {
    Config c(troupeConfigSchema());
    try {
      c.loadString(toml, "plan.toml");
    } catch (const SetupError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(refusalOf("[[faults]]\nkind = \"kill\"\nwhen = [1, 2]\n").find("plan.toml:1: faults.plan item 1: 'when' must be "
                                                                           "a string or a number, got an array"),
            std::string::npos)
      << refusalOf("[[faults]]\nkind = \"kill\"\nwhen = [1, 2]\n");
  EXPECT_NE(refusalOf("[[faults]]\nkind = \"kill\"\ntarget = \"a,b\"\n").find("'target' must not hold ',' or '='"),
            std::string::npos);
  EXPECT_NE(refusalOf("[faults]\nplan = [1]\n").find("'faults.plan' must be a list of strings or of tables"),
            std::string::npos);
  Config c(troupeConfigSchema());
  try {
    c.set("faults.plan=kind=kill");
    ADD_FAILURE() << "--set took a list of strings";
  } catch (const SetupError& e) {
    EXPECT_NE(std::string(e.what()).find("give each fault with --fault SPEC"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace troupe::actors
