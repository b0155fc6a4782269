#include "workers/pipeline_schedule.h"

#include <algorithm>
#include <limits>

#include "common/check.h"

namespace troupe::workers {

const char* pipelineScheduleName(PipelineSchedule schedule) {
  return schedule == PipelineSchedule::kGpipe ? "gpipe" : "1f1b";
}

std::optional<PipelineSchedule> pipelineScheduleOf(std::string_view name) {
  if (name == "gpipe") return PipelineSchedule::kGpipe;
  if (name == "1f1b") return PipelineSchedule::k1F1B;
  return std::nullopt;
}

std::vector<PipeInstr> pipelineInstructions(PipelineSchedule schedule, int stages, int stage, int microBatches) {
  if (stages < 1 || stage < 0 || stage >= stages || microBatches < 1) {
    TROUPE_SETUP_ERROR("pipeline: stage {} of {} stages with {} micro-batches", stage, stages, microBatches);
  }
  using Op = PipeInstr::Op;
  std::vector<PipeInstr> out;
  out.reserve(size_t(2 * microBatches));
  if (schedule == PipelineSchedule::kGpipe) {
    for (int i = 0; i < microBatches; ++i) out.push_back({Op::kForward, i});
    for (int i = 0; i < microBatches; ++i) out.push_back({Op::kBackward, i});
    return out;
  }
  const int warmup = std::min(stages - stage - 1, microBatches);
  for (int i = 0; i < warmup; ++i) out.push_back({Op::kForward, i});
  for (int i = 0; i < microBatches - warmup; ++i) {
    out.push_back({Op::kForward, warmup + i});
    out.push_back({Op::kBackward, i});
  }
  for (int i = microBatches - warmup; i < microBatches; ++i) out.push_back({Op::kBackward, i});
  return out;
}

int peakInFlight(const std::vector<PipeInstr>& instructions) {
  int held = 0, peak = 0;
  for (const auto& in : instructions) {
    held += in.op == PipeInstr::Op::kForward ? 1 : -1;
    peak = std::max(peak, held);
  }
  return peak;
}

std::vector<double> pipelineBubble(PipelineSchedule schedule, int stages, int microBatches, double backwardCost) {
  return pipelineIdle(schedule, microBatches, std::vector<double>(size_t(stages), 1.0),
                      std::vector<double>(size_t(stages), backwardCost));
}

std::vector<double> pipelineIdle(PipelineSchedule schedule, int microBatches, const std::vector<double>& forward,
                                 const std::vector<double>& backward) {
  using Op = PipeInstr::Op;
  const int stages = int(forward.size());
  TROUPE_CHECK(backward.size() == forward.size(), "pipelineIdle: {} forward and {} backward costs", forward.size(),
               backward.size());
  if (stages == 0) return {};
  std::vector<std::vector<PipeInstr>> lists;
  for (int s = 0; s < stages; ++s) lists.push_back(pipelineInstructions(schedule, stages, s, microBatches));
  constexpr double kNever = std::numeric_limits<double>::infinity();
  // When each stage's forward (backward) of each micro-batch ended.
  std::vector<std::vector<double>> fwd(size_t(stages), std::vector<double>(size_t(microBatches), kNever));
  std::vector<std::vector<double>> bwd = fwd;
  std::vector<size_t> next(size_t(stages), 0);
  std::vector<double> clock(size_t(stages), 0.0), busy(size_t(stages), 0.0);
  // Each pass runs every instruction whose input is there; a pass that runs
  // none with work left is a deadlock.
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < stages; ++s) {
      auto& list = lists[size_t(s)];
      while (next[size_t(s)] < list.size()) {
        const PipeInstr in = list[next[size_t(s)]];
        const size_t mb = size_t(in.microBatch);
        double ready = 0;
        if (in.op == Op::kForward) {
          ready = s == 0 ? 0.0 : fwd[size_t(s) - 1][mb];
        } else {
          ready = s == stages - 1 ? fwd[size_t(s)][mb] : bwd[size_t(s) + 1][mb];
        }
        if (ready == kNever) break;
        const double cost = in.op == Op::kForward ? forward[size_t(s)] : backward[size_t(s)];
        const double start = std::max(clock[size_t(s)], ready);
        clock[size_t(s)] = start + cost;
        busy[size_t(s)] += cost;
        (in.op == Op::kForward ? fwd : bwd)[size_t(s)][mb] = clock[size_t(s)];
        ++next[size_t(s)];
        progress = true;
      }
    }
  }
  for (int s = 0; s < stages; ++s) {
    if (next[size_t(s)] < lists[size_t(s)].size()) return {};
  }
  const double makespan = *std::max_element(clock.begin(), clock.end());
  std::vector<double> idle;
  for (int s = 0; s < stages; ++s) idle.push_back(1.0 - busy[size_t(s)] / makespan);
  return idle;
}

std::vector<int> cutMlpLayers(const std::vector<int64_t>& widths, int stages) {
  const int layers = int(widths.size()) - 1;
  if (stages < 1 || layers < stages) {
    TROUPE_SETUP_ERROR("pipeline: {} stages for an MLP of {} layers (each stage takes at least one)", stages, layers);
  }
  std::vector<int64_t> params;
  for (int l = 0; l < layers; ++l) params.push_back(widths[size_t(l)] * widths[size_t(l) + 1] + widths[size_t(l) + 1]);
  // The smallest bound on a stage's parameters for which a greedy cut (each
  // stage takes layers while they fit) needs at most `stages` stages: the
  // bound is one of the sums of consecutive layers, searched in order.
  std::vector<int64_t> bounds;
  for (int a = 0; a < layers; ++a) {
    int64_t sum = 0;
    for (int b = a; b < layers; ++b) bounds.push_back(sum += params[size_t(b)]);
  }
  std::sort(bounds.begin(), bounds.end());
  for (int64_t bound : bounds) {
    std::vector<int> cut = {0};
    int64_t sum = 0;
    bool fits = true;
    for (int l = 0; l < layers && fits; ++l) {
      if (params[size_t(l)] > bound) fits = false;
      if (sum + params[size_t(l)] > bound) {
        cut.push_back(l);
        sum = 0;
      }
      sum += params[size_t(l)];
    }
    if (!fits || int(cut.size()) > stages) continue;
    // Fewer stages than asked: split the last ones further, a layer each,
    // from the end (every stage holds at least one layer).
    for (int l = layers - 1; int(cut.size()) < stages; --l) {
      if (std::find(cut.begin(), cut.end(), l) == cut.end()) cut.push_back(l);
      std::sort(cut.begin(), cut.end());
    }
    cut.push_back(layers);
    return cut;
  }
  TROUPE_SETUP_ERROR("pipeline: no cut of {} layers into {} stages", layers, stages);
}

}  // namespace troupe::workers
