// PipelineStage: one stage of an MLP cut into stages (workers/pipeline_schedule.h),
// or one of a DLRM's two: a contiguous range of its layers with their
// weights, optimizer state and gradients (a DenseParameters of its own),
// running its schedule's instructions for each step's micro-batches as
// their inputs arrive.
//
// A step's batch is cut into m micro-batches of contiguous rows (micro-batch
// i: rows [i R / m, (i + 1) R / m)). Stage 0 reads their features from the
// batch, the last stage their labels; in between, a forward waits for the
// micro-batch's activation from the stage before and a backward for its
// gradient from the stage after. Messages come in any order, late, or twice:
// each is kept until its instruction runs (one of a later step until that
// step begins; before its first step, of any step: a resumed job starts at
// its checkpoint's), and a second copy, or one of a step gone, is dropped. An
// asynchronous mailbox therefore cannot deadlock a schedule whose lists can
// finish at all (pipelineBubble checks that they can).
//
// The loss: each micro-batch's softmax cross-entropy gradient (the DLRM's:
// sigmoid cross-entropy of the click labels), averaged over its rows, times
// rows / R, so the accumulated gradient is the whole batch's mean;
// backwards run in micro-batch order, the first overwriting the gradients
// and the rest adding to them: the unsplit MLP's micro-batch loop gives the
// same bits (the DLRM has no such loop: with one micro-batch its stages are
// the unsplit DlrmModel's bits).
//
// Threading: one owner (a stage actor, workers/pipeline_actor.h).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "common/status.h"
#include "kernels/row_optimizer.h"
#include "workers/batch.h"
#include "workers/dense_parameters.h"
#include "workers/dlrm_model.h"
#include "workers/mlp.h"
#include "workers/pipeline_schedule.h"

namespace troupe::kernels {
class Kernels;
}

namespace troupe::workers {

// An activation (forward, to the next stage) or the gradient of one
// (backward, to the stage before), of one micro-batch of one step.
struct StageMessage {
  enum class Kind : uint8_t { kActivation, kGradient };
  Kind kind = Kind::kActivation;
  int64_t step = 0;
  int32_t microBatch = 0;
  int64_t rows = 0;
  std::vector<float> values;  // [rows x width]
};

struct PipelineStageOptions {
  std::vector<int64_t> widths;  // the whole MLP's: {in, h1, ..., classes}
  std::vector<int> cut;         // cutMlpLayers: the first layer of each stage, then the layer count
  // A DLRM's dense part instead of an MLP (widths unused; cut {0, 1, 2}):
  // stage 0 its bottom MLP, stage 1 the interaction and top MLP. Stage 0's
  // input row is the row's dense features then its T pooled embeddings
  // (dlrmStageRows), and it passes the embeddings on beside the bottom
  // MLP's output x: [x | e_1 ... e_T]. The loss is the sigmoid
  // cross-entropy of the batch's labels. The weights: DlrmModel's buffer
  // (bottom, then top).
  std::optional<DlrmShape> dlrm;
  // Stage 0: keep the gradient of each row's input (inputGradients()): a
  // DLRM's pooled embeddings', for the embedding bags' backward.
  bool inputGradients = false;
  int stage = 0;
  int microBatches = 1;
  PipelineSchedule schedule = PipelineSchedule::k1F1B;
  kernels::OptimizerConfig optimizer;
  std::shared_ptr<kernels::Kernels> kernels;
};

// The options of `replicas` pipelines of an MLP cut by `cut` (replica-major,
// as InProcessPipeline takes them), each stage with kernels of its own on
// `threads` threads.
std::vector<PipelineStageOptions> mlpStageOptions(const std::vector<int64_t>& widths, const std::vector<int>& cut,
                                                  int microBatches, PipelineSchedule schedule,
                                                  const kernels::OptimizerConfig& optimizer, int threads,
                                                  int replicas = 1);

// The slice [first, first + count) of the unsplit MLP's parameters that
// stage `stage` of `cut` holds (PipelineStage::parameterOffset and the size
// of its parameters). Throws SetupError for a stage out of the cut.
std::pair<int64_t, int64_t> mlpStageSlice(const std::vector<int64_t>& widths, const std::vector<int>& cut, int stage);

// What a stage computes (pipeline_stage.cc): an MLP's layers, or a DLRM's
// halves.
class StageLayers;

// A DLRM batch as its pipeline's stage 0 reads it: each row its dense
// features then its pooled embeddings (`pooled`: numTables pointers to
// [rows x dim]), the labels as they are.
BatchPtr dlrmStageRows(const Batch& batch, const DlrmShape& shape, const float* const* pooled);

// The options of `replicas` pipelines of a DLRM's dense part in its two
// stages (replica-major), stage 0 keeping its input gradients, each stage
// with kernels of its own on `threads` threads.
std::vector<PipelineStageOptions> dlrmStageOptions(const DlrmShape& shape, int microBatches, PipelineSchedule schedule,
                                                   const kernels::OptimizerConfig& optimizer, int threads,
                                                   int replicas = 1);

class PipelineStage final {
 public:
  // Throws SetupError for a stage out of the cut or a cut that does not fit
  // the widths.
  explicit PipelineStage(PipelineStageOptions options);
  ~PipelineStage();

  int stage() const { return options_.stage; }
  const PipelineStageOptions& options() const { return options_; }
  int microBatches() const { return options_.microBatches; }
  PipelineSchedule schedule() const { return options_.schedule; }
  int stages() const { return int(options_.cut.size()) - 1; }
  bool first() const { return options_.stage == 0; }
  bool last() const { return options_.stage == stages() - 1; }
  // This stage's weights, optimizer state and gradients: the slice
  // [parameterOffset(), + parameters().size()) of the unsplit model's.
  DenseParameters& parameters() { return *params_; }
  int64_t parameterOffset() const { return offset_; }

  // Starts step `step` (>= 1, one after another; after resumeAt(K), K + 1 first) on `batch` (R >= 1 rows;
  // with R < m some micro-batches are empty: an epoch's last batch may be
  // short); messages of an earlier step still held are dropped.
  // `lossRows` (0: the batch's rows) is the R the loss averages over: a
  // data-parallel replica's batch is a share of a larger one (possibly
  // empty), whose mean gradient is then the plain sum of the replicas'
  // (InProcessPipeline).
  Status beginStep(int64_t step, BatchPtr batch, int64_t lossRows = 0);
  // A message from a neighbour: kept (true) or dropped (false: a second
  // copy, a step gone, a micro-batch out of range).
  bool deliver(const StageMessage& m);
  // Runs every instruction whose input is here; sends what it makes through
  // `send`. The first error ends the step.
  Status run(const std::function<void(StageMessage&&)>& send);
  // A resumed job's stage, before its first step: its weights and
  // optimizer state (loaded by the caller) are of step `step`, and its next
  // step is step + 1.
  void resumeAt(int64_t step);
  // The step begun last (0: none yet).
  int64_t currentStep() const { return step_; }
  // The last step whose optimizer step was taken (0: none yet): the step
  // the weights are of.
  int64_t appliedStep() const { return !begun_ ? 0 : applied_ ? step_ : step_ - 1; }
  // Every instruction of the step ran.
  bool stepDone() const { return begun_ && next_ == instructions_.size(); }
  // The optimizer step on the accumulated gradients: once a step, after
  // stepDone (the next step does not begin before it).
  Status applyOptimizer();

  // The last stage: the step's mean loss (over its micro-batches, weighted
  // by rows).
  double stepLoss() const { return loss_; }
  // inputGradients: the gradient of each row of the step's batch
  // [R x input width], once the step's backwards ran (a DLRM's stage 0:
  // the dense features' columns 0, the pooled embeddings' theirs).
  const std::vector<float>& inputGradients() const { return inputGrads_; }
  int64_t inputWidth() const;
  // The most micro-batches whose activations this stage held at once
  // (since it was made).
  int peakHeld() const { return peakHeld_; }
  // Seconds spent in forwards, backwards and optimizer steps (since it was
  // made), and a
  // micro-batch's forward and backward on average.
  double busySeconds() const { return busy_; }
  double meanForwardSeconds() const { return forwardCount_ ? forwardSeconds_ / double(forwardCount_) : 0.0; }
  double meanBackwardSeconds() const { return backwardCount_ ? backwardSeconds_ / double(backwardCount_) : 0.0; }

 private:
  using Key = std::tuple<int64_t, StageMessage::Kind, int32_t>;  // (step, kind, micro-batch)
  int64_t rowsOf(int mb) const;
  int64_t firstRowOf(int mb) const;
  Status forward(int mb, const std::function<void(StageMessage&&)>& send);
  Status backward(int mb, const std::function<void(StageMessage&&)>& send);

  PipelineStageOptions options_;
  int64_t offset_ = 0;
  std::unique_ptr<DenseParameters> params_;
  std::unique_ptr<StageLayers> layers_;
  std::vector<float> inputGrads_;
  std::vector<PipeInstr> instructions_;
  int64_t step_ = 0;
  bool begun_ = false;
  bool applied_ = false;  // the step's optimizer step was taken
  size_t next_ = 0;
  int backwards_ = 0;
  BatchPtr batch_;
  std::map<Key, StageMessage> held_;  // arrived, not yet used
  std::set<Key> used_;                // of the current step
  std::map<int, std::shared_ptr<void>> inFlight_;  // each micro-batch's activations (the layers' own kind)
  std::map<int, std::vector<float>> inputs_;  // activations received, kept until the backward
  std::map<int, std::vector<float>> dLogits_;  // the last stage's
  std::vector<float> gradient_;  // the gradient of the backward under way (from the next stage)
  std::vector<float> dx_;
  double loss_ = 0;
  int64_t lossRows_ = 0;
  int peakHeld_ = 0;
  double busy_ = 0;
  double forwardSeconds_ = 0, backwardSeconds_ = 0;
  int64_t forwardCount_ = 0, backwardCount_ = 0;
};

}  // namespace troupe::workers
