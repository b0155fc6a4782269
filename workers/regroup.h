// How a synchronous group formed again after a lost rank decides where it
// goes on from (workers/worker_actor.h): every rank says where it stands,
// all gather the same list, and each decides alike with planRegroup.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"

namespace troupe::workers {

// What a rank says of itself when its group forms again (a fixed layout: it
// crosses the group as bytes).
struct Standing {
  int64_t steps = -1;  // steps taken; -1: a replacement, which has no model
  int64_t epoch = 0, epochSteps = 0;  // where in its share of the data
  int64_t samples = 0;                // samples applied (the ledger)
  int64_t canRevert = 0;              // it kept the dense state from before its last step
  int64_t previousSamples = 0;        // samples applied before its last step
  int64_t shardClock = -1;            // hybrid replacement: its rank's first step the shards lack
};
static_assert(sizeof(Standing) == 7 * sizeof(int64_t));

struct RegroupPlan {
  int64_t step = 0;        // every rank goes on from here (redoes step `step`)
  int source = 0;          // the rank whose model every other copies
  int64_t epoch = 0, epochSteps = 0, samples = 0;  // the source's place at `step`
};

// allreduce mode (backToLeast false): the furthest a survivor got (a step
// some survivor finished had every rank's gradient in it), from the lowest
// survivor there. hybrid mode (true): the least a survivor got, and no
// further than a replacement's shardClock (every push of the steps before
// is at the shards); a survivor one step further goes back (it must have
// kept the copy, within its epoch), from the lowest survivor. Fails, saying
// why, when no rank holds the model or a survivor would have to go back
// further.
Expected<RegroupPlan> planRegroup(const std::vector<Standing>& all, bool backToLeast);

}  // namespace troupe::workers
