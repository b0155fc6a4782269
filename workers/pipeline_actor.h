// Pipeline stages as actors (DESIGN.md, Pipeline stages): each stage of a
// cut MLP (workers/pipeline_stage.h) is a CAF actor; activations flow to
// the next stage and gradients back as messages, and an InProcessPipeline
// drives the steps. A stage runs every instruction its inputs allow as
// each message lands, so the order, delay or duplication of messages
// changes when it works, never what it computes.
//
//   (pipe_step_atom, i64 step, BatchPtr) -> the stage runs the step and, its
//        instructions done, its optimizer step; then it tells the driver
//        (pipe_done_atom, i32 stage, i64 step, f64 loss, string error)
//   StageMessagePtr                        an activation or a gradient
//
// Threading: the driver reads a stage (its parameters, counters) only
// between steps: after its pipe_done and before the next pipe_step.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/atom.hpp>
#include <caf/fwd.hpp>

#include "common/status.h"
#include "workers/pipeline_stage.h"

namespace troupe::workers {

using pipe_step_atom = caf::atom_constant<caf::atom("pipestep")>;
using pipe_done_atom = caf::atom_constant<caf::atom("pipedone")>;
using pipe_links_atom = caf::atom_constant<caf::atom("pipelinks")>;
using StageMessagePtr = std::shared_ptr<const StageMessage>;

// How a stage's message reaches its neighbour: by default a plain send; a
// test's link may delay, duplicate or reorder (no loss: a lost activation
// is a lost stage, handled by supervision).
using StageLink = std::function<void(caf::event_based_actor* self, const caf::actor& to, StageMessagePtr m)>;

class InProcessPipeline final {
 public:
  // One actor per stage option (stage 0 first), each on a thread of its own
// (a stage computes for as long as its micro-batch takes). Throws SetupError for
  // options PipelineStage refuses.
  InProcessPipeline(caf::actor_system& system, std::vector<PipelineStageOptions> stages, StageLink link = nullptr,
                    std::chrono::milliseconds stepTimeout = std::chrono::seconds(120));
  ~InProcessPipeline();
  InProcessPipeline(const InProcessPipeline&) = delete;
  InProcessPipeline& operator=(const InProcessPipeline&) = delete;

  // Runs step `step` (1, 2, ...) on `batch`: every stage's instructions,
  // then every stage's optimizer step. The step's loss, or the first
  // stage's error; a step not done within the timeout is a Timeout naming
  // the stages still at work. A failed step is the pipeline's end: some
  // stages may still be at work and others have stepped their optimizer,
  // so every later step is refused (the caller ends, as a lost stage would;
  // supervision restarts it) and the stages must not be read.
  Expected<double> step(int64_t step, BatchPtr batch);
  bool failed() const { return !failure_.empty(); }

  // Between steps.
  int stages() const { return int(stages_.size()); }
  PipelineStage& stage(int s) { return *stages_[size_t(s)]; }
  // Each stage's weights from / into the unsplit model's buffer (its
  // parameterOffset() slice).
  void loadWeights(const float* model);
  void copyWeights(float* model) const;
  int64_t parameterCount() const;

 private:
  caf::actor_system& system_;
  std::vector<std::shared_ptr<PipelineStage>> stages_;  // each read by its actor during a step
  std::vector<caf::actor> actors_;
  std::chrono::milliseconds timeout_;
  std::string failure_;  // the failed step's error: none may follow
};

}  // namespace troupe::workers

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::workers::StageMessagePtr)
