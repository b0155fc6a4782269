// The fault report (workers/fault_report.h): which loss each injected
// fault caused, by the rules a user reads in the report's header, and the
// counts and ledger built from them. The job's record is written by hand.
#include "workers/fault_report.h"

#include <cstdlib>

#include <gtest/gtest.h>

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
  o.shards = {ShardSummary{0, 0, 10, 2, 0, 0, 0, 100}, ShardSummary{1, 0, 10, 1, 0, 0, 0, 100}};
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
  // Per kind: kill, stop, slow.
  ASSERT_EQ(r.rows.size(), 3u);
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
  EXPECT_TRUE(r.ledgerExact);
  EXPECT_EQ(r.duplicatesSuppressed, 3);
  EXPECT_EQ(r.samplesApplied, (std::vector<int64_t>{100, 100}));
  o.shards[1].samplesApplied = 99;
  EXPECT_FALSE(faultReport(o).ledgerExact);
  const std::string table = faultReportTable(faultReport(o));
  EXPECT_NE(table.find("NOT EXACT"), std::string::npos) << table;
  const std::string json = faultReportJson(r);
  const std::string killRow = json.substr(json.find("{\"kind\": \"kill\""));
  EXPECT_EQ(killRow.rfind("{\"kind\": \"kill\", \"injected\": 2, \"skipped\": 1, \"unfired\": 1, \"detected\": 1, "
                          "\"recovered\": 1, \"detect_s_p50\": ",
                          0),
            0u)
      << json;
  const size_t p50 = killRow.find("\"detect_s_p50\": ") + 16;
  EXPECT_NEAR(std::strtod(killRow.c_str() + p50, nullptr), 0.05, 1e-9) << json;
  EXPECT_NE(json.find("\"test_auc\": null"), std::string::npos) << "not evaluated: no AUC " << json;
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
  EXPECT_TRUE(r.ledgerExact) << "allreduce: the group's count";
  EXPECT_EQ(r.samplesApplied, std::vector<int64_t>{7});
}

}  // namespace
}  // namespace troupe::workers
