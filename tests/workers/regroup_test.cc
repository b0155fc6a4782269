// Where a synchronous group formed again goes on from (workers/regroup.h):
// the cases a lost rank can leave behind, each decided by hand here.
#include "workers/regroup.h"

#include <gtest/gtest.h>

namespace troupe::workers {
namespace {

Standing survivor(int64_t steps, int64_t epochSteps, int64_t samples, bool kept = false, int64_t prevSamples = 0) {
  Standing s;
  s.steps = steps;
  s.epoch = 1;
  s.epochSteps = epochSteps;
  s.samples = samples;
  s.canRevert = kept ? 1 : 0;
  s.previousSamples = prevSamples;
  return s;
}

Standing replacement(int64_t shardClock = -1) {
  Standing s;
  s.shardClock = shardClock;
  return s;
}

TEST(PlanRegroup, AllreduceTakesTheFurthestSurvivorAndItsPlace) {
  // Rank 2 finished step 10 (every rank's gradient was in it) before rank 1
  // was lost; rank 0 failed inside that step's collective.
  auto p = planRegroup({survivor(10, 4, 2560), replacement(), survivor(11, 5, 2816)}, false);
  ASSERT_TRUE(p.hasValue()) << p.status().message();
  EXPECT_EQ(p->step, 11);
  EXPECT_EQ(p->source, 2);
  EXPECT_EQ(p->epoch, 1);
  EXPECT_EQ(p->epochSteps, 5);
  EXPECT_EQ(p->samples, 2816);
}

TEST(PlanRegroup, AllreduceWithSurvivorsAlikeCopiesFromTheLowest) {
  auto p = planRegroup({replacement(), survivor(7, 7, 1792), survivor(7, 7, 1792)}, false);
  ASSERT_TRUE(p.hasValue());
  EXPECT_EQ(p->step, 7);
  EXPECT_EQ(p->source, 1);
}

TEST(PlanRegroup, HybridGoesBackToTheLeastAndToWhatTheShardsHaveOfTheLostRank) {
  // Both survivors finished step 20; the lost rank's push of step 20 never
  // reached the shards (clock 20): both go back one step, from their copies.
  auto p = planRegroup({survivor(21, 3, 5376, true, 5120), survivor(21, 3, 5376, true, 5120), replacement(20)}, true);
  ASSERT_TRUE(p.hasValue()) << p.status().message();
  EXPECT_EQ(p->step, 20);
  EXPECT_EQ(p->source, 0);
  EXPECT_EQ(p->epochSteps, 2);
  EXPECT_EQ(p->samples, 5120);
  // The shards have more of the lost rank than the survivors took: the least survivor counts.
  p = planRegroup({survivor(21, 3, 5376, true, 5120), survivor(20, 2, 5120), replacement(21)}, true);
  ASSERT_TRUE(p.hasValue());
  EXPECT_EQ(p->step, 20);
  EXPECT_EQ(p->source, 0);  // rank 0 goes back to step 20 and is the lowest survivor
  EXPECT_EQ(p->epochSteps, 2);
  EXPECT_EQ(p->samples, 5120);
}

TEST(PlanRegroup, AHybridGroupWithoutTheLostRankGoesBackToWhereTheShardsWent) {
  // Shrink: no replacement; the shards undid every step from 11 (the lost
  // rank's step 11 was at some of them), and every survivor carries that.
  Standing a = survivor(12, 6, 3072, true, 2816), b = survivor(11, 5, 2816);
  a.shardClock = b.shardClock = 11;
  auto p = planRegroup({a, b}, true);
  ASSERT_TRUE(p.hasValue()) << p.status().message();
  EXPECT_EQ(p->step, 11);
  EXPECT_EQ(p->source, 0);
  EXPECT_EQ(p->epochSteps, 5) << "rank 0 goes back a step, from the copy it kept";
  EXPECT_EQ(p->samples, 2816);
  // Two steps back cannot be done.
  a.shardClock = b.shardClock = 10;
  EXPECT_FALSE(planRegroup({a, b}, true).hasValue());
}

TEST(PlanRegroup, RefusesWhatCannotBeDoneSayingWhy) {
  auto p = planRegroup({replacement(), replacement()}, false);
  ASSERT_FALSE(p.hasValue());
  EXPECT_NE(p.status().message().find("no rank of the group holds the model"), std::string::npos);
  // Two steps back.
  p = planRegroup({survivor(22, 4, 0, true), replacement(20)}, true);
  ASSERT_FALSE(p.hasValue());
  EXPECT_NE(p.status().message().find("rank 0 took 22 steps"), std::string::npos) << p.status().message();
  // One step back without the copy, or across an epoch's start.
  EXPECT_FALSE(planRegroup({survivor(21, 4, 0, false), replacement(20)}, true).hasValue());
  EXPECT_FALSE(planRegroup({survivor(21, 0, 0, true), replacement(20)}, true).hasValue());
}

// Where in its epoch the group goes on: the batches the steps took under
// the division the group trained by (from its first batch, in its epoch).
TEST(PlanRegroup, SaysWhichBatchOfTheEpochTheGroupGoesOnFrom) {
  Standing a = survivor(50, 5, 0), b = survivor(50, 5, 0);
  for (Standing* x : {&a, &b}) {
    x->divisionEpoch = 1;
    x->divisionFrom = 30;  // a group of 3 divided epoch 1 from its batch 30 on
    x->divisionParts = 3;
  }
  auto p = planRegroup({a, b}, false);
  ASSERT_TRUE(p.hasValue());
  EXPECT_EQ(p->epochBatch, 30 + 5 * 3);
  // In a later epoch the division holds from batch 0.
  a.epoch = b.epoch = 2;
  p = planRegroup({a, b}, false);
  ASSERT_TRUE(p.hasValue());
  EXPECT_EQ(p->epochBatch, 5 * 3);
  // Hybrid going back a step goes back a round of batches.
  a.epoch = b.epoch = 1;
  a.steps = 51;
  a.epochSteps = 6;
  a.canRevert = 1;
  p = planRegroup({a, b}, true);
  ASSERT_TRUE(p.hasValue());
  EXPECT_EQ(p->step, 50);
  EXPECT_EQ(p->epochBatch, 30 + 5 * 3);
}

// The ledger's expected samples, worked by hand: 40000 rows in batches of
// 128 are 313 batches, the last of 64 rows (312 x 128 = 39936).
TEST(SyncSamples, WholeStepsOfEveryDivision) {
  EXPECT_EQ(syncSamples(40000, 128, 1, {{0, 0, 2}}), 39936);  // 156 steps of 2; batch 312 left over
  EXPECT_EQ(syncSamples(40000, 128, 1, {{0, 0, 1}}), 40000);
  EXPECT_EQ(syncSamples(40000, 128, 1, {{0, 0, 3}}), 39936);  // 104 steps of 3
  // A group of 3 lost a rank after 42 steps (126 batches); 2 divide the 187
  // left: 93 steps (186 batches), the last batch left over.
  EXPECT_EQ(syncSamples(40000, 128, 1, {{0, 0, 3}, {0, 126, 2}}), 39936);
  // A group of 2 shrank to 1 after 44 steps: every batch, once.
  EXPECT_EQ(syncSamples(40000, 128, 1, {{0, 0, 2}, {0, 88, 1}}), 40000);
  // The second epoch by the last division: 156 steps of 2.
  EXPECT_EQ(syncSamples(40000, 128, 2, {{0, 0, 3}, {0, 126, 2}}), 39936 + 39936);
  // 950 rows in 10 batches of 100 (the last of 50).
  EXPECT_EQ(syncSamples(950, 100, 1, {{0, 0, 3}}), 900);
  EXPECT_EQ(syncSamples(950, 100, 1, {{0, 0, 3}, {0, 3, 1}}), 950);
  // A division made in epoch 1 (a resumed job's): epoch 0 by the job's, then
  // 3 batches by 3 and 7 by 2 (6 of them: batches 3-8).
  EXPECT_EQ(syncSamples(950, 100, 2, {{0, 0, 3}, {1, 3, 2}}), 900 + 300 + 600);
  // A group formed again at the same place replaces the division there.
  EXPECT_EQ(syncSamples(950, 100, 1, {{0, 0, 3}, {0, 0, 2}}), 950);
  EXPECT_EQ(syncSamples(950, 100, 0, {{0, 0, 3}}), 0);
}

}  // namespace
}  // namespace troupe::workers
