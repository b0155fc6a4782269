// runInProcess: a whole training job in one process, every role an actor:
// a loader per data split, the table holder (when the model has tables) and
// the worker. Returns the worker's report once training and the last
// evaluation are done, or the error that stopped the job. Throws SetupError
// (before any actor starts) on a model that cannot be built.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <vector>

#include "common/status.h"
#include "ps/table_holder.h"
#include "workers/batch_source.h"
#include "workers/job_messages.h"
#include "workers/job_setup.h"
#include "workers/worker_actor.h"

namespace troupe::workers {

struct InProcessJob {
  WorkerOptions worker;
  std::shared_ptr<BatchSource> train;
  std::shared_ptr<BatchSource> test;
  ps::TableHolderOptions tables;  // ignored by models without tables
  int prefetch = 4;               // batches the loader reads ahead
  int schedulerThreads = 1;       // CAF scheduler threads (the heavy actors are detached)
  // kMlp: pipeline.stages > 1 runs each step through stage actors
  // (workers/pipeline_actor.h); `cut` as pipelineCut gives it.
  PipelineConfig pipeline;
  std::vector<int> pipelineCut;
  std::chrono::seconds pipelineStepTimeout{300};
  // Evaluations during training (workers/evaluator_actor.h): when, and
  // what gets each point (on the evaluator's thread).
  EvalSchedule evalSchedule;
  std::function<void(const EvalPoint&)> onEvalPoint;
  // train.profile: every kernel call of training timed
  // (kernels/profiling_kernels.h), into TrainReport::kernelProfile.
  bool profile = false;
};

Expected<TrainReport> runInProcess(const InProcessJob& job);

}  // namespace troupe::workers
