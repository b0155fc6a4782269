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

}  // namespace
}  // namespace troupe::workers
