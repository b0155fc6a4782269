// Pipeline stages as actors (DESIGN.md, Pipeline stages): each stage of a
// cut MLP or DLRM (workers/pipeline_stage.h) is a CAF actor; activations flow to
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
//   (pipe_ready_atom) -> i32 stage         a neighbour's check that it is up
//   (pipe_weights_atom, i64 step, bool state) -> (i64 offset, Tensor)
//        its weights (state: its whole block, the weights then each
//        optimizer slot) once its optimizer has taken step `step` (at once
//        if it has), as a float32 buffer, with where they go in the unsplit
//        model: how a process assembles the model its stage is a slice of
//
// Threading: the driver reads a stage (its parameters, counters) only
// between steps: after its pipe_done and before the next pipe_step.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <caf/actor.hpp>
#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/atom.hpp>
#include <caf/fwd.hpp>

#include "common/status.h"
#include "workers/pipeline_stage.h"

namespace troupe::collectives {
class Communicator;
}

namespace troupe::workers {

using pipe_step_atom = caf::atom_constant<caf::atom("pipestep")>;
using pipe_done_atom = caf::atom_constant<caf::atom("pipedone")>;
using pipe_links_atom = caf::atom_constant<caf::atom("pipelinks")>;
using pipe_act_atom = caf::atom_constant<caf::atom("pipeact")>;
using pipe_apply_atom = caf::atom_constant<caf::atom("pipeapply")>;
using pipe_ready_atom = caf::atom_constant<caf::atom("pipeready")>;
using pipe_weights_atom = caf::atom_constant<caf::atom("pipeweight")>;
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
// `holdOptimizer`: the stages hold their optimizer steps for `between`
// with one replica too (a stage whose replicas are in other processes);
// `watch`: actors besides the stages whose going fails a step at once (the
// neighbours, in other processes, of a stage driven alone), each named.
class PipelineDriver final {
 public:
  PipelineDriver(caf::actor_system& system, std::vector<caf::actor> stages, std::chrono::milliseconds stepTimeout,
                 int replicas = 1, bool holdOptimizer = false,
                 std::vector<std::pair<caf::actor, std::string>> watch = {}, std::vector<int> stageNumbers = {});
  // `batches`: one a replica, or none (the wire form); `lossRows`: the rows
  // the loss averages over (0: each replica's own). The step's loss: the
  // sum of the replicas' last stages' (each weighted by its rows). An error
  // of `between` fails the step. A step failed by a stage or watched actor
  // gone is Unavailable (as is one `between` failed so), by the deadline a
  // Timeout.
  Expected<double> step(int64_t step, const std::vector<BatchPtr>& batches, int64_t lossRows = 0,
                        const std::function<Status()>& between = nullptr);
  bool failed() const { return !failure_.empty(); }

 private:
  // The stage number of stages_[i] in messages (`stageNumbers`, else its
  // place in its replica).
  int stageNumber(size_t i) const;
  // Waits for one pipe_done from every stage: false (and failure_) on an
  // error, a stage gone or the deadline.
  bool awaitAll(caf::scoped_actor& self, int64_t step, std::chrono::steady_clock::time_point deadline,
                const char* what, double* loss);

  caf::actor_system& system_;
  std::vector<caf::actor> stages_;
  std::chrono::milliseconds timeout_;
  int replicas_;
  bool hold_;
  std::vector<std::pair<caf::actor, std::string>> watch_;
  std::vector<int> numbers_;
  std::string failure_;
  bool timedOut_ = false;  // the failure was the deadline
  bool wentDown_ = false;  // the failure was a stage or watched actor gone (Unavailable)
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
  // Stage 0's input gradients (PipelineStageOptions::inputGradients) of the
  // step taken last, every replica's share in row order: [R x its width].
  std::vector<float> inputGradients() const;

 private:
  Status sumGradients();  // each stage's, over its replicas, into every replica's

  int replicas_;
  std::vector<std::shared_ptr<PipelineStage>> stages_;  // each read by its actor during a step
  std::vector<caf::actor> actors_;
  PipelineDriver driver_;
};

// Replica d's share of a batch cut among `replicas`: rows [d R / D,
// (d + 1) R / D) (possibly none), the in-process replicas' cut and the
// processes'. Fails for a batch whose features or labels do not fit its rows.
Expected<BatchPtr> replicaShare(const Batch& batch, int replica, int replicas);

// The name a stage actor of a job's process is published under
// (transport/remote_actors.h), by the process's rank.
std::string pipelineStageName(int64_t rank);

struct ProcessStageOptions {
  PipelineStageOptions stage;      // the stage of its cut this process runs
  int replica = 0, replicas = 1;   // which replica of the pipeline, of how many
  // Every stage of its replica in stage order: the other processes' stage
  // actors (proxies); its own entry is not used. The neighbours' are its
  // links; all of them answer gatherWeights.
  std::vector<caf::actor> replicaStages;
  std::vector<int64_t> replicaRanks;  // the job's rank of each (for messages)
  std::chrono::milliseconds stepTimeout{120000};
};

// One stage of a pipeline whose stages are the processes of a job
// (workers/worker_role.cc: rank r runs stage r % p of replica r / p): its
// stage actor, linked to the neighbours' in the processes of ranks r - 1
// and r + 1, and the driver of its steps in this process. Every process
// reads every batch; a step runs the stage on its replica's share
// (replicaShare), then sums its gradients over the stage's replicas (the
// stage group's communicator; the loss averages over the whole batch, so
// the sum is the batch's mean gradient) and steps its optimizer: every
// replica of a stage holds the same bits, and the job's steps are the
// in-process pipeline's (InProcessPipeline, with `replicas` replicas).
//
// Threading: one owner (the worker actor's core), which may block in step
// and gatherWeights.
class ProcessStage final {
 public:
  // Throws SetupError for options PipelineStage refuses or that do not name
  // every stage of the replica.
  ProcessStage(caf::actor_system& system, ProcessStageOptions options);
  ~ProcessStage();
  ProcessStage(const ProcessStage&) = delete;
  ProcessStage& operator=(const ProcessStage&) = delete;

  // The stage actor, to publish under pipelineStageName(rank).
  const caf::actor& actor() const { return actor_; }
  // Waits until both neighbours answer (their processes may start later
  // than this one): a Timeout naming the one that did not.
  Status connect(std::chrono::milliseconds timeout);
  // Step `step` (1, 2, ...; after loadState, from its step + 1) on the batch every process reads for it: the
  // stage's instructions on this replica's share, the gradients summed
  // over `comm` (the stage's replicas; null or of size 1: this one only),
  // the optimizer step. The step's loss (a last stage's: its replicas'
  // summed over `comm`; 0 for the other stages), or the error: a neighbour
  // or a replica gone (Unavailable), a step not done within the timeout,
  // a failed sum. A failed step is the stage's end (as InProcessPipeline's).
  // With 3 or more replicas the ring sums in another order than the
  // in-process replicas do (equal to rounding, not bit for bit).
  Expected<double> step(int64_t step, const BatchPtr& batch, collectives::Communicator* comm);
  bool failed() const { return driver_.failed(); }

  int stage() const { return stage_->stage(); }
  int stages() const { return stage_->stages(); }
  bool last() const { return stage_->last(); }
  int replica() const { return replica_; }
  int replicas() const { return replicas_; }
  // Its replica's rows of a batch of `rows`.
  int64_t shareRows(int64_t rows) const;
  // Between steps: its slice of the unsplit model's weights from / into
  // `model`, and its slice's size.
  void loadWeights(const float* model);
  void copyWeights(float* model) const;
  int64_t parameterCount() const { return stage_->parameters().size(); }
  void setLearningRate(float lr);
  // The unsplit model's weights after step `step` into `model` (of the whole
  // MLP's size): its own slice, and each other stage's of its replica as
  // that stage answers once its optimizer took step `step`. Fails naming a
  // stage that does not answer within `timeout` or answers a slice that
  // is not its own.
  // state: `model` is the unsplit model's whole block of `modelSize`
  // parameters (DenseParameters: the weights, then each optimizer slot),
  // and every part of it is gathered (a checkpoint's copy).
  Status gatherWeights(float* model, int64_t step, std::chrono::milliseconds timeout, bool state = false,
                       int64_t modelSize = 0);
  // Before its first step: its slice of every part of the unsplit model's
  // block (a resumed checkpoint's, of step `step`); its next step is
  // step + 1.
  void loadState(const float* block, int64_t modelSize, int64_t step);
  // The stage itself, between steps (its counters).
  const PipelineStage& local() const { return *stage_; }

 private:
  caf::actor_system& system_;
  std::shared_ptr<PipelineStage> stage_;
  int replica_, replicas_;
  std::vector<caf::actor> replicaStages_;
  std::vector<int64_t> replicaRanks_;
  caf::actor actor_;
  PipelineDriver driver_;
};

}  // namespace troupe::workers

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::workers::StageMessagePtr)
