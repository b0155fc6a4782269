#include "workers/pipeline_stage.h"

#include <chrono>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/check.h"
#include "kernels/kernels.h"

namespace troupe::workers {
namespace {

double secondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

std::vector<PipelineStageOptions> mlpStageOptions(const std::vector<int64_t>& widths, const std::vector<int>& cut,
                                                  int microBatches, PipelineSchedule schedule,
                                                  const kernels::OptimizerConfig& optimizer, int threads, int replicas) {
  const int stages = int(cut.size()) - 1;
  std::vector<PipelineStageOptions> out;
  for (int i = 0; i < stages * replicas; ++i) {
    PipelineStageOptions o;
    o.widths = widths;
    o.cut = cut;
    o.stage = i % stages;
    o.microBatches = microBatches;
    o.schedule = schedule;
    o.optimizer = optimizer;
    o.kernels = kernels::createKernels({kernels::Device::kCpu, threads});
    out.push_back(std::move(o));
  }
  return out;
}

std::pair<int64_t, int64_t> mlpStageSlice(const std::vector<int64_t>& widths, const std::vector<int>& cut, int stage) {
  if (stage < 0 || size_t(stage) + 1 >= cut.size() || cut[size_t(stage)] < 0 ||
      cut[size_t(stage) + 1] <= cut[size_t(stage)] || size_t(cut[size_t(stage) + 1]) >= widths.size()) {
    TROUPE_SETUP_ERROR("pipeline: stage {} of a cut {} of {} layers", stage, fmt::join(cut, ","), int(widths.size()) - 1);
  }
  const int a = cut[size_t(stage)], b = cut[size_t(stage) + 1];
  std::vector<int64_t> before(widths.begin(), widths.begin() + a + 1), own(widths.begin() + a, widths.begin() + b + 1);
  return {a == 0 ? 0 : Mlp::parameterCount(before), Mlp::parameterCount(own)};
}

PipelineStage::PipelineStage(PipelineStageOptions options) : options_(std::move(options)) {
  const auto& cut = options_.cut;
  const int layers = int(options_.widths.size()) - 1;
  const int stage = options_.stage;
  if (cut.size() < 2 || stage < 0 || stage + 1 >= int(cut.size()) || cut.front() != 0 || cut.back() != layers) {
    TROUPE_SETUP_ERROR("pipeline: stage {} of a cut {} of {} layers", stage, fmt::join(cut, ","), layers);
  }
  for (size_t i = 1; i < cut.size(); ++i) {
    if (cut[i] <= cut[i - 1]) TROUPE_SETUP_ERROR("pipeline: the cut {} leaves a stage without layers", fmt::join(cut, ","));
  }
  TROUPE_CHECK(options_.kernels != nullptr, "pipeline stage without kernels");
  const int a = cut[size_t(stage)], b = cut[size_t(stage) + 1];
  stageWidths_.assign(options_.widths.begin() + a, options_.widths.begin() + b + 1);
  std::vector<int64_t> before(options_.widths.begin(), options_.widths.begin() + a + 1);
  offset_ = a == 0 ? 0 : Mlp::parameterCount(before);
  params_ = std::make_unique<DenseParameters>(Mlp::parameterCount(stageWidths_), options_.optimizer);
  // Every stage but the last ends with a ReLU: the unsplit model's after its
  // inner layers.
  mlp_ = std::make_unique<Mlp>(stageWidths_, !last(), params_.get(), 0);
  instructions_ = pipelineInstructions(options_.schedule, stages(), stage, options_.microBatches);
}

int64_t PipelineStage::firstRowOf(int mb) const { return batch_->rows * mb / options_.microBatches; }
int64_t PipelineStage::rowsOf(int mb) const { return firstRowOf(mb + 1) - firstRowOf(mb); }

Status PipelineStage::beginStep(int64_t step, BatchPtr batch, int64_t lossRows) {
  if (begun_ && !stepDone()) {
    return Status::internal(fmt::format("pipeline stage {}: step {} began before step {} ended", stage(), step, step_));
  }
  if (begun_ && !applied_) {
    return Status::internal(
        fmt::format("pipeline stage {}: step {} began before step {}'s optimizer step", stage(), step, step_));
  }
  if (begun_ && step <= step_) {
    return Status::internal(fmt::format("pipeline stage {}: step {} after step {}", stage(), step, step_));
  }
  // (A replica's share may be empty: a batch of fewer rows than replicas.)
  if (!batch || batch->rows < (lossRows > 0 ? 0 : 1)) {
    return Status::invalidArgument(fmt::format("pipeline stage {}: an empty batch", stage()));
  }
  if (first() && batch->denseWidth != stageWidths_.front()) {
    return Status::invalidArgument(
        fmt::format("pipeline stage 0: batch has {} features, the MLP takes {}", batch->denseWidth, stageWidths_.front()));
  }
  if (last() && int64_t(batch->classes.size()) != batch->rows) {
    return Status::invalidArgument(fmt::format("pipeline stage {}: a batch without class labels", stage()));
  }
  if (lossRows != 0 && lossRows < batch->rows) {
    return Status::invalidArgument(
        fmt::format("pipeline stage {}: a loss over {} rows for a batch of {}", stage(), lossRows, batch->rows));
  }
  step_ = step;
  applied_ = false;
  lossRows_ = lossRows != 0 ? lossRows : batch->rows;
  batch_ = std::move(batch);
  begun_ = true;
  next_ = 0;
  backwards_ = 0;
  loss_ = 0;
  used_.clear();
  inFlight_.clear();
  inputs_.clear();
  dLogits_.clear();
  for (auto it = held_.begin(); it != held_.end();) {
    it = std::get<0>(it->first) < step ? held_.erase(it) : std::next(it);
  }
  return Status::ok();
}

bool PipelineStage::deliver(const StageMessage& m) {
  const bool fromBefore = m.kind == StageMessage::Kind::kActivation;
  if ((fromBefore && first()) || (!fromBefore && last())) return false;  // no such neighbour
  if (m.microBatch < 0 || m.microBatch >= options_.microBatches) return false;
  // (a neighbour is at most one step ahead: the driver waits for every
  // stage before the next step)
  if (m.step < step_ || m.step > step_ + 1) return false;
  const Key key{m.step, m.kind, m.microBatch};
  if (m.step == step_ && used_.count(key)) return false;
  return held_.emplace(key, m).second;
}

Status PipelineStage::run(const std::function<void(StageMessage&&)>& send) {
  if (!begun_) return Status::ok();
  while (next_ < instructions_.size()) {
    const PipeInstr in = instructions_[next_];
    const bool forwardStep = in.op == PipeInstr::Op::kForward;
    const bool needs = forwardStep ? !first() : !last();
    const Key key{step_, forwardStep ? StageMessage::Kind::kActivation : StageMessage::Kind::kGradient, in.microBatch};
    auto it = held_.find(key);
    if (needs && it == held_.end()) return Status::ok();  // waits for it
    const auto started = std::chrono::steady_clock::now();
    if (needs) {
      // Its rows and width must be the ones this micro-batch has here.
      const int64_t width = forwardStep ? stageWidths_.front() : stageWidths_.back();
      if (it->second.rows != rowsOf(in.microBatch) || int64_t(it->second.values.size()) != it->second.rows * width) {
        return Status::corruption(fmt::format(
            "pipeline stage {}: the {} of micro-batch {} of step {} holds {} values of {} rows; {} rows of {} expected",
            stage(), forwardStep ? "activation" : "gradient", in.microBatch, step_, it->second.values.size(),
            it->second.rows, rowsOf(in.microBatch), width));
      }
      if (forwardStep) {
        inputs_[in.microBatch] = std::move(it->second.values);
      } else {
        gradient_ = std::move(it->second.values);
      }
      used_.insert(key);
      held_.erase(it);
    }
    Status s = forwardStep ? forward(in.microBatch, send) : backward(in.microBatch, send);
    const double took = secondsSince(started);
    busy_ += took;
    (forwardStep ? forwardSeconds_ : backwardSeconds_) += took;
    ++(forwardStep ? forwardCount_ : backwardCount_);
    if (!s.isOk()) return s;
    ++next_;
  }
  return Status::ok();
}

Status PipelineStage::forward(int mb, const std::function<void(StageMessage&&)>& send) {
  kernels::Kernels& k = *options_.kernels;
  const int64_t rows = rowsOf(mb);
  const float* x = first() ? batch_->dense.data() + firstRowOf(mb) * stageWidths_.front() : inputs_.at(mb).data();
  Status s = mlp_->forward(k, x, rows);
  if (!s.isOk()) return s;
  if (last()) {
    const int64_t classes = stageWidths_.back();
    auto& d = dLogits_[mb];
    d.resize(size_t(rows * classes));
    auto loss = k.softmaxCrossEntropy(mlp_->output(), batch_->classes.data() + firstRowOf(mb), rows, classes, d.data());
    if (!loss.hasValue()) return loss.status();
    // The micro-batch's mean, weighted to the batch's: rows / R.
    const float share = float(rows) / float(lossRows_);
    for (float& v : d) v *= share;
    loss_ += *loss * double(rows) / double(lossRows_);
  } else {
    StageMessage m;
    m.kind = StageMessage::Kind::kActivation;
    m.step = step_;
    m.microBatch = mb;
    m.rows = rows;
    m.values.assign(mlp_->output(), mlp_->output() + rows * stageWidths_.back());
    send(std::move(m));
  }
  inFlight_[mb] = mlp_->takeActivations();
  peakHeld_ = std::max(peakHeld_, int(inFlight_.size()));
  return Status::ok();
}

Status PipelineStage::backward(int mb, const std::function<void(StageMessage&&)>& send) {
  kernels::Kernels& k = *options_.kernels;
  auto act = inFlight_.find(mb);
  if (act == inFlight_.end()) {
    return Status::internal(fmt::format("pipeline stage {}: backward of micro-batch {} before its forward", stage(), mb));
  }
  std::vector<float> dOut;  // the last stage's loss gradient; the others' came in gradient_
  if (last()) {
    dOut = std::move(dLogits_.at(mb));
    dLogits_.erase(mb);
  }
  mlp_->restoreActivations(std::move(act->second));
  inFlight_.erase(act);
  const int64_t rows = rowsOf(mb);
  if (!first()) dx_.resize(size_t(rows * stageWidths_.front()));
  Status s = mlp_->backward(k, last() ? dOut.data() : gradient_.data(), first() ? nullptr : dx_.data(), backwards_ > 0);
  if (!s.isOk()) return s;
  ++backwards_;
  inputs_.erase(mb);
  if (!first()) {
    StageMessage m;
    m.kind = StageMessage::Kind::kGradient;
    m.step = step_;
    m.microBatch = mb;
    m.rows = rows;
    m.values = dx_;
    send(std::move(m));
  }
  return Status::ok();
}

Status PipelineStage::applyOptimizer() {
  if (!stepDone()) return Status::internal(fmt::format("pipeline stage {}: optimizer before step {} ended", stage(), step_));
  if (applied_) return Status::internal(fmt::format("pipeline stage {}: step {}'s optimizer step twice", stage(), step_));
  applied_ = true;
  const auto started = std::chrono::steady_clock::now();
  Status s = params_->apply(*options_.kernels, step_);
  busy_ += secondsSince(started);
  return s;
}

}  // namespace troupe::workers
