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
    // A replacement's rank, or (a group going on without a lost rank) the
    // shards, bound the step.
    for (const auto& x : all) {
      if (x.shardClock >= 0) at = std::min(at, x.shardClock);
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
  p.epochBatch =
      DataDivision{from.divisionEpoch, from.divisionFrom, from.divisionParts}.batchesTaken(from.epoch, p.epochSteps);
  return p;
}

int64_t syncSamples(int64_t rows, int64_t batch, int64_t epochs, const std::vector<DataDivision>& divisions) {
  if (rows <= 0 || batch <= 0 || epochs <= 0 || divisions.empty()) return 0;
  const int64_t batches = (rows + batch - 1) / batch;
  // Rows of batches [from, from + n).
  auto rowsOf = [&](int64_t from, int64_t n) {
    if (n <= 0) return int64_t{0};
    return from + n >= batches ? rows - from * batch : n * batch;
  };
  int64_t total = 0;
  for (int64_t e = 0; e < epochs; ++e) {
    // The divisions in force in epoch e: the last one of an earlier epoch
    // (from its first batch on), then each one made in e.
    std::vector<std::pair<int64_t, int64_t>> segments;  // (first batch, parts)
    for (const auto& d : divisions) {
      if (d.epoch < e) {
        segments.assign(1, {0, std::max<int64_t>(1, d.parts)});
      } else if (d.epoch == e) {
        if (!segments.empty() && d.fromBatch <= segments.back().first) segments.pop_back();
        segments.push_back({d.fromBatch, std::max<int64_t>(1, d.parts)});
      }
    }
    for (size_t i = 0; i < segments.size(); ++i) {
      const auto [from, parts] = segments[i];
      const int64_t end = std::min(batches, i + 1 < segments.size() ? segments[i + 1].first : batches);
      if (end <= from) continue;
      total += rowsOf(from, (end - from) / parts * parts);
    }
  }
  return total;
}

}  // namespace troupe::workers
