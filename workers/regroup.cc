#include "workers/regroup.h"

#include <algorithm>

#include <fmt/format.h>

namespace troupe::workers {

Expected<RegroupPlan> planRegroup(const std::vector<Standing>& all, bool backToLeast) {
  int64_t at = -1;
  int source = -1;
  for (int q = 0; q < int(all.size()); ++q) {
    const Standing& x = all[size_t(q)];
    if (x.steps < 0) continue;
    if (source < 0) source = q;
    at = at < 0 ? x.steps : (backToLeast ? std::min(at, x.steps) : std::max(at, x.steps));
  }
  if (source < 0) return Status::internal("no rank of the group holds the model (every worker was lost)");
  if (backToLeast) {
    for (const auto& x : all) {
      if (x.steps < 0 && x.shardClock >= 0) at = std::min(at, x.shardClock);
    }
    for (int q = 0; q < int(all.size()); ++q) {
      const Standing& x = all[size_t(q)];
      if (x.steps < 0 || x.steps == at) continue;
      if (x.steps > at + 1 || !x.canRevert || x.epochSteps == 0) {
        return Status::internal(fmt::format(
            "the group cannot go on: rank {} took {} steps, but every rank's pushes are at the shards only up to "
            "step {} (going back is possible by one step within an epoch)",
            q, x.steps, at));
      }
    }
  } else {
    for (int q = 0; q < int(all.size()); ++q) {
      if (all[size_t(q)].steps == at) {
        source = q;
        break;
      }
    }
  }
  const Standing& from = all[size_t(source)];
  const bool back = from.steps > at;
  RegroupPlan p;
  p.step = at;
  p.source = source;
  p.epoch = from.epoch;
  p.epochSteps = from.epochSteps - (back ? 1 : 0);
  p.samples = back ? from.previousSamples : from.samples;
  return p;
}

}  // namespace troupe::workers
