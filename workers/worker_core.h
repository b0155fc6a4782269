// WorkerCore: the compute of one worker, free of actors so it can be tested
// alone. The worker actor sequences it: for a model with embedding tables,
//   request = core.prepare(batch)            keys to pull, de-duplicated per table
//   reply   = table holder answers the pull
//   push    = core.trainStep(batch, reply)   forward, loss, backward, dense update
//   table holder applies push
// and for a dense-only model (no tables) trainStep(batch, nullptr) does it all.
//
// Embedding gradients are per unique key (summed over the batch), of the mean
// loss over the batch. Dense parameters are updated in place with the dense
// optimizer; embedding rows are updated by whoever applies the push.
//
// Threading: one owner. Kernels run on the core's own compute pool.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "kernels/embedding_bag.h"
#include "kernels/row_optimizer.h"
#include "ps/messages.h"
#include "workers/batch.h"
#include "workers/dlrm_model.h"

namespace troupe::kernels {
class Kernels;
}
namespace troupe::collectives {
class Communicator;
class GradientBuckets;
class CompressedAllReduce;
}

namespace troupe::workers {

class Mlp;
class InProcessPipeline;
class ProcessStage;

// kCount is the exact-count model (chaos draws it to check that nothing is
// lost or applied twice): on DLRM-shaped data (its tables and embedding
// dimension) each step adds to every element of a key's row the times the
// key occurs in the batch, and to each of kCountDense dense parameters the
// batch's rows, by plain SGD at rate 1 (job_setup.h sets the optimizers).
// An evaluation over the training set then counts the keys itself and
// compares every row and the dense parameters with those counts.
enum class ModelKind { kDlrm, kMlp, kCount };
inline constexpr int64_t kCountDense = 8;

struct WorkerCoreOptions {
  ModelKind kind = ModelKind::kDlrm;
  DlrmShape dlrm;                               // kDlrm
  std::vector<int64_t> mlpWidths{784, 256, 128, 10};  // kMlp: input ... classes
  kernels::OptimizerConfig denseOptimizer;
  uint64_t seed = 1;
  int threads = 1;
  int64_t worker = 0;  // this worker's id in push requests
  // PS mode: the dense parameters live on the shards. Every pull also asks
  // for them (the reply's weights replace the local ones before forward),
  // and a step puts its dense gradients into the push instead of applying
  // them.
  bool denseOnServers = false;
  // Kernels shared with other actors of the process; when null the core
  // makes its own with `threads` threads.
  std::shared_ptr<kernels::Kernels> kernels;
  // Synchronous modes (allreduce, hybrid): every rank holds the dense
  // parameters; a step's dense gradients are averaged over the ranks in
  // buckets of bucketBytes, each reduced as soon as backward has produced
  // it, then applied alike on every rank.
  std::shared_ptr<collectives::Communicator> comm;
  int64_t bucketBytes = int64_t{256} << 10;
  // allreduce mode with tables: every rank keeps a replica of the tables. A
  // step's embedding gradients are all-gathered and merged (per key, the
  // mean over ranks, as BSP does) into the push this rank applies locally.
  bool replicatedTables = false;
  // Synchronous modes whose tables are on the shards (hybrid): keep the
  // dense state from before the last step, so that a group formed again
  // after a lost rank can go back one step to where every rank's pushes
  // are (revertLastStep).
  bool keepPrevious = false;
  // kCount: the gradients are multiplied by this, so that a step whose
  // pushes are averaged over the ranks (BSP, allreduce, hybrid: the ranks
  // of the job) still adds the counts.
  double countScale = 1;
  // compression.allreduce: the dense gradients' buckets go through this
  // (collectives/compressed_allreduce.h); null: plain float32. Kept across
  // setCommunicator (its residuals start again when the group changes).
  std::shared_ptr<collectives::CompressedAllReduce> compression;
  // kMlp (or kDlrm: its dense part in 2 stages), pipeline.stages > 1 in one
  // process: each step runs through these
  // stage actors (workers/pipeline_actor.h), which hold the model's weights
  // and optimizer state; the core's own weights are a copy of theirs after
  // every step (evaluation, predictions, the dense hash read them).
  std::shared_ptr<InProcessPipeline> pipeline;
  // kMlp, a pipeline whose stages are the job's processes: this process's
  // stage (workers/pipeline_actor.h), which holds its slice's weights and
  // optimizer state; `comm` is its stage group's (the stage's replicas).
  // The core's own weights are the whole model's, of which only this
  // stage's slice follows the steps; assembleModel makes them whole.
  std::shared_ptr<ProcessStage> stage;
};

// Metrics of one pass over an evaluation set.
struct EvalResult {
  int64_t rows = 0;
  double loss = 0;      // mean log-loss (binary) or cross-entropy (classes)
  double auc = 0;       // binary models
  double accuracy = 0;  // classifiers
  std::vector<float> labels;       // true label (binary) or class
  std::vector<float> predictions;  // click probability or predicted class
  // kCount: the values checked (each row's elements and the dense
  // parameters) and those that differ from the counts; the first few of
  // those, named.
  int64_t countChecked = 0, countWrong = 0;
  std::string countErrors;
};

class WorkerCore final {
 public:
  explicit WorkerCore(const WorkerCoreOptions& options);
  ~WorkerCore();
  WorkerCore(const WorkerCore&) = delete;
  WorkerCore& operator=(const WorkerCore&) = delete;

  bool hasTables() const { return options_.kind != ModelKind::kMlp; }
  // Whether each step pulls from (and pushes to) tables or shards.
  bool needsServer() const { return hasTables() || options_.denseOnServers; }
  const WorkerCoreOptions& options() const { return options_; }

  // The pull for a batch (when needsServer()). create=false for evaluation.
  Expected<ps::PullRequestPtr> prepare(const Batch& batch, bool create);

  // Synchronous modes: whether every rank has a batch for the next step (a
  // collective: each rank calls it once per step, with its batch's rows or
  // 0 without one). The rows of every rank are what the step, once taken,
  // adds to samplesApplied().
  Expected<bool> agreeToStep(int64_t rows);

  // One training step on the batch prepared last (rows: the pull's reply, or
  // nullptr without tables). Returns the push (nullptr without tables).
  Expected<ps::PushRequestPtr> trainStep(const Batch& batch, const ps::PullReplyPtr& rows);

  // Forward only; appends labels and predictions to *eval (call finishEval at the end).
  Status evalStep(const Batch& batch, const ps::PullReplyPtr& rows, EvalResult* eval);
  // Computes the metrics of the accumulated predictions. kCount: compares
  // the values seen with the counts of the evaluation set (the training
  // set) times `epochs`, the passes over it that training took.
  void finishEval(EvalResult* eval, int64_t epochs = 1);

  // A pipeline across processes: the whole model's weights after the steps
  // taken, from the other stages of its replica (a collective of the
  // replica's stages: each answers once its optimizer took the step). A
  // no-op for every other core.
  // state: the optimizer state too (denseState(), for a checkpoint).
  Status assembleModel(std::chrono::milliseconds timeout, bool state = false);
  // After denseState() was written and setPosition called (a checkpoint
  // resumed): a pipeline stage takes its slice of it, of step steps().
  void denseStateLoaded();
  // The rows of `batch` this process trains on (a pipeline across
  // processes: its replica's share of the batch every process reads).
  int64_t trainedRows(const Batch& batch) const;

  int64_t steps() const { return steps_; }
  // Samples whose gradients the steps taken so far applied: of every rank in
  // a synchronous mode (the ledger of an all-reduce job), else this worker's.
  int64_t samplesApplied() const { return samplesApplied_; }
  // Seconds this core waited in collectives (sync modes: the agreement to
  // step, the rest of the gradients' all-reduce after backward, the
  // replicated tables' gather) since it was made, failed ones included
  // (the worker counts a step's share: TrainReport::collectiveSeconds).
  double collectiveSeconds() const { return collectiveSeconds_; }

  // Synchronous modes, after a rank of the group was lost.
  // Whether the last error was a collective's: the step under way was
  // undone (no weight changed, the counters are back), so the worker can
  // take it again in a group formed anew.
  bool collectiveFailed() const { return collectiveFailed_; }
  // The communicator of later steps (nullptr: none until the next; the
  // core holds no other reference to the old one).
  void setCommunicator(std::shared_ptr<collectives::Communicator> comm);
  // [dense weights | optimizer state]: what a rank joining the group copies.
  int64_t denseStateFloats() const;
  float* denseState();
  // keepPrevious: back to before the last step (dense state, step and push
  // counters, samples); false when there is nothing to go back to.
  bool canRevert() const { return hasPrevious_; }
  Status revertLastStep();
  // Sets the step (and push sequence) count and the samples applied: a rank
  // that copied the model of another goes on from there.
  void setPosition(int64_t steps, int64_t samplesApplied);
  int64_t previousSamplesApplied() const { return prevSamples_; }
  // A replacement of a lost worker: its steps (and push sequence numbers,
  // one per step) go on from `steps`, the first the shards have not had.
  void resumeAt(int64_t steps);
  // Scales the dense learning rate of later steps (1 = as configured).
  void setDenseLearningRateScale(double scale);
  // Unique embedding rows pulled for training steps so far (all tables).
  int64_t pulledRows() const { return pulledRows_; }
  // Mean training loss since the last call (and resets it).
  double takeMeanLoss();
  // Multiply-adds per sample of the dense layers (for FLOP accounting).
  int64_t macsPerSample() const;
  int64_t denseParameters() const;
  // Dense weights (for determinism checks and checkpoints).
  const float* denseWeights() const;

 private:
  Status embed(const Batch& batch, const ps::PullReply& rows);
  // A DLRM batch and its pull's reply checked (the rows there, the dense
  // width the model's), then embed.
  Status embedBatch(const Batch& batch, const ps::PullReplyPtr& rows);
  // An MLP batch of the model's input width.
  Status checkMlpBatch(const Batch& batch) const;
  // The bags of all tables of the last embed(), table-major.
  kernels::EmbeddingBags allBags(int64_t rows) const;
  Status forward(const Batch& batch, const ps::PullReplyPtr& rows);
  // Whether a pull's reply has the rows of the batch prepared last.
  Status checkReply(const ps::PullReply* rows) const;
  // kCount: a step's gradients (the counts, negated and scaled), and an
  // evaluation batch's keys counted beside the values pulled.
  Expected<ps::PushRequestPtr> countStep(const Batch& batch);
  Status countEval(const Batch& batch, const ps::PullReply& rows);
  DenseParameters& dense();
  // The push of the step just taken on `samples` rows: this worker, the
  // next sequence number.
  std::shared_ptr<ps::PushRequest> newPush(int64_t samples);
  Expected<ps::PushRequestPtr> trainStepOnce(const Batch& batch, const ps::PullReplyPtr& rows);
  // The DLRM's embedding rows' gradients from dPooled_ (table-major, of the
  // batch embedded last), as the step's push.
  Expected<std::shared_ptr<ps::PushRequest>> embeddingPush(const Batch& batch);
  Status keepPreviousState();
  // Dense gradients of the step averaged over the ranks (sync modes).
  Status finishDenseSync();
  // replicatedTables: every rank's embedding gradients merged into *push.
  Status mergePushes(ps::PushRequest* push);

  WorkerCoreOptions options_;
  std::shared_ptr<kernels::Kernels> kernels_;
  std::unique_ptr<DlrmModel> dlrm_;
  std::unique_ptr<DenseParameters> params_;  // kMlp, kCount: the dense parameters
  std::unique_ptr<Mlp> mlp_;
  std::unique_ptr<collectives::GradientBuckets> buckets_;
  int64_t steps_ = 0;
  int64_t samplesApplied_ = 0;
  double denseLrScale_ = 1;  // setDenseLearningRateScale's
  double collectiveSeconds_ = 0;
  int64_t agreedRows_ = 0;  // every rank's rows of the step agreed on
  bool collectiveFailed_ = false;
  // keepPrevious: the dense state before the last step.
  std::vector<float> previous_;
  bool hasPrevious_ = false;
  int64_t prevSamples_ = 0;
  int64_t pulledRows_ = 0;
  int64_t sequence_ = 0;
  double lossSum_ = 0;
  int64_t lossCount_ = 0;
  // Per-batch scratch.
  std::vector<std::vector<uint64_t>> uniqueKeys_;
  std::vector<std::vector<int64_t>> inverse_;
  std::vector<int64_t> offsets_;
  std::vector<std::vector<uint64_t>> columns_;  // each table's keys of the batch
  std::vector<Status> tableStatus_;
  std::vector<int64_t> rowOffset_;   // first row of each table in allRows_
  std::vector<float> allRows_;       // pulled rows of every table, [sum U_t x dim]
  std::vector<int64_t> allIndices_;  // [tables x rows], into allRows_
  std::vector<float> pooled_, dPooled_, gradRows_;
  std::vector<const float*> pooledPtrs_;
  std::vector<float*> dPooledPtrs_;
  std::vector<float> logits_, dLogits_, probs_;
  // kCount evaluation: per table, each key's occurrences in the passes so
  // far and the value its row had (NaN: its elements differ).
  struct Counted {
    int64_t times = 0;
    float value = 0;
  };
  std::vector<std::unordered_map<uint64_t, Counted>> counted_;
};

}  // namespace troupe::workers
