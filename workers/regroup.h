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
  int64_t shardClock = -1;            // hybrid: a replacement's rank's first step the shards lack, or
                                      // the step the shards went back to (a group without a lost rank)
  // The division of the data its group trains by (DataDivision): from
  // batch divisionFrom of epoch divisionEpoch, one batch of every
  // divisionParts per rank (a replacement: parts 0, none).
  int64_t divisionEpoch = 0, divisionFrom = 0, divisionParts = 0;
};
static_assert(sizeof(Standing) == 10 * sizeof(int64_t));

struct RegroupPlan {
  int64_t step = 0;        // every rank goes on from here (redoes step `step`)
  int source = 0;          // the rank whose model every other copies
  int64_t epoch = 0, epochSteps = 0, samples = 0;  // the source's place at `step`
  int64_t epochBatch = 0;  // batches of `epoch` the steps up to `step` took (the group divides the rest)
};

// How a sync group divides an epoch's batches: from batch `fromBatch` of
// `epoch` on (and in later epochs from batch 0), rank r takes batches
// fromBatch + r, fromBatch + r + parts, ...; a step takes one of every rank.
// A job starts with {0, 0, W}; a group formed again divides what is left of
// the epoch among its ranks.
struct DataDivision {
  int64_t epoch = 0, fromBatch = 0, parts = 1;
  // The batches of `inEpoch` taken once a group under this division took
  // `steps` steps of it.
  int64_t batchesTaken(int64_t inEpoch, int64_t steps) const {
    return (inEpoch == epoch ? fromBatch : 0) + steps * (parts < 1 ? 1 : parts);
  }
};

// The samples a sync job applies when it trains `epochs` epochs of `rows`
// rows in batches of `batch` by these divisions (in order; each new one
// starts where the steps under the one before ended): whole steps only (the
// batches left over at the end of an epoch, fewer than the group's ranks,
// are not trained).
int64_t syncSamples(int64_t rows, int64_t batch, int64_t epochs, const std::vector<DataDivision>& divisions);

// allreduce mode (backToLeast false): the furthest a survivor got (a step
// some survivor finished had every rank's gradient in it), from the lowest
// survivor there. hybrid mode (true): the least a survivor got, and no
// further than any rank's shardClock (every push of the steps before is
// at the shards); a survivor one step further goes back (it must have
// kept the copy, within its epoch), from the lowest survivor. Fails, saying
// why, when no rank holds the model or a survivor would have to go back
// further.
Expected<RegroupPlan> planRegroup(const std::vector<Standing>& all, bool backToLeast);

}  // namespace troupe::workers
