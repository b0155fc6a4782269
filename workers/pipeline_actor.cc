#include "workers/pipeline_actor.h"

#include <algorithm>
#include <set>

#include <caf/all.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/check.h"
#include "workers/messages.h"

namespace troupe::workers {
namespace {

struct StageState {
  std::shared_ptr<PipelineStage> stage;
  caf::actor prev, next;
  caf::actor driver;  // of the step under way (the sender of its pipe_step)
  StageLink link;
  int64_t reported = 0;  // the last step told to the driver
  static inline const char* name = "pipeline_stage";
};

using StageSelf = caf::stateful_actor<StageState>;

void tell(StageSelf* self, int64_t step, double loss, const std::string& error) {
  auto& st = self->state;
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
    const caf::actor& to = m.kind == StageMessage::Kind::kActivation ? st.next : st.prev;
    auto ptr = std::make_shared<const StageMessage>(std::move(m));
    if (st.link) {
      st.link(self, to, std::move(ptr));
    } else {
      self->send(to, std::move(ptr));
    }
  };
  Status s = stage.run(send);
  if (s.isOk() && !stage.stepDone()) return;
  if (s.isOk()) s = stage.applyOptimizer();
  tell(self, step, s.isOk() ? stage.stepLoss() : 0.0, s.isOk() ? std::string() : s.message());
}

caf::behavior stageActor(StageSelf* self, std::shared_ptr<PipelineStage> stage, StageLink link) {
  self->state.stage = std::move(stage);
  self->state.link = std::move(link);
  return {
      [=](pipe_links_atom, caf::actor prev, caf::actor next) {
        self->state.prev = std::move(prev);
        self->state.next = std::move(next);
      },
      [=](pipe_step_atom, int64_t step, BatchPtr batch) {
        auto& st = self->state;
        st.driver = caf::actor_cast<caf::actor>(self->current_sender());
        Status s = st.stage->beginStep(step, std::move(batch));
        if (!s.isOk()) return tell(self, step, 0.0, s.message());
        advance(self, step);
      },
      [=](const StageMessagePtr& m) {
        auto& st = self->state;
        // (kept for a later step, or dropped: a second copy, a step gone)
        if (!m || !st.stage->deliver(*m)) return;
        if (st.reported >= st.stage->currentStep() || st.stage->stepDone()) return;
        advance(self, st.stage->currentStep());
      },
  };
}

}  // namespace

InProcessPipeline::InProcessPipeline(caf::actor_system& system, std::vector<PipelineStageOptions> stages,
                                     StageLink link, std::chrono::milliseconds stepTimeout)
    : system_(system), timeout_(stepTimeout) {
  for (auto& o : stages) stages_.push_back(std::make_shared<PipelineStage>(std::move(o)));
  for (auto& s : stages_) actors_.push_back(system_.spawn<caf::detached>(stageActor, s, link));
  for (size_t s = 0; s < actors_.size(); ++s) {
    caf::anon_send(actors_[s], pipe_links_atom::value, s > 0 ? actors_[s - 1] : caf::actor(),
                   s + 1 < actors_.size() ? actors_[s + 1] : caf::actor());
  }
}

InProcessPipeline::~InProcessPipeline() {
  for (auto& a : actors_) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
}

void InProcessPipeline::loadWeights(const float* model) {
  TROUPE_CHECK(!failed(), "pipeline: weights loaded after a failed step");
  for (auto& s : stages_) std::copy_n(model + s->parameterOffset(), s->parameters().size(), s->parameters().weights());
}

void InProcessPipeline::copyWeights(float* model) const {
  TROUPE_CHECK(!failed(), "pipeline: weights read after a failed step");
  for (const auto& s : stages_) std::copy_n(s->parameters().weights(), s->parameters().size(), model + s->parameterOffset());
}

int64_t InProcessPipeline::parameterCount() const {
  int64_t n = 0;
  for (const auto& s : stages_) n += s->parameters().size();
  return n;
}

Expected<double> InProcessPipeline::step(int64_t step, BatchPtr batch) {
  if (failed()) return Status::internal(fmt::format("pipeline: step {} after a failed step ({})", step, failure_));
  caf::scoped_actor self{system_};
  for (auto& a : actors_) self->send(a, pipe_step_atom::value, step, batch);
  std::set<int32_t> left;
  for (int32_t s = 0; s < int32_t(actors_.size()); ++s) left.insert(s);
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  double loss = 0;
  std::string error;
  // One answer a stage: at most stages() receives, each within the step's deadline.
  for (size_t i = 0; i < actors_.size() && error.empty(); ++i) {
    const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    bool timedOut = false;
    self->receive(
        [&](pipe_done_atom, int32_t stage, int64_t doneStep, double stageLoss, const std::string& why) {
          if (doneStep != step || !left.erase(stage)) {
            error = fmt::format("pipeline: stage {} answered step {} during step {}", stage, doneStep, step);
            return;
          }
          if (!why.empty()) error = fmt::format("pipeline stage {}: {}", stage, why);
          if (stage == int32_t(actors_.size()) - 1) loss = stageLoss;
        },
        caf::after(std::max(wait, std::chrono::milliseconds(0))) >> [&] { timedOut = true; });
    if (timedOut) {
      failure_ = fmt::format("pipeline: step {} not done within {} ms: stages {} still at work", step, timeout_.count(),
                             fmt::join(left, ", "));
      return Status::timeout(failure_);
    }
  }
  if (!error.empty()) {
    failure_ = error;
    return Status::internal(error);
  }
  return loss;
}

}  // namespace troupe::workers
