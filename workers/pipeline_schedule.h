// Pipeline schedules (DESIGN.md, Pipeline stages): what each stage of a
// model cut into p stages does with the m micro-batches of a step, as a list
// of instructions, the way DeepSpeed's pipeline engine and
// torch.distributed.pipelining write them. A stage runs its list in order;
// a forward waits for the micro-batch's activation from the stage before
// (stage 0: the batch), a backward for its gradient from the stage after
// (the last stage: its own loss). Every list holds each micro-batch's
// forward, then later its backward, once; backwards run in micro-batch
// order on every stage, so gradients accumulate in the order of the unsplit
// model's micro-batch loop (bit for bit the same sums).
//
//   gpipe  every forward, then every backward: m micro-batches of
//          activations held at once on every stage
//   1f1b   PipeDream-flush: min(p - s - 1, m) forwards to fill the pipe,
//          then one forward and one backward in turn, then the backwards
//          left: stage s holds at most min(p - s, m) micro-batches
//
// Both leave each stage idle for (p - 1) / (m + p - 1) of a step when every
// forward and backward takes the same time (the bubble); pipelineBubble
// works that out by running the lists, so a test can hold the lists to it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::workers {

enum class PipelineSchedule { kGpipe, k1F1B };

// "gpipe", "1f1b".
const char* pipelineScheduleName(PipelineSchedule schedule);
std::optional<PipelineSchedule> pipelineScheduleOf(std::string_view name);

struct PipeInstr {
  enum class Op : uint8_t { kForward, kBackward };
  Op op = Op::kForward;
  int32_t microBatch = 0;
  bool operator==(const PipeInstr&) const = default;
};

// Stage `stage` of `stages`' instructions for `microBatches` micro-batches.
// Throws SetupError for stages < 1, a stage out of range or microBatches < 1.
std::vector<PipeInstr> pipelineInstructions(PipelineSchedule schedule, int stages, int stage, int microBatches);

// The most micro-batches whose activations a stage holds at once under its
// list (forwarded, not yet backward).
int peakInFlight(const std::vector<PipeInstr>& instructions);

// Runs every stage's list with each forward and backward taking one unit of
// time (a backward `backwardCost` units) and messages arriving at once:
// the share of the makespan each stage is idle, by stage; empty when the
// lists cannot all finish (a deadlock).
std::vector<double> pipelineBubble(PipelineSchedule schedule, int stages, int microBatches, double backwardCost = 1.0);
// The same with each stage's own forward and backward time (a micro-batch's,
// by stage): what the schedule leaves idle for stages of unequal work.
std::vector<double> pipelineIdle(PipelineSchedule schedule, int microBatches, const std::vector<double>& forward,
                                 const std::vector<double>& backward);

// The cut of an MLP of these widths (layers l: widths[l] -> widths[l + 1])
// into `stages` contiguous ranges of layers, balanced by parameter count
// (the largest stage as small as it can be): the first layer of each stage,
// then the layer count (stages + 1 values). Throws SetupError when there are
// fewer layers than stages.
std::vector<int> cutMlpLayers(const std::vector<int64_t>& widths, int stages);

}  // namespace troupe::workers
