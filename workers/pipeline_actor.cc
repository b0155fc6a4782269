#include "workers/pipeline_actor.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <thread>

#include <caf/all.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "collectives/communicator.h"
#include "common/check.h"
#include "transport/tensor.h"
#include "workers/messages.h"

namespace troupe::workers {
namespace {

struct StageState {
  std::shared_ptr<PipelineStage> stage;
  caf::actor prev, next;
  bool prevRemote = false, nextRemote = false;
  caf::actor driver;  // of the step under way (the sender of its pipe_step)
  StageLink link;
  StageBatches batches;
  bool holdOptimizer = false;  // data parallelism: step only at pipe_apply
  int64_t reported = 0;  // the last step told to the driver
  // Asks for its weights (or its whole block: weights and optimizer
  // state) after a step it has not stepped to yet.
  struct WeightAsk {
    int64_t step;
    bool state;
    caf::response_promise promise;
  };
  std::vector<WeightAsk> weightWaiters;
  static inline const char* name = "pipeline_stage";
};

using StageSelf = caf::stateful_actor<StageState>;

// Its weights and where they go in the unsplit model, to those who asked
// for them after the step its optimizer took last (or one before).
void answerWeights(StageSelf* self) {
  auto& st = self->state;
  const int64_t applied = st.stage->appliedStep();
  auto& waiters = st.weightWaiters;
  for (auto it = waiters.begin(); it != waiters.end();) {
    if (it->step > applied) {
      ++it;
      continue;
    }
    if (it->step < applied) {
      it->promise.deliver(caf::make_error(caf::sec::runtime_error,
                                          fmt::format("pipeline stage {}: weights of step {} asked for at step {}",
                                                      st.stage->stage(), it->step, applied)));
    } else {
      const DenseParameters& p = st.stage->parameters();
      const size_t floats = size_t(it->state ? p.blockFloats() : p.size());
      it->promise.deliver(st.stage->parameterOffset(),
                          transport::Tensor::copyOf(p.block(), floats * 4, transport::DType::kFloat32));
    }
    it = waiters.erase(it);
  }
}

// Every ask for its weights, refused: its step failed, or it is going.
void refuseWeights(StageSelf* self, const std::string& why) {
  for (auto& ask : self->state.weightWaiters) {
    ask.promise.deliver(caf::make_error(caf::sec::runtime_error,
                                        fmt::format("pipeline stage {} has no weights of step {}: {}",
                                                    self->state.stage->stage(), ask.step, why)));
  }
  self->state.weightWaiters.clear();
}

void tell(StageSelf* self, int64_t step, double loss, const std::string& error) {
  auto& st = self->state;
  if (!error.empty()) refuseWeights(self, error);
  st.reported = step;
  if (st.driver) self->send(st.driver, pipe_done_atom::value, int32_t(st.stage->stage()), step, loss, error);
}

// Runs what the stage can; once its step is done, its optimizer step, and
// the driver is told; an error is told at once (the step is over).
void advance(StageSelf* self, int64_t step) {
  auto& st = self->state;
  PipelineStage& stage = *st.stage;
  auto send = [self](StageMessage&& m) {
    auto& st = self->state;
    const bool forward = m.kind == StageMessage::Kind::kActivation;
    const caf::actor& to = forward ? st.next : st.prev;
    if (forward ? st.nextRemote : st.prevRemote) {
      // Another process: the values go as a raw float32 buffer.
      const int32_t kind = int32_t(m.kind), mb = m.microBatch;
      const int64_t step = m.step, rows = m.rows;
      self->send(to, pipe_act_atom::value, kind, step, mb, rows,
                 transport::Tensor::adopt(std::move(m.values), transport::DType::kFloat32));
      return;
    }
    auto ptr = std::make_shared<const StageMessage>(std::move(m));
    if (st.link) {
      st.link(self, to, std::move(ptr));
    } else {
      self->send(to, std::move(ptr));
    }
  };
  Status s = stage.run(send);
  if (s.isOk() && !stage.stepDone()) return;
  if (s.isOk() && !st.holdOptimizer) {
    s = stage.applyOptimizer();
    if (s.isOk()) answerWeights(self);
  }
  tell(self, step, s.isOk() ? stage.stepLoss() : 0.0, s.isOk() ? std::string() : s.message());
}

// A step refused: its sender is told, and the step under way (its driver)
// is left alone.
void refuse(StageSelf* self, int64_t step, const std::string& why) {
  auto to = caf::actor_cast<caf::actor>(self->current_sender());
  if (to) self->send(to, pipe_done_atom::value, int32_t(self->state.stage->stage()), step, 0.0, why);
}

void begin(StageSelf* self, int64_t step, BatchPtr batch, int64_t lossRows) {
  auto& st = self->state;
  Status s = st.stage->beginStep(step, std::move(batch), lossRows);
  if (!s.isOk()) return refuse(self, step, s.message());
  st.driver = caf::actor_cast<caf::actor>(self->current_sender());
  advance(self, step);
}

// A message from a neighbour: kept for a later step, or dropped (a second
// copy, a step gone), else the stage runs what it can.
void received(StageSelf* self, const StageMessage& m) {
  auto& st = self->state;
  if (!st.stage->deliver(m)) return;
  if (st.reported >= st.stage->currentStep() || st.stage->stepDone()) return;
  advance(self, st.stage->currentStep());
}

caf::behavior stageActor(StageSelf* self, std::shared_ptr<PipelineStage> stage, StageLink link, StageBatches batches,
                         bool holdOptimizer) {
  self->state.stage = std::move(stage);
  self->state.link = std::move(link);
  self->state.batches = std::move(batches);
  self->state.holdOptimizer = holdOptimizer;
  self->set_exit_handler([self](caf::exit_msg& m) {
    refuseWeights(self, "it stopped");
    self->quit(m.reason);
  });
  return {
      [=](pipe_links_atom, caf::actor prev, caf::actor next, bool prevRemote, bool nextRemote) {
        auto& st = self->state;
        st.prev = std::move(prev);
        st.next = std::move(next);
        st.prevRemote = prevRemote;
        st.nextRemote = nextRemote;
      },
      [=](pipe_step_atom, int64_t step, BatchPtr batch, int64_t lossRows) {
        begin(self, step, std::move(batch), lossRows);
      },
      [=](pipe_apply_atom, int64_t step) {
        auto& st = self->state;
        if (!st.holdOptimizer) return refuse(self, step, "told to apply, but this stage applies its own steps");
        if (step != st.stage->currentStep()) {
          return refuse(self, step, fmt::format("told to apply step {} during step {}", step, st.stage->currentStep()));
        }
        Status s = st.stage->applyOptimizer();
        if (!s.isOk()) {
          refuseWeights(self, s.message());
          return refuse(self, step, s.message());
        }
        answerWeights(self);
        st.driver = caf::actor_cast<caf::actor>(self->current_sender());
        tell(self, step, 0.0, std::string());
      },
      [=](pipe_ready_atom) { return int32_t(self->state.stage->stage()); },
      [=](pipe_weights_atom, int64_t step, bool state) {
        auto rp = self->make_response_promise();
        self->state.weightWaiters.push_back(StageState::WeightAsk{step, state, rp});
        answerWeights(self);
        return rp;
      },
      [=](pipe_step_atom, int64_t step) {
        auto& st = self->state;
        BatchPtr batch = st.batches ? st.batches(step) : nullptr;
        if (!batch) return refuse(self, step, fmt::format("no batch for step {} in this process", step));
        begin(self, step, std::move(batch), 0);
      },
      [=](const StageMessagePtr& m) {
        if (m) received(self, *m);
      },
      [=](pipe_act_atom, int32_t kind, int64_t step, int32_t mb, int64_t rows, const transport::Tensor& values) {
        // From another process: its kind and buffer checked before use (the
        // stage checks the rows and width against the micro-batch).
        if ((kind != int32_t(StageMessage::Kind::kActivation) && kind != int32_t(StageMessage::Kind::kGradient)) ||
            values.dtype != transport::DType::kFloat32 || values.bytes % 4 != 0 || rows < 0) {
          return;
        }
        StageMessage m;
        m.kind = StageMessage::Kind(kind);
        m.step = step;
        m.microBatch = mb;
        m.rows = rows;
        m.values.resize(values.bytes / 4);
        if (values.bytes) std::memcpy(m.values.data(), values.data, values.bytes);
        received(self, m);
      },
  };
}

}  // namespace

caf::actor spawnPipelineStage(caf::actor_system& system, std::shared_ptr<PipelineStage> stage, StageLink link,
                              StageBatches batches, bool holdOptimizer) {
  return system.spawn<caf::detached>(stageActor, std::move(stage), std::move(link), std::move(batches),
                                     holdOptimizer);
}

namespace {

std::vector<std::shared_ptr<PipelineStage>> makeStages(std::vector<PipelineStageOptions> options) {
  std::vector<std::shared_ptr<PipelineStage>> out;
  for (auto& o : options) out.push_back(std::make_shared<PipelineStage>(std::move(o)));
  return out;
}

std::vector<caf::actor> spawnAll(caf::actor_system& system, const std::vector<std::shared_ptr<PipelineStage>>& stages,
                                 const StageLink& link, int replicas) {
  if (replicas < 1 || stages.empty() || stages.size() % size_t(replicas) != 0) {
    TROUPE_SETUP_ERROR("pipeline: {} stages do not make {} equal replicas", stages.size(), replicas);
  }
  const size_t p = stages.size() / size_t(replicas);
  for (size_t i = 0; i < stages.size(); ++i) {
    if (stages[i]->stage() != int(i % p) || stages[i]->stages() != int(p)) {
      TROUPE_SETUP_ERROR("pipeline: option {} is stage {} of {}; replica {} needs stage {} of {}", i,
                         stages[i]->stage(), stages[i]->stages(), i / p, i % p, p);
    }
  }
  for (size_t i = p; i < stages.size(); ++i) {
    PipelineStage& a = *stages[i];
    PipelineStage& b = *stages[i % p];  // replica 0's
    if (a.parameterOffset() != b.parameterOffset() || a.parameters().size() != b.parameters().size() ||
        a.microBatches() != b.microBatches() || a.schedule() != b.schedule()) {
      TROUPE_SETUP_ERROR("pipeline: replica {}'s stage {} is not replica 0's (its layers, micro-batches or schedule)",
                         i / p, i % p);
    }
  }
  std::vector<caf::actor> actors;
  for (const auto& s : stages) actors.push_back(spawnPipelineStage(system, s, link, nullptr, replicas > 1));
  for (size_t i = 0; i < actors.size(); ++i) {
    const size_t s = i % p;  // linked within its replica
    caf::anon_send(actors[i], pipe_links_atom::value, s > 0 ? actors[i - 1] : caf::actor(),
                   s + 1 < p ? actors[i + 1] : caf::actor(), false, false);
  }
  return actors;
}

}  // namespace

InProcessPipeline::InProcessPipeline(caf::actor_system& system, std::vector<PipelineStageOptions> stages,
                                     StageLink link, std::chrono::milliseconds stepTimeout, int replicas)
    : replicas_(replicas),
      stages_(makeStages(std::move(stages))),
      actors_(spawnAll(system, stages_, link, replicas)),
      driver_(system, actors_, stepTimeout, replicas) {}

InProcessPipeline::~InProcessPipeline() {
  for (auto& a : actors_) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
}

void InProcessPipeline::loadWeights(const float* model) {
  TROUPE_CHECK(!failed(), "pipeline: weights loaded after a failed step");
  for (auto& s : stages_) std::copy_n(model + s->parameterOffset(), s->parameters().size(), s->parameters().weights());
}

void InProcessPipeline::copyWeights(float* model) const {
  TROUPE_CHECK(!failed(), "pipeline: weights read after a failed step");
  for (int s = 0; s < stages(); ++s) {
    const auto& st = stages_[size_t(s)];
    std::copy_n(st->parameters().weights(), st->parameters().size(), model + st->parameterOffset());
  }
}

int64_t InProcessPipeline::parameterCount() const {
  int64_t n = 0;
  for (int s = 0; s < stages(); ++s) n += stages_[size_t(s)]->parameters().size();
  return n;
}

std::vector<float> InProcessPipeline::inputGradients() const {
  TROUPE_CHECK(!failed(), "pipeline: input gradients read after a failed step");
  std::vector<float> out;
  for (int d = 0; d < replicas_; ++d) {  // (the replicas' shares are the batch's rows in order)
    const auto& g = stages_[size_t(d * stages())]->inputGradients();
    out.insert(out.end(), g.begin(), g.end());
  }
  return out;
}

void InProcessPipeline::setLearningRate(float lr) {
  TROUPE_CHECK(!failed(), "pipeline: learning rate set after a failed step");
  for (auto& s : stages_) s->parameters().setLearningRate(lr);  // every replica's
}

Status InProcessPipeline::sumGradients() {
  const int p = stages();
  for (int s = 0; s < p; ++s) {
    float* sum = stages_[size_t(s)]->parameters().grads();
    const int64_t n = stages_[size_t(s)]->parameters().size();
    for (int d = 1; d < replicas_; ++d) {
      const float* g = stages_[size_t(d * p + s)]->parameters().grads();
      for (int64_t i = 0; i < n; ++i) sum[i] += g[i];
    }
    for (int d = 1; d < replicas_; ++d) std::copy_n(sum, n, stages_[size_t(d * p + s)]->parameters().grads());
  }
  return Status::ok();
}

Expected<BatchPtr> replicaShare(const Batch& b, int replica, int replicas) {
  if (b.rows < 0 || b.denseWidth < 0 || int64_t(b.dense.size()) != b.rows * b.denseWidth ||
      (!b.classes.empty() && int64_t(b.classes.size()) != b.rows) ||
      (!b.labels.empty() && int64_t(b.labels.size()) != b.rows) || replicas < 1 || replica < 0 ||
      replica >= replicas) {
    return Status::invalidArgument(fmt::format("pipeline: a batch of {} rows holds {} features of width {}, {} "
                                               "classes and {} click labels (share {} of {})", b.rows, b.dense.size(),
                                               b.denseWidth, b.classes.size(), b.labels.size(), replica, replicas));
  }
  const int64_t first = b.rows * replica / replicas, rows = b.rows * (replica + 1) / replicas - first;
  auto share = std::make_shared<Batch>();
  share->index = b.index;
  share->firstRow = b.firstRow + first;
  share->rows = rows;
  share->denseWidth = b.denseWidth;
  share->dense.assign(b.dense.begin() + first * b.denseWidth, b.dense.begin() + (first + rows) * b.denseWidth);
  if (!b.classes.empty()) share->classes.assign(b.classes.begin() + first, b.classes.begin() + first + rows);
  if (!b.labels.empty()) share->labels.assign(b.labels.begin() + first, b.labels.begin() + first + rows);
  return BatchPtr(std::move(share));
}

Expected<double> InProcessPipeline::step(int64_t step, BatchPtr batch) {
  if (!batch) return Status::invalidArgument(fmt::format("pipeline: step {} without a batch", step));
  if (replicas_ == 1) return driver_.step(step, {std::move(batch)});
  // Each replica a share of contiguous rows; the loss (and so each
  // gradient) over the whole batch's rows: the shares' gradients add up to
  // the batch's.
  std::vector<BatchPtr> shares;
  for (int d = 0; d < replicas_; ++d) {
    auto share = replicaShare(*batch, d, replicas_);
    if (!share.hasValue()) return Status::invalidArgument(fmt::format("step {}: {}", step, share.status().message()));
    shares.push_back(std::move(*share));
  }
  return driver_.step(step, shares, batch->rows, [this] { return sumGradients(); });
}

PipelineDriver::PipelineDriver(caf::actor_system& system, std::vector<caf::actor> stages,
                               std::chrono::milliseconds stepTimeout, int replicas, bool holdOptimizer,
                               std::vector<std::pair<caf::actor, std::string>> watch, std::vector<int> stageNumbers)
    : system_(system),
      stages_(std::move(stages)),
      timeout_(stepTimeout),
      replicas_(replicas),
      hold_(holdOptimizer || replicas > 1),
      watch_(std::move(watch)),
      numbers_(std::move(stageNumbers)) {
  if (replicas_ < 1 || stages_.empty() || stages_.size() % size_t(replicas_) != 0) {
    TROUPE_SETUP_ERROR("pipeline: {} stage actors do not make {} equal replicas", stages_.size(), replicas_);
  }
}

int PipelineDriver::stageNumber(size_t i) const {
  return i < numbers_.size() ? numbers_[i] : int(i % (stages_.size() / size_t(replicas_)));
}

bool PipelineDriver::awaitAll(caf::scoped_actor& self, int64_t step, std::chrono::steady_clock::time_point deadline,
                              const char* what, double* loss) {
  const size_t p = stages_.size() / size_t(replicas_);
  std::set<size_t> left;
  for (size_t i = 0; i < stages_.size(); ++i) left.insert(i);
  std::string error;
  // One answer a stage: at most stages_.size() answers (and the downs of
  // stages), each wait within the step's deadline.
  for (size_t waits = 0; !left.empty() && error.empty() && waits < 4 * stages_.size(); ++waits) {
    const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    bool timedOut = false;
    self->receive(
        [&](pipe_done_atom, int32_t stage, int64_t doneStep, double stageLoss, const std::string& why) {
          // Which stage: by its handle (replicas, all in this process), or
          // by the number it gives (one pipeline: a stage in another process
          // answers through a proxy of its own, not the one named here).
          const auto from = self->current_sender();
          size_t at = stages_.size();
          for (size_t i = 0; i < stages_.size(); ++i) {
            if (from == stages_[i].address()) at = i;
          }
          // (a number is taken only from a sender in the process of the
          // stage it names, and only for a stage that is not local)
          if (at == stages_.size() && replicas_ == 1 && from && stage >= 0 && size_t(stage) < stages_.size() &&
              from->node() == stages_[size_t(stage)]->node() && stages_[size_t(stage)]->node() != self->node()) {
            at = size_t(stage);
          }
          if (doneStep != step || !left.erase(at)) {
            error = fmt::format("pipeline: a stage answered step {} during step {} ({})", doneStep, step, what);
            return;
          }
          if (!why.empty()) {
            // (a stage's own errors name it already)
            error = why.rfind("pipeline stage", 0) == 0 ? why : fmt::format("pipeline stage {}: {}", stageNumber(at), why);
          }
          if (loss && at % p == p - 1) *loss += stageLoss;
        },
        [&](caf::down_msg& d) {
          for (size_t i = 0; i < stages_.size(); ++i) {
            if (d.source == stages_[i].address()) {
              error = fmt::format("pipeline stage {} went during step {}: {}", stageNumber(i), step,
                                  system_.render(d.reason));
              wentDown_ = true;
            }
          }
          for (const auto& [a, name] : watch_) {
            if (d.source == a.address()) {
              error = fmt::format("pipeline: {} went during step {}: {}", name, step, system_.render(d.reason));
              wentDown_ = true;
            }
          }
        },
        caf::after(std::max(wait, std::chrono::milliseconds(0))) >> [&] { timedOut = true; });
    if (timedOut) {
      std::vector<std::string> named;
      for (size_t i : left) {
        named.push_back(replicas_ > 1 ? fmt::format("{} (replica {})", stageNumber(i), i / p)
                                      : fmt::format("{}", stageNumber(i)));
      }
      // (a stage driven alone waits for its neighbours)
      for (const auto& w : watch_) named.push_back(fmt::format("or {}", w.second));
      error = fmt::format("pipeline: step {} not done within {} ms ({}): stages {} still at work", step,
                          timeout_.count(), what, fmt::join(named, ", "));
      timedOut_ = true;
    }
  }
  if (error.empty() && !left.empty()) error = fmt::format("pipeline: step {}: stray answers ({})", step, what);
  if (!error.empty()) failure_ = error;
  return error.empty();
}

Expected<double> PipelineDriver::step(int64_t step, const std::vector<BatchPtr>& batches, int64_t lossRows,
                                      const std::function<Status()>& between) {
  if (failed()) return Status::internal(fmt::format("pipeline: step {} after a failed step ({})", step, failure_));
  if (!batches.empty() && batches.size() != size_t(replicas_)) {
    return Status::invalidArgument(fmt::format("pipeline: {} batches for {} replicas", batches.size(), replicas_));
  }
  if (replicas_ > 1 && batches.empty()) return Status::invalidArgument("pipeline: replicas take a batch each");
  if (hold_ && !between) return Status::invalidArgument("pipeline: held optimizer steps need a sum of the gradients");
  const size_t p = stages_.size() / size_t(replicas_);
  caf::scoped_actor self{system_};
  // A stage that goes (its process, through a proxy) fails the step at
  // once; the monitors go with the step.
  struct Unwatch {
    caf::scoped_actor& self;
    const std::vector<caf::actor>& stages;
    const std::vector<std::pair<caf::actor, std::string>>& watch;
    ~Unwatch() {
      for (const auto& a : stages) self->demonitor(a);
      for (const auto& w : watch) self->demonitor(w.first);
    }
  } unwatch{self, stages_, watch_};
  for (const auto& w : watch_) self->monitor(w.first);
  for (size_t i = 0; i < stages_.size(); ++i) {
    self->monitor(stages_[i]);
    if (batches.empty()) {
      self->send(stages_[i], pipe_step_atom::value, step);
    } else {
      self->send(stages_[i], pipe_step_atom::value, step, batches[i / p], lossRows);
    }
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  double loss = 0;
  auto failed = [this] {
    return timedOut_ ? Status::timeout(failure_) : wentDown_ ? Status::unavailable(failure_) : Status::internal(failure_);
  };
  if (!awaitAll(self, step, deadline, "forward and backward", &loss)) return failed();
  if (hold_) {
    // Every stage waits for its apply: their gradients can be read and made one here.
    Status s = between();
    if (!s.isOk()) {
      failure_ = fmt::format("pipeline: step {}: the sum of the replicas' gradients: {}", step, s.message());
      timedOut_ = s.code() == Status::Code::kTimeout;
      wentDown_ = s.code() == Status::Code::kUnavailable;
      return failed();
    }
    // (the sum may have taken a while: the optimizer steps get a deadline of their own)
    for (const auto& a : stages_) self->send(a, pipe_apply_atom::value, step);
    if (!awaitAll(self, step, std::chrono::steady_clock::now() + timeout_, "optimizer", nullptr)) return failed();
  }
  return loss;
}

}  // namespace troupe::workers

namespace troupe::workers {

std::string pipelineStageName(int64_t rank) { return fmt::format("pipeline-stage-{}", rank); }

namespace {

std::shared_ptr<PipelineStage> processStage(const ProcessStageOptions& o) {
  auto stage = std::make_shared<PipelineStage>(o.stage);
  const size_t p = size_t(stage->stages());
  if (o.replicaStages.size() != p || o.replicaRanks.size() != p || o.replicas < 1 || o.replica < 0 ||
      o.replica >= o.replicas) {
    TROUPE_SETUP_ERROR("pipeline: a stage of replica {} of {} given {} stage actors and {} ranks for {} stages",
                       o.replica, o.replicas, o.replicaStages.size(), o.replicaRanks.size(), p);
  }
  for (size_t s = 0; s < p; ++s) {
    if (s != size_t(stage->stage()) && !o.replicaStages[s]) {
      TROUPE_SETUP_ERROR("pipeline: stage {} of replica {} has no actor", s, o.replica);
    }
  }
  return stage;
}

// A stage's neighbours among its replica's stages, named for messages.
std::vector<std::pair<caf::actor, std::string>> neighbours(int s, int p, const std::vector<caf::actor>& stages,
                                                           const std::vector<int64_t>& ranks) {
  std::vector<std::pair<caf::actor, std::string>> out;
  if (s > 0) out.emplace_back(stages[size_t(s - 1)], fmt::format("the stage before (worker {})", ranks[size_t(s - 1)]));
  if (s + 1 < p) out.emplace_back(stages[size_t(s + 1)], fmt::format("the stage after (worker {})", ranks[size_t(s + 1)]));
  return out;
}

}  // namespace

ProcessStage::ProcessStage(caf::actor_system& system, ProcessStageOptions options)
    : system_(system),
      stage_(processStage(options)),
      replica_(options.replica),
      replicas_(options.replicas),
      replicaStages_(std::move(options.replicaStages)),
      replicaRanks_(std::move(options.replicaRanks)),
      actor_(spawnPipelineStage(system, stage_, nullptr, nullptr, true)),
      driver_(system, {actor_}, options.stepTimeout, 1, true,
              neighbours(stage_->stage(), stage_->stages(), replicaStages_, replicaRanks_), {stage_->stage()}) {
  const int s = stage(), p = stages();
  caf::anon_send(actor_, pipe_links_atom::value, s > 0 ? replicaStages_[size_t(s - 1)] : caf::actor(),
                 s + 1 < p ? replicaStages_[size_t(s + 1)] : caf::actor(), true, true);
}

ProcessStage::~ProcessStage() { caf::anon_send_exit(actor_, caf::exit_reason::user_shutdown); }

Status ProcessStage::connect(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  caf::scoped_actor self{system_};
  for (int s : {stage() - 1, stage() + 1}) {
    if (s < 0 || s >= stages()) continue;
    // A process that has not published its stage yet drops the ask (no
    // such actor): asked again, 100 ms later, until the deadline (each ask
    // waits at most 500 ms).
    std::string last = "no answer";
    for (;;) {
      bool up = false;
      self->request(replicaStages_[size_t(s)], std::chrono::milliseconds(500), pipe_ready_atom::value)
          .receive([&](int32_t answered) {
                     up = answered == s;
                     if (!up) last = fmt::format("it says it is stage {}", answered);
                   },
                   [&](caf::error& e) { last = system_.render(e); });
      if (up) break;
      if (std::chrono::steady_clock::now() >= deadline) {
        return Status::timeout(fmt::format("pipeline stage {}: stage {} (worker {}) did not answer within {} ms: {}",
                                           stage(), s, replicaRanks_[size_t(s)], timeout.count(), last));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  return Status::ok();
}

int64_t ProcessStage::shareRows(int64_t rows) const {
  return rows * (replica_ + 1) / replicas_ - rows * replica_ / replicas_;
}

Expected<double> ProcessStage::step(int64_t step, const BatchPtr& batch, collectives::Communicator* comm) {
  if (!batch) return Status::invalidArgument(fmt::format("pipeline: step {} without a batch", step));
  auto share = replicaShare(*batch, replica_, replicas_);
  if (!share.hasValue()) return Status::invalidArgument(fmt::format("step {}: {}", step, share.status().message()));
  // The stage's gradients over its replicas, while it waits for its apply.
  auto sum = [this, comm]() -> Status {
    if (!comm || comm->size() == 1) return Status::ok();
    DenseParameters& p = stage_->parameters();
    return comm->allReduce(p.grads(), size_t(p.size()), transport::DType::kFloat32, collectives::ReduceOp::kSum);
  };
  auto loss = driver_.step(step, {std::move(*share)}, batch->rows, sum);
  if (!loss.hasValue() || !last() || !comm || comm->size() == 1) return loss;
  // The last stages' losses are their shares' (over the whole batch's
  // rows): the step's is their sum.
  float total = float(*loss);
  Status s = comm->allReduce(&total, 1, transport::DType::kFloat32, collectives::ReduceOp::kSum);
  if (!s.isOk()) return s.code() == Status::Code::kUnavailable ? Status::unavailable(s.message()) : s;
  return double(total);
}

void ProcessStage::loadWeights(const float* model) {
  TROUPE_CHECK(!failed(), "pipeline: weights loaded after a failed step");
  std::copy_n(model + stage_->parameterOffset(), stage_->parameters().size(), stage_->parameters().weights());
}

void ProcessStage::copyWeights(float* model) const {
  TROUPE_CHECK(!failed(), "pipeline: weights read after a failed step");
  std::copy_n(stage_->parameters().weights(), stage_->parameters().size(), model + stage_->parameterOffset());
}

void ProcessStage::setLearningRate(float lr) {
  TROUPE_CHECK(!failed(), "pipeline: learning rate set after a failed step");
  stage_->parameters().setLearningRate(lr);
}

void ProcessStage::loadState(const float* block, int64_t modelSize, int64_t step) {
  TROUPE_CHECK(!failed(), "pipeline: state loaded after a failed step");
  DenseParameters& p = stage_->parameters();
  const int64_t n = p.size(), at = stage_->parameterOffset(), parts = p.blockFloats() / n;
  for (int64_t k = 0; k < parts; ++k) std::copy_n(block + k * modelSize + at, n, p.block() + k * n);
  stage_->resumeAt(step);  // (its weights are of that step: asks for them are answered at once)
}

Status ProcessStage::gatherWeights(float* model, int64_t step, std::chrono::milliseconds timeout, bool state,
                                   int64_t modelSize) {
  if (failed()) return Status::internal("pipeline: the model gathered after a failed step");
  const auto& o = stage_->options();
  const DenseParameters& mine = stage_->parameters();
  const int64_t parts = state ? mine.blockFloats() / mine.size() : 1;  // weights, then each optimizer slot
  if (state && modelSize < mine.size()) return Status::invalidArgument("pipeline: a model smaller than a stage");
  for (int64_t k = 0; k < parts; ++k) {
    std::copy_n(mine.block() + k * mine.size(), mine.size(), model + k * modelSize + stage_->parameterOffset());
  }
  caf::scoped_actor self{system_};
  for (int s = 0; s < stages(); ++s) {
    if (s == stage()) continue;
    // It answers once its optimizer took the step (all do, one after another).
    const auto slice = mlpStageSlice(o.widths, o.cut, s);
    std::string error;
    self->request(replicaStages_[size_t(s)], timeout, pipe_weights_atom::value, step, state)
        .receive(
            [&](int64_t offset, const transport::Tensor& w) {
              if (offset != slice.first || w.dtype != transport::DType::kFloat32 ||
                  w.bytes != size_t(slice.second * parts) * 4) {
                error = fmt::format("it answered {} bytes of type {} at offset {}; its slice is {} x {} floats at {}",
                                    w.bytes, int(w.dtype), offset, parts, slice.second, slice.first);
                return;
              }
              const float* from = w.as<float>();
              for (int64_t k = 0; k < parts; ++k) {
                std::memcpy(model + k * modelSize + slice.first, from + k * slice.second, size_t(slice.second) * 4);
              }
            },
            [&](caf::error& e) { error = system_.render(e); });
    if (!error.empty()) {
      return Status::unavailable(fmt::format("pipeline stage {}: the {} of stage {} (worker {}) after step {}: {}",
                                             stage(), state ? "weights and optimizer state" : "weights", s,
                                             replicaRanks_[size_t(s)], step, error));
    }
  }
  return Status::ok();
}

}  // namespace troupe::workers
