#include "workers/pipeline_stage.h"

#include <algorithm>
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

class StageLayers {
 public:
  virtual ~StageLayers() = default;
  virtual int64_t inWidth() const = 0;   // values a row takes
  virtual int64_t outWidth() const = 0;  // values a row gives (the last stage: logits)
  // The rows at x (kept until backward) -> output() [rows x outWidth].
  virtual Status forward(kernels::Kernels& k, const float* x, int64_t rows) = 0;
  virtual const float* output() const = 0;
  // What the forward keeps for its backward, out and back in.
  virtual std::shared_ptr<void> take() = 0;
  virtual void restore(std::shared_ptr<void> a) = 0;
  // dOut [rows x outWidth] -> dx [rows x inWidth] (null: not needed); the
  // weights' gradients overwritten, or added to with `accumulate`.
  virtual Status backward(kernels::Kernels& k, const float* dOut, float* dx, bool accumulate) = 0;
};

namespace {

// A contiguous run of an MLP's layers.
class MlpLayers final : public StageLayers {
 public:
  MlpLayers(std::vector<int64_t> widths, bool reluOnOutput, DenseParameters* params)
      : mlp_(std::move(widths), reluOnOutput, params, 0) {}
  int64_t inWidth() const override { return mlp_.inputWidth(); }
  int64_t outWidth() const override { return mlp_.outputWidth(); }
  Status forward(kernels::Kernels& k, const float* x, int64_t rows) override { return mlp_.forward(k, x, rows); }
  const float* output() const override { return mlp_.output(); }
  std::shared_ptr<void> take() override { return std::make_shared<Mlp::Activations>(mlp_.takeActivations()); }
  void restore(std::shared_ptr<void> a) override {
    mlp_.restoreActivations(std::move(*std::static_pointer_cast<Mlp::Activations>(a)));
  }
  Status backward(kernels::Kernels& k, const float* dOut, float* dx, bool accumulate) override {
    return mlp_.backward(k, dOut, dx, accumulate);
  }

 private:
  Mlp mlp_;
};

// A DLRM's stage 0: rows [dense | e_1 .. e_T] -> [x | e_1 .. e_T], x the
// bottom MLP's output.
class DlrmBottomLayers final : public StageLayers {
 public:
  DlrmBottomLayers(const DlrmShape& shape, DenseParameters* params)
      : dense_(shape.numDense),
        pooled_(int64_t(shape.numTables) * shape.embeddingDim),
        dim_(shape.embeddingDim),
        mlp_(DlrmModel::bottomWidths(shape), true, params, 0) {}
  int64_t inWidth() const override { return dense_ + pooled_; }
  int64_t outWidth() const override { return dim_ + pooled_; }
  Status forward(kernels::Kernels& k, const float* x, int64_t rows) override {
    in_.resize(size_t(rows * dense_));
    out_.resize(size_t(rows * outWidth()));
    for (int64_t r = 0; r < rows; ++r) {
      std::copy_n(x + r * inWidth(), dense_, in_.data() + r * dense_);
      std::copy_n(x + r * inWidth() + dense_, pooled_, out_.data() + r * outWidth() + dim_);
    }
    Status s = mlp_.forward(k, in_.data(), rows);
    if (!s.isOk()) return s;
    for (int64_t r = 0; r < rows; ++r) std::copy_n(mlp_.output() + r * dim_, dim_, out_.data() + r * outWidth());
    return Status::ok();
  }
  const float* output() const override { return out_.data(); }
  struct Kept {
    Mlp::Activations mlp;
    std::vector<float> in;  // the dense features the bottom MLP read
  };
  std::shared_ptr<void> take() override {
    auto a = std::make_shared<Kept>();
    a->mlp = mlp_.takeActivations();
    a->in = std::move(in_);  // (the buffer moves: the activations' input pointer stays good)
    in_.clear();
    return a;
  }
  void restore(std::shared_ptr<void> p) override {
    auto& a = *std::static_pointer_cast<Kept>(p);
    mlp_.restoreActivations(std::move(a.mlp));
    in_ = std::move(a.in);
  }
  Status backward(kernels::Kernels& k, const float* dOut, float* dx, bool accumulate) override {
    const int64_t rows = int64_t(in_.size()) / dense_;
    dX_.resize(size_t(rows * dim_));
    for (int64_t r = 0; r < rows; ++r) std::copy_n(dOut + r * outWidth(), dim_, dX_.data() + r * dim_);
    Status s = mlp_.backward(k, dX_.data(), nullptr, accumulate);
    if (!s.isOk() || !dx) return s;
    for (int64_t r = 0; r < rows; ++r) {
      std::fill_n(dx + r * inWidth(), dense_, 0.0f);  // (the features are data: no gradient)
      std::copy_n(dOut + r * outWidth() + dim_, pooled_, dx + r * inWidth() + dense_);
    }
    return Status::ok();
  }

 private:
  int64_t dense_, pooled_, dim_;
  Mlp mlp_;
  std::vector<float> in_, out_, dX_;
};

// A DLRM's last stage: rows [x | e_1 .. e_T] -> the logit (DlrmTop).
class DlrmTopLayers final : public StageLayers {
 public:
  DlrmTopLayers(const DlrmShape& shape, DenseParameters* params)
      : tables_(shape.numTables), dim_(shape.embeddingDim), top_(shape, params, 0) {}
  int64_t inWidth() const override { return dim_ * (tables_ + 1); }
  int64_t outWidth() const override { return 1; }
  Status forward(kernels::Kernels& k, const float* x, int64_t rows) override {
    // Z = {x, e_1, ..., e_T}, each [rows x dim].
    z_.assign(size_t(tables_ + 1), std::vector<float>(size_t(rows * dim_)));
    for (int64_t r = 0; r < rows; ++r) {
      for (int t = 0; t <= tables_; ++t) std::copy_n(x + r * inWidth() + t * dim_, dim_, z_[size_t(t)].data() + r * dim_);
    }
    std::vector<const float*> e;
    for (int t = 1; t <= tables_; ++t) e.push_back(z_[size_t(t)].data());
    return top_.forward(k, z_[0].data(), e.data(), rows);
  }
  const float* output() const override { return top_.logits(); }
  struct Kept {
    DlrmTop::Activations top;
    std::vector<std::vector<float>> z;
  };
  std::shared_ptr<void> take() override {
    auto a = std::make_shared<Kept>();
    a->top = top_.takeActivations();
    a->z = std::move(z_);  // (each buffer moves: the pointers the activations hold stay good)
    z_.clear();
    return a;
  }
  void restore(std::shared_ptr<void> p) override {
    auto& a = *std::static_pointer_cast<Kept>(p);
    top_.restoreActivations(std::move(a.top));
    z_ = std::move(a.z);
  }
  Status backward(kernels::Kernels& k, const float* dOut, float* dx, bool accumulate) override {
    const int64_t rows = z_.empty() ? 0 : int64_t(z_[0].size()) / dim_;
    dz_.assign(size_t(tables_ + 1), std::vector<float>(size_t(rows * dim_)));
    std::vector<float*> dE;
    for (int t = 1; t <= tables_; ++t) dE.push_back(dz_[size_t(t)].data());
    Status s = top_.backward(k, dOut, dz_[0].data(), dE.data(), accumulate);
    if (!s.isOk() || !dx) return s;
    for (int64_t r = 0; r < rows; ++r) {
      for (int t = 0; t <= tables_; ++t) std::copy_n(dz_[size_t(t)].data() + r * dim_, dim_, dx + r * inWidth() + t * dim_);
    }
    return Status::ok();
  }

 private:
  int tables_;
  int64_t dim_;
  DlrmTop top_;
  std::vector<std::vector<float>> z_, dz_;
};

}  // namespace

BatchPtr dlrmStageRows(const Batch& batch, const DlrmShape& shape, const float* const* pooled) {
  auto out = std::make_shared<Batch>();
  out->index = batch.index;
  out->firstRow = batch.firstRow;
  out->rows = batch.rows;
  const int64_t dense = shape.numDense, dim = shape.embeddingDim, width = dense + shape.numTables * dim;
  out->denseWidth = width;
  out->dense.resize(size_t(batch.rows * width));
  for (int64_t r = 0; r < batch.rows; ++r) {
    float* row = out->dense.data() + r * width;
    std::copy_n(batch.dense.data() + r * dense, dense, row);
    for (int t = 0; t < shape.numTables; ++t) std::copy_n(pooled[t] + r * dim, dim, row + dense + t * dim);
  }
  out->labels = batch.labels;
  return out;
}

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

std::vector<PipelineStageOptions> dlrmStageOptions(const DlrmShape& shape, int microBatches, PipelineSchedule schedule,
                                                   const kernels::OptimizerConfig& optimizer, int threads,
                                                   int replicas) {
  std::vector<PipelineStageOptions> out;
  for (int i = 0; i < 2 * replicas; ++i) {
    PipelineStageOptions o;
    o.dlrm = shape;
    o.cut = {0, 1, 2};
    o.stage = i % 2;
    o.inputGradients = o.stage == 0;
    o.microBatches = microBatches;
    o.schedule = schedule;
    o.optimizer = optimizer;
    o.kernels = kernels::createKernels({kernels::Device::kCpu, threads});
    out.push_back(std::move(o));
  }
  return out;
}

PipelineStage::PipelineStage(PipelineStageOptions options) : options_(std::move(options)) {
  TROUPE_CHECK(options_.kernels != nullptr, "pipeline stage without kernels");
  const auto& cut = options_.cut;
  const int stage = options_.stage;
  if (options_.dlrm) {
    // Two stages: the bottom MLP, then the interaction and the top MLP.
    if (cut != std::vector<int>{0, 1, 2} || stage < 0 || stage > 1) {
      TROUPE_SETUP_ERROR("pipeline: a DLRM is cut into 2 stages (its bottom MLP; the interaction and top MLP), not "
                         "stage {} of {}", stage, fmt::join(cut, ","));
    }
    const DlrmShape& shape = *options_.dlrm;
    const int64_t bottom = Mlp::parameterCount(DlrmModel::bottomWidths(shape));
    offset_ = stage == 0 ? 0 : bottom;
    params_ = std::make_unique<DenseParameters>(
        stage == 0 ? bottom : Mlp::parameterCount(DlrmTop::widths(shape)), options_.optimizer);
    if (stage == 0) {
      layers_ = std::make_unique<DlrmBottomLayers>(shape, params_.get());
    } else {
      layers_ = std::make_unique<DlrmTopLayers>(shape, params_.get());
    }
  } else {
    const int layers = int(options_.widths.size()) - 1;
    if (cut.size() < 2 || stage < 0 || stage + 1 >= int(cut.size()) || cut.front() != 0 || cut.back() != layers) {
      TROUPE_SETUP_ERROR("pipeline: stage {} of a cut {} of {} layers", stage, fmt::join(cut, ","), layers);
    }
    for (size_t i = 1; i < cut.size(); ++i) {
      if (cut[i] <= cut[i - 1]) TROUPE_SETUP_ERROR("pipeline: the cut {} leaves a stage without layers", fmt::join(cut, ","));
    }
    const auto slice = mlpStageSlice(options_.widths, cut, stage);
    const int a = cut[size_t(stage)], b = cut[size_t(stage) + 1];
    std::vector<int64_t> widths(options_.widths.begin() + a, options_.widths.begin() + b + 1);
    offset_ = slice.first;
    params_ = std::make_unique<DenseParameters>(slice.second, options_.optimizer);
    // Every stage but the last ends with a ReLU: the unsplit model's after its
    // inner layers.
    layers_ = std::make_unique<MlpLayers>(std::move(widths), !last(), params_.get());
  }
  instructions_ = pipelineInstructions(options_.schedule, stages(), stage, options_.microBatches);
}

PipelineStage::~PipelineStage() = default;

int64_t PipelineStage::inputWidth() const { return layers_->inWidth(); }

void PipelineStage::resumeAt(int64_t step) {
  TROUPE_CHECK(!begun_ && step >= 0, "pipeline stage {}: resumed at step {} after step {}", stage(), step, step_);
  if (step == 0) return;
  // As if step `step` had run and stepped its optimizer: the next begins at step + 1.
  step_ = step;
  begun_ = true;
  applied_ = true;
  next_ = instructions_.size();
  for (auto it = held_.begin(); it != held_.end();) {
    const int64_t s = std::get<0>(it->first);
    it = s <= step || s > step + 1 ? held_.erase(it) : std::next(it);
  }
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
  if (first() && (batch->denseWidth != layers_->inWidth() || int64_t(batch->dense.size()) != batch->rows * batch->denseWidth)) {
    return Status::invalidArgument(fmt::format("pipeline stage 0: batch has {} features a row, the stage takes {}",
                                               batch->denseWidth, layers_->inWidth()));
  }
  if (last() && !options_.dlrm && int64_t(batch->classes.size()) != batch->rows) {
    return Status::invalidArgument(fmt::format("pipeline stage {}: a batch without class labels", stage()));
  }
  if (last() && options_.dlrm && int64_t(batch->labels.size()) != batch->rows) {
    return Status::invalidArgument(fmt::format("pipeline stage {}: a batch without click labels", stage()));
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
  if (first() && options_.inputGradients) inputGrads_.assign(size_t(batch_->rows * layers_->inWidth()), 0.0f);
  // (held before the stage's first step, a message may be of any step:
  // only this step's are of use)
  for (auto it = held_.begin(); it != held_.end();) {
    const int64_t s = std::get<0>(it->first);
    it = s < step || s > step + 1 ? held_.erase(it) : std::next(it);
  }
  return Status::ok();
}

bool PipelineStage::deliver(const StageMessage& m) {
  const bool fromBefore = m.kind == StageMessage::Kind::kActivation;
  if ((fromBefore && first()) || (!fromBefore && last())) return false;  // no such neighbour
  if (m.microBatch < 0 || m.microBatch >= options_.microBatches) return false;
  // (a neighbour is at most one step ahead: the driver waits for every
  // stage before the next step; before its first step a stage may start at
  // any step, a resumed job's at its checkpoint's, and a neighbour's first
  // message may come before it begins)
  if (m.step < 1 || (begun_ && (m.step < step_ || m.step > step_ + 1))) return false;
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
      const int64_t width = forwardStep ? layers_->inWidth() : layers_->outWidth();
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
  const float* x = first() ? batch_->dense.data() + firstRowOf(mb) * layers_->inWidth() : inputs_.at(mb).data();
  Status s = layers_->forward(k, x, rows);
  if (!s.isOk()) return s;
  if (last()) {
    const int64_t classes = layers_->outWidth();
    auto& d = dLogits_[mb];
    d.resize(size_t(rows * classes));
    auto loss = options_.dlrm ? k.sigmoidCrossEntropy(layers_->output(), batch_->labels.data() + firstRowOf(mb), rows,
                                                      d.data())
                              : k.softmaxCrossEntropy(layers_->output(), batch_->classes.data() + firstRowOf(mb), rows,
                                                      classes, d.data());
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
    m.values.assign(layers_->output(), layers_->output() + rows * layers_->outWidth());
    send(std::move(m));
  }
  inFlight_[mb] = layers_->take();
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
  layers_->restore(std::move(act->second));
  inFlight_.erase(act);
  const int64_t rows = rowsOf(mb);
  // (stage 0's input gradient: kept for the caller, at the micro-batch's rows)
  const bool keepInput = first() && options_.inputGradients;
  float* dx = nullptr;
  if (keepInput) {
    dx = inputGrads_.data() + firstRowOf(mb) * layers_->inWidth();
  } else if (!first()) {
    dx_.resize(size_t(rows * layers_->inWidth()));
    dx = dx_.data();
  }
  Status s = layers_->backward(k, last() ? dOut.data() : gradient_.data(), dx, backwards_ > 0);
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
