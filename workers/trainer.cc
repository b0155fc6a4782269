#include "workers/trainer.h"

#include <caf/all.hpp>

#include "actors/actor_system.h"
#include "common/logging.h"
#include "kernels/kernels.h"
#include "kernels/profiling_kernels.h"
#include "workers/evaluator_actor.h"
#include "workers/loader_actor.h"
#include "workers/messages.h"
#include "workers/pipeline_actor.h"

namespace troupe::workers {

Expected<TrainReport> runInProcess(const InProcessJob& job) {
  // One compute pool for the process: the worker and the table holder share it.
  std::shared_ptr<kernels::Kernels> plain = kernels::createKernels({kernels::Device::kCpu, job.worker.core.threads});
  std::shared_ptr<kernels::Kernels> kernels = plain;
  std::shared_ptr<kernels::ProfilingKernels> profiler;
  if (job.profile) {
    // (The evaluator computes on the plain ones: its calls are not training's.)
    profiler = std::make_shared<kernels::ProfilingKernels>(plain);
    kernels = profiler;
  }
  caf::actor_system_config cfg;
  actors::configureActorSystem(cfg, {job.schedulerThreads});
  caf::actor_system system{cfg};
  // (Declared after the system, so that a pipeline's stage actors are told
  // to go before the system waits for every actor, also on an exception.)
  WorkerCoreOptions coreOptions = job.worker.core;
  coreOptions.kernels = kernels;
  ps::TableHolderOptions tableOptions = job.tables;
  tableOptions.kernels = kernels;
  if (job.pipeline.any() && (coreOptions.kind == ModelKind::kMlp || coreOptions.kind == ModelKind::kDlrm)) {
    // Each stage computes on a share of the threads (at least one).
    const int replicas = job.pipeline.replicas;
    const int threads = std::max(1, job.worker.core.threads / (job.pipeline.stages * replicas));
    auto stages = coreOptions.kind == ModelKind::kMlp
                      ? mlpStageOptions(coreOptions.mlpWidths, job.pipelineCut, job.pipeline.microBatches,
                                        job.pipeline.schedule, coreOptions.denseOptimizer, threads, replicas)
                      : dlrmStageOptions(coreOptions.dlrm, job.pipeline.microBatches, job.pipeline.schedule,
                                         coreOptions.denseOptimizer, threads, replicas);
    coreOptions.pipeline = std::make_shared<InProcessPipeline>(
        system, std::move(stages), nullptr, std::chrono::duration_cast<std::chrono::milliseconds>(job.pipelineStepTimeout),
        replicas);
  }
  auto core = std::make_unique<WorkerCore>(coreOptions);  // throws SetupError on a bad model
  coreOptions.pipeline.reset();  // the core holds it: it goes with the worker
  caf::actor tables;
  if (job.worker.core.kind != ModelKind::kMlp) tables = ps::spawnTableHolder(system, tableOptions);
  WorkerOptions workerOptions = job.worker;
  workerOptions.profiler = profiler;
  caf::actor evaluator;
  if (job.evalSchedule.any()) {
    // (It reads the test set now, before the test loader does.)
    EvaluatorOptions eo;
    eo.core = coreOptions;
    eo.core.kernels = plain;
    eo.test = job.test;
    eo.tables = tables;
    eo.onPoint = job.onEvalPoint;
    evaluator = spawnEvaluator(system, std::move(eo));
    workerOptions.evaluator = evaluator;
    workerOptions.evalSchedule = job.evalSchedule;
  }
  auto trainLoader = spawnLoader(system, job.train, job.prefetch);
  auto testLoader = spawnLoader(system, job.test, job.prefetch);
  auto worker = spawnWorker(system, workerOptions, std::move(core), trainLoader, testLoader, tables);

  Expected<TrainReport> result = Status::internal("training ended without a report");
  {
    // The answer comes when training ends, however long that takes; the
    // wait ends with the worker (every request it makes has a timeout).
    caf::scoped_actor self{system};
    self->monitor(worker);
    self->send(worker, run_atom::value);
    bool answered = false, down = false;
    while (!answered && !down) {
      self->receive([&](TrainReportPtr report) { result = *report, answered = true; },
                    [&](caf::error& err) { result = Status::internal(system.render(err)), answered = true; },
                    [&](caf::down_msg& dm) {
                      down = true;
                      result = Status::internal("the worker stopped: " + system.render(dm.reason));
                    });
    }
    if (!answered) {  // an answer sent just before the worker went is still read
      self->receive([&](TrainReportPtr report) { result = *report; }, [&](caf::error&) {},
                    caf::after(std::chrono::milliseconds(0)) >> [] {});
    }
    for (const auto& a : {trainLoader, testLoader, tables, worker, evaluator}) {
      if (a) self->send_exit(a, caf::exit_reason::user_shutdown);
    }
  }
  return result;
}

}  // namespace troupe::workers
