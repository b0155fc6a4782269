// Pipeline stages as actors (DESIGN.md, Pipeline stages): each stage of a
// cut MLP (workers/pipeline_stage.h) is a CAF actor; activations flow to
// the next stage and gradients back as messages, and an InProcessPipeline
// drives the steps. A stage runs every instruction its inputs allow as
// each message lands, so the order, delay or duplication of messages
// changes when it works, never what it computes.
//
//   (pipe_step_atom, i64 step, BatchPtr, i64 lossRows) -> the stage runs the
//        step and, its instructions done, its optimizer step; then it tells
//        the driver (pipe_done_atom, i32 stage, i64 step, f64 loss, string
//        error). A stage that holds its optimizer (data parallelism) tells
//        the driver first and steps at (pipe_apply_atom, i64 step), then
//        tells it again.
//   (pipe_step_atom, i64 step)            the same from a driver in another
//        process: the stage takes the step's batch from its own source
//   StageMessagePtr                        an activation or a gradient, from
//        a neighbour in this process (the values by ownership)
//   (pipe_act_atom, i32 kind, i64 step, i32 micro-batch, i64 rows, Tensor)
//        the same from a neighbour in another process: the values as a raw
//        float32 buffer (transport/tensor.h), checked like any message
//   (pipe_links_atom, prev, next, bool prevRemote, bool nextRemote)
//        its neighbours (an invalid handle: none), and which are in
//        another process (a proxy, transport/remote_actors.h)
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
using pipe_act_atom = caf::atom_constant<caf::atom("pipeact")>;
using pipe_apply_atom = caf::atom_constant<caf::atom("pipeapply")>;
using StageMessagePtr = std::shared_ptr<const StageMessage>;

// How a stage's message reaches its neighbour: by default a plain send; a
// test's link may delay, duplicate or reorder (no loss: a lost activation
// is a lost stage, handled by supervision).
using StageLink = std::function<void(caf::event_based_actor* self, const caf::actor& to, StageMessagePtr m)>;

// Where a stage in a process of its own takes a step's batch (stage 0 its
// features, the last stage its labels; the others need none): the same
// batch every process reads for that step, or null when it has none.
using StageBatches = std::function<BatchPtr(int64_t step)>;

// A stage actor (detached) for `stage`: its neighbours come by
// pipe_links_atom. The caller keeps `stage` for reading between steps.
caf::actor spawnPipelineStage(caf::actor_system& system, std::shared_ptr<PipelineStage> stage,
                              StageLink link = nullptr, StageBatches batches = nullptr, bool holdOptimizer = false);

// Drives the steps of stage actors wherever they are (a handle or a proxy
// each): `replicas` pipelines of stages.size() / replicas stages, replica by
// replica, stage 0 first. Each step every stage is told to run it on its
// replica's batch (none: the wire form, each stage reads its own), and the
// driver waits, within the timeout, for every stage's pipe_done; a stage
// that goes (its process) fails the step at once. With replicas, the
// stages hold their optimizer steps until `between` has run (the
// replicas' gradients made one) and each is told to apply (pipe_apply_atom).
// A failed step is the driver's end: every later step is refused.
class PipelineDriver final {
 public:
  PipelineDriver(caf::actor_system& system, std::vector<caf::actor> stages, std::chrono::milliseconds stepTimeout,
                 int replicas = 1);
  // `batches`: one a replica, or none (the wire form); `lossRows`: the rows
  // the loss averages over (0: each replica's own). The step's loss: the
  // sum of the replicas' last stages' (each weighted by its rows).
  Expected<double> step(int64_t step, const std::vector<BatchPtr>& batches, int64_t lossRows = 0,
                        const std::function<void()>& between = nullptr);
  bool failed() const { return !failure_.empty(); }

 private:
  // Waits for one pipe_done from every stage: false (and failure_) on an
  // error, a stage gone or the deadline.
  bool awaitAll(caf::scoped_actor& self, int64_t step, std::chrono::steady_clock::time_point deadline,
                const char* what, double* loss);

  caf::actor_system& system_;
  std::vector<caf::actor> stages_;
  std::chrono::milliseconds timeout_;
  int replicas_;
  std::string failure_;
  bool timedOut_ = false;  // the failure was the deadline
};

class InProcessPipeline final {
 public:
  // `replicas` pipelines of the stage options (replica-major: replica d's
  // stage s is options[d * p + s]; each replica the same cut), one actor a
  // stage, each on a thread of its own (a stage computes for as long as its
  // micro-batch takes). With replicas > 1 each step's batch is cut into
  // `replicas` shares of contiguous rows, one a replica, and each stage's
  // gradients are summed over its replicas, in replica order, before every
  // replica's optimizer step (data parallelism: the replicas stay equal).
  // Throws SetupError for options PipelineStage refuses or that do not make
  // `replicas` equal pipelines.
  InProcessPipeline(caf::actor_system& system, std::vector<PipelineStageOptions> stages, StageLink link = nullptr,
                    std::chrono::milliseconds stepTimeout = std::chrono::seconds(120), int replicas = 1);
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
  bool failed() const { return driver_.failed(); }

  // Between steps. stages(): a replica's; stage(s): replica 0's.
  int stages() const { return int(stages_.size()) / replicas_; }
  int replicas() const { return replicas_; }
  PipelineStage& stage(int s, int replica = 0) { return *stages_[size_t(replica * stages() + s)]; }
  // Each stage's weights from (every replica) / into (replica 0's) the
  // unsplit model's buffer (its parameterOffset() slice).
  void loadWeights(const float* model);
  void copyWeights(float* model) const;
  int64_t parameterCount() const;
  // Every replica's stages' (a schedule's, per epoch).
  void setLearningRate(float lr);

 private:
  void sumGradients();  // each stage's, over its replicas, into every replica's

  int replicas_;
  std::vector<std::shared_ptr<PipelineStage>> stages_;  // each read by its actor during a step
  std::vector<caf::actor> actors_;
  PipelineDriver driver_;
};

}  // namespace troupe::workers

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::workers::StageMessagePtr)
