// The worker: an actor that drives training. It asks the loader for batches,
// pulls the rows of their keys from the table holder, runs a WorkerCore step,
// pushes the embedding gradients back, and after each epoch evaluates on the
// test loader.
//
//   (run_atom) -> TrainReportPtr   answered when training ends (or with the error
//                                  that stopped it)
//
// With an evalGate (a job of several workers), see WorkerOptions::evalGate.
// Progress and evaluations are reported through WorkerOptions::onEvent, called
// on the worker's thread. Runs detached: compute blocks only its own thread.
// Every request it makes carries requestTimeout; a timeout fails the run.
//
// Synchronous modes (WorkerOptions::regroup): a collective that fails
// because a rank of the group went down undoes the step (no weight changed)
// and the worker, instead of failing, leaves its group, tells the
// coordinator it is ready (RegroupReady, workers/job_messages.h) and waits
// for the new group (Regroup). Every rank of the new group, the replacement
// of the lost one included, then:
//   1. says how far it got (steps, epoch, steps in the epoch, samples);
//   2. all agree on the step R to go on from: in allreduce mode the
//      furthest a survivor got (a step some survivor finished had every
//      rank's gradient in it); in hybrid mode the least, and no more than
//      the first step of the lost rank the shards lack (every push of the
//      steps before R is at the shards; a survivor one step past R goes
//      back, from the copy it kept; what it pushed again is applied once);
//   3. the lowest survivor at R sends its dense state (and, in allreduce
//      mode, its replica of the tables) to every rank that needs it;
//   4. every rank goes back to R's place in its share of the data (the
//      epoch, and that many batches into it) and takes step R again.
// The same batches, weights and order of reduction make the redone steps
// the same bits as a run without the failure.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <vector>

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include "actors/fault_plan.h"
#include "actors/messages.h"
#include "common/status.h"
#include "kernels/profiling_kernels.h"
#include "workers/eval_schedule.h"
#include "workers/regroup.h"
#include "workers/worker_core.h"

namespace troupe::workers {

struct WorkerEvent {
  enum class Kind { kProgress, kEval } kind = Kind::kProgress;
  int64_t epoch = 0;
  int64_t step = 0;           // global step
  int64_t epochRows = 0;      // rows done in this epoch
  int64_t rowsPerEpoch = 0;
  double meanLoss = 0;        // training loss since the last progress event
  double samplesPerSec = 0;   // training throughput since the start
  double elapsedSec = 0;      // training time so far (evaluations excluded)
  int64_t samples = 0;        // kEval: WorkerCore::samplesApplied at the evaluation
  int64_t mailbox = 0;        // kProgress: messages waiting in the worker actor's mailbox
  const EvalResult* eval = nullptr;  // kEval
};

struct TrainReport {
  int64_t steps = 0;
  int64_t samples = 0;
  int64_t pushesAcked = 0;
  // The ledger: the distinct pushes (sequence numbers) of this rank that
  // every shard acknowledged, those before this process's first one
  // included (the shards had them when it started: it resumed after them).
  int64_t pushesAcknowledged = 0;
  int64_t pulledRows = 0;  // unique embedding rows pulled for training
  int64_t samplesApplied = 0;  // WorkerCore::samplesApplied at the end
  int64_t macsPerSample = 0;
  double trainSeconds = 0;  // training only
  double evalSeconds = 0;
  // Of trainSeconds: waiting for training pulls (request to reply: the
  // shards' consistency gate, the network, the shards' work), and in the
  // collectives of the steps taken (WorkerCore::collectiveSeconds; the
  // agreement to take a step, before it, is not in either).
  double pullWaitSeconds = 0, collectiveSeconds = 0;
  std::vector<EvalResult> evals;  // one per evaluation, last one last
  std::vector<float> denseWeights;
  // WorkerOptions::profiler's figures at the end (train.profile).
  std::vector<kernels::ProfilingKernels::Entry> kernelProfile;
  kernels::ProfilingKernels::Wall kernelWall;
};

struct WorkerOptions {
  WorkerCoreOptions core;
  // train.profile: the kernels of core.kernels, timing their calls; the
  // worker pauses it on its own thread while it evaluates.
  std::shared_ptr<kernels::ProfilingKernels> profiler;
  // Its tables are a PS client (workers/ps_client.h) whose pushes are
  // compressed: a checkpoint copies their residuals (residuals_atom).
  bool pushResiduals = false;
  int64_t epochs = 1;
  int64_t maxSteps = 0;          // 0: no limit
  int64_t progressEverySteps = 50;
  // Also a progress event when this long has passed since the last one (0:
  // by steps only): a job's coordinator hears a live worker step by step.
  std::chrono::milliseconds progressInterval{0};
  bool evaluateEachEpoch = true;  // otherwise only after the last
  double lrDecayPerEpoch = 1.0;   // dense learning rate x this^epoch
  // A pipeline stage's process (WorkerCoreOptions::stage): a step that
  // fails because a peer went (a neighbour stage, a replica of its stage)
  // is the coordinator's to handle, which starts every stage again; the
  // worker waits this long to be stopped, then fails (0: it fails at once).
  std::chrono::seconds awaitRestart{0};
  std::chrono::seconds requestTimeout{600};
  // A job of several workers: before its final evaluation the worker waits
  // for every push to be acknowledged, tells the tables it leaves
  // (leave_atom), and sends the gate a GateRequest (workers/job_messages.h);
  // the gate's GateDecision says whether it evaluates the final model. The
  // wait has no timeout of its own: it lasts while the slowest worker
  // trains, and the gate (the coordinator) going ends the process.
  caf::actor evalGate;
  // Evaluation during training (workers/evaluator_actor.h): at a step
  // boundary where one is due, the worker sends `evaluator` a snapshot
  // (its dense weights copied, unless they live on the shards) and trains
  // on. Null: none.
  caf::actor evaluator;
  EvalSchedule evalSchedule;
  // Faults of the job's plan that this worker fires at its steps
  // (actors/fault_plan.h): kill and stop once it has taken at_step steps,
  // slow from at_step on (each step sleeps before its work: `factor` - 1
  // times a step's work before the slowdown (the least of the last 8), or
  // delay_ms). Each fires once; the worker first tells
  // `faultRecorder` (the coordinator) with `firedAs` (its role, rank and
  // process), and goes on with the fault once that is answered or after
  // faultReportTimeout.
  std::vector<actors::Fault> faults;
  caf::actor faultRecorder;
  actors::FaultFired firedAs;
  std::chrono::milliseconds faultReportTimeout{2000};
  // A replacement of a lost worker: pass over this many training batches
  // of its share (across epochs) before the first step; the core resumes
  // its step count there (WorkerCore::resumeAt).
  int64_t skipBatches = 0;
  // The epoch it starts in (a sync-mode job resumed from a checkpoint: the
  // epoch of the cut; its loader's share starts where the cut is).
  int64_t startEpoch = 0;
  // Sync modes: how the group divides the data (workers/regroup.h); the
  // train loader's share is this rank's part of it.
  DataDivision division;
  // A job with checkpoints: answers CheckpointPause (workers/job_messages.h)
  // at its next step boundary, once every push is acknowledged, with
  // CheckpointPaused{rank, id, steps} to the sender, and trains on at
  // CheckpointResume. A worker that trains no more answers at once. In a
  // sync mode, paused, it answers ModelSnapshot with the group's model
  // (ModelCut), then writes it on a thread of its own (ModelWritten).
  // With compression, paused, it answers ResidualSnapshot with its step,
  // then writes its codecs' residuals (ResidualWritten): the all-reduce's
  // (core.compression) and, with pushResiduals, its PS client's.
  std::function<void(const WorkerEvent&)> onEvent;
  // Synchronous modes: forming the group again after a rank was lost (see
  // above). Without `join`, a failed collective ends the worker.
  struct Regroup {
    // Ends this process's part in the current group (its communicator goes).
    std::function<void()> leave;
    // Joins the group of `nodes` (the node of each rank) at `epoch`.
    std::function<Expected<std::shared_ptr<collectives::Communicator>>(uint64_t epoch,
                                                                        const std::vector<uint64_t>& nodes)>
        join;
    caf::actor coordinator;  // takes RegroupReady, sends Regroup
    std::chrono::seconds timeout{600};  // waiting for the new group
    bool rejoin = false;       // a replacement: it joins the group before its first step
    bool first = false;        // the first group failed as it formed: it waits for the next at step 0
    int64_t shardClock = -1;   // hybrid replacement: its rank's first step the shards lack
    int64_t incarnation = 0;   // which process of its rank this is
    // The nodes of the members of the group this worker's transport found
    // down, said with RegroupReady.
    std::function<std::vector<uint64_t>()> unreachable;
  } regroup;
};

// The core is built by the caller (so set-up errors, thrown as SetupError,
// surface there) and owned by the worker from then on.
caf::actor spawnWorker(caf::actor_system& system, const WorkerOptions& options, std::unique_ptr<WorkerCore> core,
                       caf::actor trainLoader, caf::actor testLoader, caf::actor tables);

}  // namespace troupe::workers
