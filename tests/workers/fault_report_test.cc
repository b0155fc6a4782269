// The fault report (workers/fault_report.h): which loss each injected
// fault caused, by the rules a user reads in the report's header, and the
// counts and ledger built from them. The job's record is written by hand.
#include "workers/fault_report.h"

#include <algorithm>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace troupe::workers {
namespace {

actors::Fault fault(int64_t id, actors::FaultKind kind, double duration = 0) {
  actors::Fault f;
  f.id = id;
  f.kind = kind;
  f.durationSeconds = duration;
  return f;
}

actors::Injection hit(int64_t fault, actors::FaultKind kind, const std::string& role, int64_t rank,
                      int64_t incarnation, double at, bool skipped = false) {
  actors::Injection in;
  in.fault = fault;
  in.kind = kind;
  in.role = role;
  in.rank = rank;
  in.incarnation = incarnation;
  in.atSeconds = at;
  in.skipped = skipped;
  return in;
}

actors::RecoveryEvent loss(const std::string& role, int64_t rank, int64_t incarnation, double at, double recovered,
                           const std::string& cause) {
  actors::RecoveryEvent e;
  e.what = role + " lost";
  e.detectedBy = cause;
  e.cause = cause;
  e.lostAtSeconds = at;
  e.action = "replaced";
  e.recoveredAtSeconds = recovered;
  e.role = role;
  e.rank = rank;
  e.incarnation = incarnation;
  return e;
}

using K = actors::FaultKind;

TEST(FaultReport, EachLossGoesToTheLatestFaultOnItsProcessThatCouldHaveCausedIt) {
  JobOutcome o;
  o.ok = true;
  o.faultPlan.detectWithinSeconds = 7;
  o.faultPlan.faults = {fault(1, K::kStop, 0.5), fault(2, K::kKill), fault(3, K::kStop, 8), fault(4, K::kSlow),
                        fault(5, K::kKill), fault(6, K::kKill), fault(7, K::kKill)};
  o.injections = {
      hit(1, K::kStop, "worker", 1, 0, 1.0),   // short: back before anyone noticed
      hit(2, K::kKill, "worker", 1, 0, 2.0),   // the loss at 2.05 is this kill's
      hit(3, K::kStop, "ps", 0, 0, 4.0),       // found at 7.0
      hit(4, K::kSlow, "worker", 0, 0, 0.5),   // worker 0 stopped for ps 0's rollback: not found
      hit(5, K::kKill, "worker", 1, 1, 9.0),   // the replacement: found 20 s later, too late to be this kill
      hit(6, K::kKill, "worker", 0, 5, 3.0, true),  // no running process then
      hit(3, K::kStop, "ps", 1, 0, 4.0),       // ps 1 failed while stopped: not the stop's doing
  };
  o.events = {
      loss("worker", 1, 0, 2.05, 2.5, "crashed"),
      loss("ps", 0, 0, 7.0, 8.0, "timed out"),
      loss("worker", 0, 0, 7.0, 8.2, "rolled back"),
      loss("worker", 1, 1, 29.0, -1, "failed"),
      loss("ps", 1, 0, 5.0, 6.0, "failed"),
  };
  o.expectedSamples = 100;
  o.shards = {ShardSummary{0, 0, 10, 2, 0, 0, 0, 100, {}}, ShardSummary{1, 0, 10, 1, 0, 0, 0, 100, {}}};
  const FaultReport r = faultReport(o);
  ASSERT_EQ(r.hits.size(), 7u);
  EXPECT_FALSE(r.hits[0].detected);
  EXPECT_TRUE(r.hits[1].detected);
  EXPECT_NEAR(r.hits[1].detectSeconds, 0.05, 1e-9);
  EXPECT_NEAR(r.hits[1].recoverSeconds, 0.45, 1e-9);
  EXPECT_EQ(r.hits[1].detectedBy, "crashed");
  EXPECT_TRUE(r.hits[2].detected);
  EXPECT_NEAR(r.hits[2].detectSeconds, 3.0, 1e-9);
  EXPECT_FALSE(r.hits[3].detected) << "a rollback's stop is not the slow fault found";
  EXPECT_FALSE(r.hits[4].detected) << "20 s after a kill is no longer its loss";
  EXPECT_FALSE(r.hits[5].detected);
  EXPECT_FALSE(r.hits[6].detected) << "a stop is found by silence, not by a reported failure";
  // Per kind: kill, stop, slow, kill-actor.
  ASSERT_EQ(r.rows.size(), 4u);
  EXPECT_EQ(r.rows[3].kind, "kill-actor");
  EXPECT_EQ(r.rows[0].kind, "kill");
  EXPECT_EQ(r.rows[0].injected, 2);
  EXPECT_EQ(r.rows[0].skipped, 1);
  EXPECT_EQ(r.rows[0].unfired, 1) << "fault 7 never fired";
  EXPECT_EQ(r.rows[0].detected, 1);
  EXPECT_EQ(r.rows[0].recovered, 1);
  EXPECT_EQ(r.rows[1].injected, 3);
  EXPECT_EQ(r.rows[1].detected, 1);
  EXPECT_EQ(r.rows[1].recovered, 1);
  EXPECT_EQ(r.rows[2].injected, 1);
  EXPECT_EQ(r.rows[2].detected, 0);
  // The ledger.
  EXPECT_TRUE(r.ledger.exact);
  EXPECT_EQ(r.duplicatesSuppressed, 3);
  EXPECT_EQ(r.ledger.samplesApplied, (std::vector<int64_t>{100, 100}));
  o.shards[1].samplesApplied = 99;
  EXPECT_FALSE(faultReport(o).ledger.exact);
  const std::string table = faultReportTable(faultReport(o));
  EXPECT_NE(table.find("NOT EXACT"), std::string::npos) << table;
  const std::string json = faultReportJson(r);
  const auto report = nlohmann::json::parse(json);
  const auto& killRow = report.at("kinds").at(0);
  EXPECT_EQ(killRow.at("kind"), "kill") << json;
  EXPECT_EQ(killRow.at("injected"), 2) << json;
  EXPECT_EQ(killRow.at("skipped"), 1) << json;
  EXPECT_EQ(killRow.at("unfired"), 1) << json;
  EXPECT_EQ(killRow.at("detected"), 1) << json;
  EXPECT_EQ(killRow.at("recovered"), 1) << json;
  EXPECT_NEAR(killRow.at("detect_s_p50").get<double>(), 0.05, 1e-9) << json;
  EXPECT_TRUE(report.at("test_auc").is_null()) << "not evaluated: no AUC " << json;
}

TEST(FaultReport, TheSameFaultTwiceOnAProcessIsFoundOnceAndASlowWorkerFoundHungIsFound) {
  JobOutcome o;
  o.faultPlan.faults = {fault(1, K::kSlow), fault(2, K::kKill)};
  o.injections = {hit(1, K::kSlow, "worker", 0, 0, 0.1), hit(2, K::kKill, "worker", 1, 0, 5.0),
                  hit(2, K::kKill, "worker", 1, 1, 9.0)};
  o.events = {loss("worker", 0, 0, 40.0, 41.0, "hung"), loss("worker", 1, 0, 5.01, 5.5, "crashed"),
              loss("worker", 1, 1, 9.02, 9.6, "crashed")};
  o.samplesApplied = 7;
  o.expectedSamples = 7;
  const FaultReport r = faultReport(o);
  EXPECT_TRUE(r.hits[0].detected);
  EXPECT_NEAR(r.hits[0].detectSeconds, 39.9, 1e-9);
  EXPECT_TRUE(r.hits[1].detected);
  EXPECT_TRUE(r.hits[2].detected);
  EXPECT_EQ(r.rows[0].detected, 2);
  EXPECT_NEAR(percentile(r.rows[0].detectSeconds, 50), 0.015, 1e-9);
  EXPECT_NEAR(percentile(r.rows[0].recoverSeconds, 100), 0.58, 1e-9);
  EXPECT_EQ(r.rows[0].unfired, 0) << "fired twice";
  EXPECT_TRUE(r.ledger.exact) << "allreduce: the group's count";
  EXPECT_EQ(r.ledger.samplesApplied, std::vector<int64_t>{7});
  EXPECT_TRUE(r.ledger.pushesInState.empty()) << "no shards, no pushes to count";
}

// The pushes: per shard, the distinct pushes of the ranks that reported,
// in the shard's state, against the pushes those ranks were acknowledged.
TEST(FaultReport, ThePushLedgerSetsWhatWasAcknowledgedAgainstEachShardsStateRankByRank) {
  JobOutcome o;
  o.ok = true;
  o.expectedSamples = 100;
  o.workers.resize(3);
  for (int64_t w = 0; w < 3; ++w) o.workers[size_t(w)].rank = w;
  o.workers[0].pushesAcknowledged = 30;
  o.workers[1].pushesAcknowledged = 25;
  o.workers[2].pushesAcknowledged = -1;  // no process of it reported: the group went on without it
  ShardSummary a{0, 0, 10, 2, 0, 0, 0, 100, {30, 25, 7}};
  ShardSummary b{1, 0, 10, 0, 0, 0, 0, 100, {30, 25, 9}};
  o.shards = {a, b};
  FaultReport r = faultReport(o);
  EXPECT_TRUE(r.ledger.exact);
  EXPECT_EQ(r.ledger.pushesAcknowledged, 55);
  EXPECT_EQ(r.ledger.pushesInState, (std::vector<int64_t>{55, 55}));
  EXPECT_EQ(r.ledger.ranksNotCounted, std::vector<int64_t>{2});
  EXPECT_EQ(r.ledger.duplicatesSuppressed, 2);
  std::string table = faultReportTable(r);
  EXPECT_NE(table.find("pushes acknowledged 55, in the shards' state 55, 55 (worker ranks 2 not counted"),
            std::string::npos)
      << table;
  const auto ledger = nlohmann::json::parse(faultReportJson(r)).at("ledger");
  EXPECT_EQ(ledger.at("pushes_acknowledged"), 55) << ledger.dump();
  EXPECT_EQ(ledger.at("pushes_in_state"), nlohmann::json::array({55, 55})) << ledger.dump();
  EXPECT_EQ(ledger.at("ranks_not_counted"), nlohmann::json::array({2})) << ledger.dump();
  EXPECT_EQ(ledger.at("exact"), true) << ledger.dump();
  // Shard 1 lost a push worker 1 was acknowledged.
  o.shards[1].pushesByWorker = {30, 24, 9};
  r = faultReport(o);
  EXPECT_FALSE(r.ledger.exact);
  EXPECT_EQ(r.ledger.pushesInState, (std::vector<int64_t>{55, 54}));
  table = faultReportTable(r);
  EXPECT_NE(table.find("NOT EXACT"), std::string::npos) << table;
  // A shard that holds a push no worker was acknowledged (applied, its
  // acknowledgement lost with the process, and never redone) is not exact either.
  o.shards[1].pushesByWorker = {31, 25, 9};
  EXPECT_FALSE(faultReport(o).ledger.exact);
}

// A killed actor is found when its process reports the failure (not by a
// crash: the process itself lives on until it reports).
TEST(FaultReport, AKilledActorIsFoundByTheFailureItsProcessReports) {
  JobOutcome o;
  o.ok = true;
  o.faultPlan.detectWithinSeconds = 4;
  o.faultPlan.faults = {fault(1, K::kKillActor), fault(2, K::kKillActor)};
  o.injections = {hit(1, K::kKillActor, "worker", 1, 0, 3.0), hit(2, K::kKillActor, "ps", 0, 0, 5.0)};
  o.injections[0].actor = "train-loader";
  o.events = {loss("worker", 1, 0, 3.02, 3.4, "failed"), loss("ps", 0, 0, 5.01, 5.3, "crashed")};
  const FaultReport r = faultReport(o);
  EXPECT_TRUE(r.hits[0].detected);
  EXPECT_NEAR(r.hits[0].detectSeconds, 0.02, 1e-9);
  EXPECT_NEAR(r.hits[0].recoverSeconds, 0.38, 1e-9);
  EXPECT_EQ(r.hits[0].target, "worker 1 (train-loader)");
  EXPECT_FALSE(r.hits[1].detected) << "a crash is not what an actor's death looks like";
  EXPECT_EQ(r.rows[3].kind, "kill-actor");
  EXPECT_EQ(r.rows[3].injected, 2);
  EXPECT_EQ(r.rows[3].detected, 1);
}

// Message faults: a row per kind of the plan with the frames the processes'
// filters hit, added up; a partition is detected when the job lost the
// process cut off by its silence while it lasted; what the links did.
TEST(FaultReport, MessageFaultsAreCountedPerKindAndAPartitionIsFoundByTheLossOfTheProcessCutOff) {
  JobOutcome o;
  o.ok = true;
  o.faultPlan.detectWithinSeconds = 4;
  auto message = [](int64_t id, transport::LinkFaultKind kind, const std::string& from, double start, double end) {
    actors::MessageFault m;
    m.id = id;
    m.rule.kind = kind;
    m.rule.from = from;
    m.rule.startSeconds = start;
    m.rule.endSeconds = end;
    return m;
  };
  using LK = transport::LinkFaultKind;
  o.faultPlan.messages = {message(1, LK::kDrop, "worker", 0, 1e18), message(2, LK::kCorrupt, "*", 0, 1e18),
                          message(3, LK::kPartition, "worker:1", 2, 5), message(4, LK::kPartition, "ps:0", 6, 8),
                          message(5, LK::kPartition, "ps:1", 30, 31)};
  o.endedAtSeconds = 20;
  actors::LinkCounts a, b;
  a.role = "worker";
  a.dropped = 7;
  a.corrupted = 2;
  a.resent = 9;
  a.partitioned = 40;
  b.role = "ps";
  b.dropped = 3;
  b.duplicatesSuppressed = 1;
  b.malformedRefused = 2;
  o.links = {a, b};
  // Worker 1 timed out 3 s into its partition; ps 0 was never lost (its
  // cut was shorter than the heartbeat timeout); a worker 1 crash long
  // after is not the partition's.
  o.events = {loss("worker", 1, 0, 5.0, 5.6, "timed out"), loss("worker", 1, 1, 12.0, 12.5, "crashed")};
  const FaultReport r = faultReport(o);
  ASSERT_EQ(r.rows.size(), 7u) << "kill, stop, slow, kill-actor, then drop, corrupt, partition";
  EXPECT_EQ(r.rows[4].kind, "drop");
  EXPECT_EQ(r.rows[4].injected, 10);
  EXPECT_FALSE(r.rows[4].detects);
  EXPECT_EQ(r.rows[5].kind, "corrupt");
  EXPECT_EQ(r.rows[5].injected, 2);
  const auto& partition = r.rows[6];
  EXPECT_EQ(partition.kind, "partition");
  EXPECT_TRUE(partition.detects);
  EXPECT_EQ(partition.injected, 2) << "the third opens after the job ended";
  EXPECT_EQ(partition.unfired, 1);
  EXPECT_EQ(partition.detected, 1);
  EXPECT_EQ(partition.recovered, 1);
  ASSERT_EQ(r.partitions.size(), 3u);
  EXPECT_TRUE(r.partitions[0].detected);
  EXPECT_NEAR(r.partitions[0].detectSeconds, 3.0, 1e-9);
  EXPECT_NEAR(r.partitions[0].recoverSeconds, 0.6, 1e-9);
  EXPECT_FALSE(r.partitions[1].detected);
  EXPECT_FALSE(r.partitions[2].opened);
  EXPECT_EQ(r.linkProcesses, 2);
  EXPECT_EQ(r.links.resent, 9);
  EXPECT_EQ(r.links.malformedRefused, 2);
  const std::string table = faultReportTable(r);
  EXPECT_NE(table.find("  drop             10        0        0         -         -"), std::string::npos) << table;
  EXPECT_NE(table.find("links (2 processes' counts): 9 frames sent again, 1 duplicates suppressed"), std::string::npos)
      << table;
  const std::string json = faultReportJson(r);
  const auto report = nlohmann::json::parse(json);
  const auto& kinds = report.at("kinds");
  const auto drop = std::find_if(kinds.begin(), kinds.end(), [](const auto& k) { return k.at("kind") == "drop"; });
  ASSERT_NE(drop, kinds.end()) << json;
  EXPECT_EQ(drop->at("injected"), 10) << json;
  EXPECT_EQ(drop->at("skipped"), 0) << json;
  EXPECT_EQ(drop->at("unfired"), 0) << json;
  EXPECT_TRUE(drop->at("detected").is_null()) << json;
  EXPECT_TRUE(drop->at("recovered").is_null()) << json;
  const auto& links = report.at("links");
  EXPECT_EQ(links.at("processes"), 2) << json;
  EXPECT_EQ(links.at("dropped"), 10) << json;
  EXPECT_EQ(links.at("duplicated"), 0) << json;
  EXPECT_EQ(links.at("delayed"), 0) << json;
  EXPECT_EQ(links.at("reordered"), 0) << json;
  EXPECT_EQ(links.at("corrupted"), 2) << json;
  EXPECT_EQ(links.at("cut_by_partitions"), 40) << json;
  EXPECT_EQ(links.at("sent_again"), 9) << json;
}

}  // namespace
}  // namespace troupe::workers
