#include "workers/worker_actor.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <functional>
#include <optional>
#include <cmath>
#include <thread>

#include <caf/all.hpp>

#include "actors/fault_injector.h"
#include "ps/applied_window.h"
#include "collectives/communicator.h"
#include "common/logging.h"
#include "common/mailbox.h"
#include "ps/messages.h"
#include "ps/table_holder.h"
#include "ps/wire.h"
#include "workers/evaluator_actor.h"
#include "workers/job_messages.h"
#include "workers/messages.h"
#include "workers/model_image.h"
#include "workers/ps_client.h"
#include "workers/residual_image.h"
#include "workers/regroup.h"

namespace troupe::workers {
namespace {

using Clock = std::chrono::steady_clock;
using regroup_timeout_atom = caf::atom_constant<caf::atom("regrouptim")>;

double secondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct WorkerState {
  WorkerOptions options;
  std::shared_ptr<WorkerCore> core;
  caf::actor trainLoader, testLoader, tables;
  caf::typed_response_promise<TrainReportPtr> done;
  std::shared_ptr<TrainReport> report = std::make_shared<TrainReport>();
  int64_t epoch = 0;
  int64_t epochRows = 0;
  int64_t rowsPerEpoch = 0;
  double trainSeconds = 0;
  Clock::time_point stepStart;
  double collectiveAtStart = 0;  // the core's collective seconds at stepStart
  // The work of the last few steps that went through (a slow fault's
  // factor multiplies the least: in a sync mode a step's time also holds the
  // wait for the others in its collective, least when nobody is slow).
  std::deque<double> recentWork;
  std::vector<bool> faultFired;  // per WorkerOptions::faults
  // Per slow fault with a factor: the step work it multiplies, taken once
  // as it starts (the work of a later step may hold a wait for another
  // slow rank, and would feed on itself).
  std::vector<double> slowBase;
  Clock::time_point lastEvent = Clock::now();
  EvalResult eval;
  Clock::time_point evalStart;
  bool finished = false;
  int64_t pushesInFlight = 0;
  // The sequences acknowledged (the ledger): every one below this
  // process's first push counts, as the shards had those already.
  std::optional<ps::AppliedWindow> acknowledged;
  bool gatePassed = false;
  bool awaitingGate = false;
  int64_t toSkip = 0;  // batches still to pass over (a replacement)
  // A checkpoint: paused at a step boundary (or on the way there).
  int64_t pauseId = -1;
  int64_t pauseAt = -1;  // the boundary to stop at (-1: the next)
  int64_t passed = -1;   // the last step boundary it went past (steps() there)
  caf::actor pauser;
  bool paused = false;
  bool trainingOver = false;  // past the last training step
  std::function<void()> whenDrained;  // runs once every push is acknowledged
  int64_t epochSteps = 0;  // steps taken (or passed over) in this epoch
  // Sync modes: waiting for the group to form again (see the header).
  bool regrouping = false;
  int64_t regroupToken = 0;
  // Bumped when the worker leaves a step it waits on (RegroupNow): what it
  // asked for before is dropped when the answer comes.
  int64_t attempt = 0;
  int64_t groupEpoch = 0;  // of the group this worker formed last
  DataDivision division;   // sync modes: how its group divides the data
  bool running = false;    // run_atom came
  // The last snapshot handed to the evaluator: its step and training seconds.
  int64_t snapshotStep = 0;
  double snapshotSeconds = 0;
  bool evaluatorDrained = false;  // asked, at the end of training
  // Sync modes: writes the model of a checkpoint beside training.
  std::unique_ptr<std::thread> writer;
  // Compression: writes the codecs' residuals of a checkpoint beside training.
  std::unique_ptr<std::thread> residualWriter;
  ~WorkerState() {
    if (writer && writer->joinable()) writer->join();
    if (residualWriter && residualWriter->joinable()) residualWriter->join();
  }
  static inline const char* name = "worker";
};

using Self = caf::stateful_actor<WorkerState>;

void fail(Self* self, const caf::error& err) {
  auto& st = self->state;
  if (st.finished) return;
  logger("worker")->error("worker {} stops: {}", st.core->options().worker, caf::to_string(err));
  st.finished = true;
  st.done.deliver(err);
  self->quit(err);
}

void fail(Self* self, const Status& s) { fail(self, caf::make_error(caf::sec::runtime_error, s.toString())); }

void startEpoch(Self* self);
void nextTrainBatch(Self* self);
void evaluate(Self* self);
void enterRegroup(Self* self, const Status& why);
bool canRegroup(Self* self) {
  return self->state.options.regroup.join && self->state.core->collectiveFailed();
}

// A step (or the agreement to take one) failed: the group forms again
// (sync modes), the job restarts the pipeline (a stage whose peer went),
// or the worker fails.
void stepFailed(Self* self, const Status& why) {
  auto& st = self->state;
  if (canRegroup(self)) return enterRegroup(self, why);
  if (st.options.awaitRestart.count() > 0 && st.core->collectiveFailed() && !st.regrouping) {
    logger("worker")->warn("worker {}: {}; it waits for the job to start every stage again",
                           st.core->options().worker, why.message());
    st.regrouping = true;  // (no step, checkpoint or group from now on)
    ++st.attempt;
    st.whenDrained = nullptr;
    self->delayed_send(self, st.options.awaitRestart, regroup_timeout_atom::value, ++st.regroupToken);
    return;
  }
  fail(self, why);
}

void finish(Self* self) {
  auto& st = self->state;
  st.finished = true;
  st.report->steps = st.core->steps();
  st.report->trainSeconds = st.trainSeconds;
  st.report->pulledRows = st.core->pulledRows();
  st.report->samplesApplied = st.core->samplesApplied();
  st.report->macsPerSample = st.core->macsPerSample();
  if (!st.acknowledged) st.acknowledged.emplace(st.core->steps(), std::vector<int64_t>{});  // it pushed nothing
  st.report->pushesAcknowledged = st.acknowledged->floor() + int64_t(st.acknowledged->early());
  const float* w = st.core->denseWeights();
  st.report->denseWeights.assign(w, w + st.core->denseParameters());
  if (st.options.profiler) {
    auto profile = st.options.profiler->snapshot();
    st.report->kernelProfile = std::move(profile.entries);
    st.report->kernelWall = profile.wall;
  }
  st.done.deliver(TrainReportPtr(st.report));
  self->quit();
}

// A progress event when one is due: every progressEverySteps steps
// (`stepDue`), or progressInterval after the last.
void reportProgress(Self* self, bool stepDue) {
  auto& st = self->state;
  const auto now = Clock::now();
  const bool timeDue = st.options.progressInterval.count() > 0 && now - st.lastEvent >= st.options.progressInterval;
  if (!st.options.onEvent || !(stepDue || timeDue)) return;
  st.lastEvent = now;
  WorkerEvent e;
  e.epoch = st.epoch;
  e.step = st.core->steps();
  e.epochRows = st.epochRows;
  e.rowsPerEpoch = st.rowsPerEpoch;
  e.meanLoss = st.core->takeMeanLoss();  // NaN while a replacement passes over batches
  e.elapsedSec = st.trainSeconds;
  e.samplesPerSec = st.trainSeconds > 0 ? double(st.report->samples) / st.trainSeconds : 0;
  e.mailbox = mailboxDepth(self);
  st.options.onEvent(e);
}

void afterStep(Self* self, const Batch& batch) {
  auto& st = self->state;
  st.trainSeconds += secondsSince(st.stepStart);
  st.report->collectiveSeconds += st.core->collectiveSeconds() - st.collectiveAtStart;
  st.report->samples += st.core->trainedRows(batch);
  st.epochRows += batch.rows;
  ++st.epochSteps;
  const int64_t step = st.core->steps();
  reportProgress(self, step % st.options.progressEverySteps == 0);
  if (st.options.evaluator && st.options.evalSchedule.due(step, st.trainSeconds, st.snapshotStep,
                                                                   st.snapshotSeconds)) {
    st.snapshotStep = step;
    st.snapshotSeconds = st.trainSeconds;
    auto snap = std::make_shared<EvalSnapshot>();
    snap->epoch = st.epoch;
    snap->step = step;
    // Every rank's in a sync mode (and one process); in ps mode this
    // worker's rows, as its progress reports count them (the coordinator
    // adds the others').
    snap->samples = st.core->options().denseOnServers ? st.rowsPerEpoch * st.epoch + st.epochRows
                                                      : st.core->samplesApplied();
    snap->trainSeconds = st.trainSeconds;
    if (!st.core->options().denseOnServers) {
      const float* w = st.core->denseWeights();
      snap->dense.assign(w, w + st.core->denseParameters());
    }
    self->send(st.options.evaluator, EvalSnapshotPtr(std::move(snap)));
  }
  if (st.options.maxSteps > 0 && step >= st.options.maxSteps) {
    evaluate(self);
  } else {
    nextTrainBatch(self);
  }
}

// Tells the coordinator that fault `i` of the plan fires at this step;
// `then` runs once it is answered (or not, in time).
void reportFault(Self* self, size_t i, int64_t step, std::function<void()> then) {
  auto& st = self->state;
  st.faultFired[i] = true;
  actors::FaultFired x = st.options.firedAs;
  x.fault = st.options.faults[i].id;
  x.step = step;
  if (!st.options.faultRecorder) return then();
  self->request(st.options.faultRecorder, st.options.faultReportTimeout, x)
      .then([then](int64_t) { then(); },
            [then, id = x.fault](caf::error& err) {
              logger("worker")->warn("fault {}: the coordinator did not take its report ({}); it fires all the same",
                                     id, caf::to_string(err));
              then();
            });
}

// At a step boundary: fires a kill or stop fault that is due (true: the
// step waits for it).
bool fireStepFault(Self* self) {
  auto& st = self->state;
  for (size_t i = 0; i < st.options.faults.size(); ++i) {
    const actors::Fault& f = st.options.faults[i];
    if (st.faultFired[i] || f.kind == actors::FaultKind::kSlow || st.core->steps() < f.atStep) continue;
    // (kill-actor: the step waits; the actor killed ends this worker.)
    const int64_t attempt = st.attempt;
    reportFault(self, i, st.core->steps(), [=] {
      if (f.kind == actors::FaultKind::kKill) actors::killThisProcess(f.id);
      if (f.kind == actors::FaultKind::kKillActor) {
        // One of this rank's actors dies; its supervisor finds it down.
        auto& st = self->state;
        const caf::actor target = f.actor == "train-loader" ? st.trainLoader
                                  : f.actor == "test-loader" ? st.testLoader
                                  : f.actor == "tables"      ? st.tables
                                                             : caf::actor_cast<caf::actor>(self);
        if (target) return actors::killActor(f.id, f.actor, target);
        logger("worker")->warn("fault {}: kill-actor: this worker has no '{}' actor", f.id, f.actor);
        return nextTrainBatch(self);
      }
      actors::stopThisProcess(f.id, std::chrono::milliseconds(std::llround(f.durationSeconds * 1000)));
      if (self->state.attempt == attempt && !self->state.finished) nextTrainBatch(self);
    });
    return true;
  }
  return false;
}

// The time a slow fault adds to step `step` (`work`: the least work of the
// last steps, in seconds; 0 before the process's first step, which a factor
// leaves as it is).
std::chrono::microseconds slowDelay(Self* self, int64_t step, double work) {
  auto& st = self->state;
  std::chrono::microseconds delay{0};
  for (size_t i = 0; i < st.options.faults.size(); ++i) {
    const actors::Fault& f = st.options.faults[i];
    if (!actors::slowsStep(f, step)) continue;
    if (!st.faultFired[i]) reportFault(self, i, step, [] {});
    if (st.slowBase[i] <= 0) st.slowBase[i] = std::min(work, 3600.0);
    delay += actors::slowDelayOf(f, st.slowBase[i]);
  }
  return delay;
}

void trainOn(Self* self, BatchPtr batch, ps::PullReplyPtr rows) {
  auto& st = self->state;
  // A slow fault's sleep comes before the step's work, as a slow machine's
  // would (in a sync mode the others wait for it inside the step's
  // collective); a factor multiplies the last step's work.
  const double base = st.recentWork.empty() ? 0.0 : *std::min_element(st.recentWork.begin(), st.recentWork.end());
  const auto delay = slowDelay(self, st.core->steps(), base);
  if (delay.count() > 0) std::this_thread::sleep_for(delay);
  const auto workStart = Clock::now();
  auto push = st.core->trainStep(*batch, rows);
  if (push.hasValue()) {
    st.recentWork.push_back(secondsSince(workStart));
    if (st.recentWork.size() > 8) st.recentWork.pop_front();
  }
  if (!push.hasValue()) return stepFailed(self, push.status());
  if (*push) {
    // The holder applies pushes and pulls in arrival order, so the next pull
    // sees this update; the acknowledgement is only counted.
    const int64_t attempt = st.attempt;
    const int64_t sequence = (*push)->sequence;
    if (!st.acknowledged) st.acknowledged.emplace(sequence, std::vector<int64_t>{});
    auto drained = [=] {
      auto& st = self->state;
      if (--st.pushesInFlight == 0 && st.whenDrained) {
        auto next = std::move(st.whenDrained);
        st.whenDrained = nullptr;
        next();
      }
    };
    self->request(st.tables, st.options.requestTimeout, ps::push_atom::value, *push)
        .then(
            [=](int64_t) {
              ++self->state.report->pushesAcked;
              self->state.acknowledged->insert(sequence);
              drained();
            },
            [=](caf::error& err) {
              // A push of a step this worker left for the group to form
              // again (the shards may have undone that step): not its failure.
              if (self->state.attempt == attempt && !self->state.regrouping) return fail(self, err);
              drained();
            });
    ++st.pushesInFlight;
  }
  afterStep(self, *batch);
}

// At a step boundary: stops there for a checkpoint when one is asked for,
// once every push is acknowledged (the shards then hold every step taken).
bool pauseHere(Self* self) {
  auto& st = self->state;
  if (st.pauseId < 0 || (st.pauseAt >= 0 && st.core->steps() < st.pauseAt)) return false;
  if (st.pushesInFlight > 0) {
    st.whenDrained = [=] { nextTrainBatch(self); };
    return true;
  }
  if (!st.paused) {
    st.paused = true;
    self->send(st.pauser, CheckpointPaused{st.core->options().worker, st.pauseId, st.core->steps(), false});
  }
  return true;
}

void nextTrainBatch(Self* self) {
  auto& st = self->state;
  if (pauseHere(self)) return;
  if (fireStepFault(self)) return;
  st.passed = st.core->steps();
  const int64_t attempt = st.attempt;
  self->request(st.trainLoader, st.options.requestTimeout, next_atom::value)
      .then(
          [=](BatchPtr batch) {
            auto& st = self->state;
            if (st.attempt != attempt) return;  // left for the group to form again
            if (st.toSkip > 0) {
              // A replacement passes over what its rank trained before.
              if (batch) {
                --st.toSkip;
                ++st.epochSteps;
                st.epochRows += batch->rows;
                reportProgress(self, false);  // still alive to the coordinator over a long share
                return nextTrainBatch(self);
              }
              if (st.epoch + 1 < st.options.epochs) {
                ++st.epoch;
                return startEpoch(self);
              }
              st.toSkip = 0;  // the rank had trained its whole share
              return evaluate(self);
            }
            if (st.options.regroup.join && !st.core->options().comm) {
              return enterRegroup(self, Status::unavailable("it has no group"));  // never trains alone
            }
            if (st.core->options().comm) {
              // Synchronous modes: a step only when every rank has a batch
              // (ranks may hold one batch more or less of an epoch).
              auto go = st.core->agreeToStep(batch ? batch->rows : 0);
              if (!go.hasValue()) return stepFailed(self, go.status());
              if (!*go) return evaluate(self);
            }
            if (!batch) return evaluate(self);
            // (the step's time, and its collectives', from here: not the agreement to take it)
            st.stepStart = Clock::now();
            st.collectiveAtStart = st.core->collectiveSeconds();
            if (!st.core->needsServer()) return trainOn(self, batch, nullptr);
            auto pull = st.core->prepare(*batch, true);
            if (!pull.hasValue()) return fail(self, pull.status());
            const auto pullStart = Clock::now();
            self->request(st.tables, st.options.requestTimeout, ps::pull_atom::value, *pull)
                .then(
                    [=](ps::PullReplyPtr rows) {
                      if (self->state.attempt != attempt) return;  // (left for the group to form again)
                      self->state.report->pullWaitSeconds += secondsSince(pullStart);
                      trainOn(self, batch, rows);
                    },
                    [=](caf::error& err) {
                      if (self->state.attempt == attempt) fail(self, err);
                    });
          },
          [=](caf::error& err) {
            if (self->state.attempt == attempt) fail(self, err);
          });
}

void evalBatch(Self* self, BatchPtr batch, ps::PullReplyPtr rows);

void nextEvalBatch(Self* self) {
  auto& st = self->state;
  self->request(st.testLoader, st.options.requestTimeout, next_atom::value)
      .then(
          [=](BatchPtr batch) {
            auto& st = self->state;
            if (!batch) {
              st.core->finishEval(&st.eval, st.epoch + 1);
              st.report->evalSeconds += secondsSince(st.evalStart);
              if (st.options.profiler) st.options.profiler->pauseThisThread(false);
              st.report->evals.push_back(std::move(st.eval));
              st.eval = EvalResult{};
              if (st.options.onEvent) {
                WorkerEvent e;
                e.kind = WorkerEvent::Kind::kEval;
                e.epoch = st.epoch;
                e.step = st.core->steps();
                e.elapsedSec = st.trainSeconds;
                e.samples = st.core->samplesApplied();
                e.eval = &st.report->evals.back();
                st.options.onEvent(e);
              }
              const bool stepsDone = st.options.maxSteps > 0 && st.core->steps() >= st.options.maxSteps;
              if (!st.gatePassed && ++st.epoch < st.options.epochs && !stepsDone) return startEpoch(self);
              return finish(self);
            }
            if (!st.core->needsServer()) return evalBatch(self, batch, nullptr);
            auto pull = st.core->prepare(*batch, false);
            if (!pull.hasValue()) return fail(self, pull.status());
            self->request(st.tables, st.options.requestTimeout, ps::pull_atom::value, *pull)
                .then([=](ps::PullReplyPtr rows) { evalBatch(self, batch, rows); },
                      [=](caf::error& err) { fail(self, err); });
          },
          [=](caf::error& err) { fail(self, err); });
}

void evalBatch(Self* self, BatchPtr batch, ps::PullReplyPtr rows) {
  Status s = self->state.core->evalStep(*batch, rows, &self->state.eval);
  if (!s.isOk()) return fail(self, s);
  nextEvalBatch(self);
}

void startEvaluation(Self* self);

// The gate decides whether this worker evaluates the final model.
void askGate(Self* self) {
  auto& st = self->state;
  st.awaitingGate = true;
  self->send(st.options.evalGate,
             GateRequest{st.core->options().worker, st.core->steps(), st.report->samples, st.trainSeconds});
}

// Before the final evaluation of a job with a gate: every push acknowledged,
// the tables told this worker trains no more, then the gate decides.
// At the end of training: once every snapshot handed to the evaluator was
// evaluated (or replaced by a later one), `then` runs; an evaluator that
// does not answer in time is left to be stopped with the process. True:
// `then` runs later.
bool drainEvaluator(Self* self, std::function<void()> then) {
  auto& st = self->state;
  if (!st.options.evaluator || st.evaluatorDrained) return false;
  st.evaluatorDrained = true;
  self->request(st.options.evaluator, st.options.requestTimeout, drain_atom::value)
      .then([then](int64_t) { then(); },
            [=](caf::error& err) {
              logger("worker")->warn("worker {}: the evaluations during training did not finish: {}",
                                     self->state.core->options().worker, caf::to_string(err));
              then();
            });
  return true;
}

void passGate(Self* self) {
  auto& st = self->state;
  if (st.pauseId >= 0 && st.pushesInFlight == 0) {
    // A checkpoint waits for this worker, which trains no more: it answers.
    self->send(st.pauser, CheckpointPaused{st.core->options().worker, st.pauseId, st.core->steps(), false, true});
    st.pauseId = -1;
    st.pauseAt = -1;
  }
  st.trainingOver = true;  // (from here no regroup takes it back to training)
  if (drainEvaluator(self, [=] { passGate(self); })) return;
  if (st.pushesInFlight > 0) {
    st.whenDrained = [=] { passGate(self); };
    return;
  }
  if (!st.tables) return askGate(self);  // nothing to leave (a dense model trained by all-reduce)
  self->request(st.tables, st.options.requestTimeout, ps::leave_atom::value)
      .then([=](int64_t) { askGate(self); }, [=](caf::error& err) { fail(self, err); });
}

void evaluate(Self* self) {
  auto& st = self->state;
  const bool last = st.epoch + 1 >= st.options.epochs ||
                    (st.options.maxSteps > 0 && st.core->steps() >= st.options.maxSteps);
  // One process (no gate): every snapshot evaluated before the final
  // evaluation (a job's worker drains at its gate, past any regroup).
  if (last && !st.options.evalGate && drainEvaluator(self, [=] { evaluate(self); })) return;
  if (!st.options.evaluateEachEpoch && !last) {
    ++st.epoch;
    return startEpoch(self);
  }
  if (last) {
    // A pipeline stage's process: the whole model, for the evaluation and
    // the report (a no-op for other cores).
    Status s = st.core->assembleModel(st.options.requestTimeout);
    if (!s.isOk()) return fail(self, s);
  }
  if (last && st.options.evalGate) return passGate(self);
  startEvaluation(self);
}

void startEvaluation(Self* self) {
  auto& st = self->state;
  st.evalStart = Clock::now();
  if (st.options.profiler) st.options.profiler->pauseThisThread(true);
  self->request(st.testLoader, st.options.requestTimeout, epoch_atom::value, st.epoch)
      .then([=](int64_t) { nextEvalBatch(self); }, [=](caf::error& err) { fail(self, err); });
}

void startEpoch(Self* self) {
  auto& st = self->state;
  st.epochRows = 0;
  st.epochSteps = 0;
  st.core->setDenseLearningRateScale(std::pow(st.options.lrDecayPerEpoch, double(st.epoch)));
  const int64_t attempt = st.attempt;
  self->request(st.trainLoader, st.options.requestTimeout, epoch_atom::value, st.epoch)
      .then(
          [=](int64_t rows) {
            if (self->state.attempt != attempt) return;
            self->state.rowsPerEpoch = rows;
            nextTrainBatch(self);
          },
          [=](caf::error& err) {
            if (self->state.attempt == attempt) fail(self, err);
          });
}

// ---------------------------------------------------------------- regrouping

// Sync modes: the group failed (a rank went down); this worker leaves it and
// waits for the coordinator to name the new one.
void enterRegroup(Self* self, const Status& why) {
  auto& st = self->state;
  const int64_t rank = st.core->options().worker;
  const bool replacement = st.options.regroup.rejoin;
  if (replacement) {
    logger("worker")->info("worker {} replaces a lost one: it waits for the group to form again", rank);
  } else {
    logger("worker")->warn("worker {}: its group failed at step {} ({}); the step is undone, and it waits for the "
                           "group to form again",
                           rank, st.core->steps() + 1, why.message());
  }
  st.regrouping = true;
  ++st.attempt;  // what it asked for in the old group is dropped when the answer comes
  st.whenDrained = nullptr;  // a step boundary of the old group (a checkpoint's pause) is no more
  st.core->setCommunicator(nullptr);
  if (st.options.regroup.leave) st.options.regroup.leave();
  std::vector<uint64_t> unreachable;
  if (st.options.regroup.unreachable) unreachable = st.options.regroup.unreachable();
  self->send(st.options.regroup.coordinator,
             RegroupReady{rank, replacement ? -1 : st.core->steps(), st.options.regroup.incarnation, unreachable});
  self->delayed_send(self, st.options.regroup.timeout, regroup_timeout_atom::value, ++st.regroupToken);
}


// The tables of the lowest survivor, to every rank (the replica of an
// allreduce-mode DLRM); ranks with `load` put them in their holder.
Status copyTables(Self* self, collectives::Communicator& comm, int source, bool load, int64_t floor) {
  auto& st = self->state;
  const int64_t rank = st.core->options().worker;
  caf::scoped_actor ask{self->system()};
  ps::TableImagesPtr held;            // the source's copy (read only: its bytes go out)
  std::vector<ps::TableImage> got;    // what the others receive
  std::string error;
  const int64_t tables = st.core->options().dlrm.numTables;
  if (comm.rank() == source) {
    ask->request(st.tables, st.options.requestTimeout, ps::image_atom::value)
        .receive([&](const ps::TableImagesPtr& p) { held = p; },
                 [&](caf::error& e) { error = caf::to_string(e); });
    if (error.empty() && (!held || int64_t(held->size()) != tables)) {
      error = fmt::format("it holds {} tables, the model {}", held ? held->size() : 0, tables);
    }
  }
  // Whether the source has them: every rank takes the same branch.
  int64_t have = error.empty() ? 1 : 0;
  Status s0 = comm.broadcast(&have, sizeof have, source);
  if (!s0.isOk()) return s0;
  if (!have) {
    return Status::internal(fmt::format("worker {} could not copy its tables{}", comm.rank() == source ? rank : source,
                                        error.empty() ? std::string() : ": " + error));
  }
  const bool root = comm.rank() == source;
  if (!root) got.resize(size_t(tables));
  for (int64_t i = 0; i < tables; ++i) {
    // The source sends its own image (made for this request; a broadcast
    // only reads the root's bytes); the others receive into `got`.
    const ps::TableImage* from = root ? &(*held)[size_t(i)] : nullptr;
    int64_t head[5] = {0, 0, 0, 0, 0};
    if (from) {
      head[0] = from->tableId;
      head[1] = from->dim;
      head[2] = from->rowFloats;
      head[3] = from->optimizerKind;
      head[4] = int64_t(from->keys.size());
    }
    Status s = comm.broadcast(head, sizeof head, source);
    if (!s.isOk()) return s;
    if (head[1] < 1 || head[2] < head[1] || head[2] > (int64_t{1} << 20) || head[4] < 0 ||
        head[4] > (int64_t{1} << 40) / head[2]) {
      return Status::corruption(fmt::format("rank {} sent a table of {} rows of {} floats (dim {})", source, head[4],
                                            head[2], head[1]));
    }
    if (head[4] == 0 && root) continue;
    if (root) {
      s = comm.broadcast(const_cast<uint64_t*>(from->keys.data()), from->keys.size() * 8, source);
      if (s.isOk()) s = comm.broadcast(const_cast<float*>(from->rows.data()), from->rows.size() * 4, source);
      if (!s.isOk()) return s;
      continue;
    }
    ps::TableImage& t = got[size_t(i)];
    t.tableId = head[0], t.dim = head[1], t.rowFloats = head[2], t.optimizerKind = head[3];
    t.keys.resize(size_t(head[4]));
    t.rows.resize(size_t(head[4] * head[2]));
    if (head[4] == 0) continue;
    s = comm.broadcast(t.keys.data(), t.keys.size() * 8, source);
    if (s.isOk()) s = comm.broadcast(t.rows.data(), t.rows.size() * 4, source);
    if (!s.isOk()) return s;
  }
  if (!load) return Status::ok();
  if (root) return Status::ok();  // the source keeps its own
  ask->request(st.tables, st.options.requestTimeout, ps::load_atom::value,
               ps::TableImagesPtr(std::make_shared<const std::vector<ps::TableImage>>(std::move(got))), rank, floor)
      .receive([](int64_t) {}, [&](caf::error& e) { error = caf::to_string(e); });
  if (!error.empty()) return Status::internal(fmt::format("worker {} could not load the tables: {}", rank, error));
  return Status::ok();
}

// The new group is named: join it, agree where to go on from, copy the
// model, and go back to that place in the data (see the header).
Status formGroup(Self* self, const Regroup& r) {
  auto& st = self->state;
  WorkerCore& core = *st.core;
  const int64_t rank = core.options().worker;
  if (r.generation >= 0 && st.tables) {
    // The shards went back for a group without a lost rank: from now on
    // this worker's pulls and pushes are of their new generation.
    caf::scoped_actor ask{self->system()};
    std::string error;
    ask->request(st.tables, st.options.requestTimeout, ps::generation_atom::value, r.generation)
        .receive([](int64_t) {}, [&](caf::error& e) { error = caf::to_string(e); });
    if (!error.empty()) return Status::internal(fmt::format("worker {}: its shard client: {}", rank, error));
  }
  auto comm = st.options.regroup.join(uint64_t(r.epoch), r.nodes);
  if (!comm.hasValue()) return comm.status();
  core.setCommunicator(*comm);
  collectives::Communicator& c = **comm;
  const bool replacement = st.options.regroup.rejoin;
  Standing mine;
  if (!replacement) {
    // Its place in the data: batches still to pass over after a group
    // formed (it may leave again before it got there) count as passed.
    mine = Standing{core.steps(),
                    st.epoch,
                    st.epochSteps + st.toSkip,
                    core.samplesApplied(),
                    core.canRevert() ? 1 : 0,
                    core.previousSamplesApplied(),
                    -1,
                    st.division.epoch,
                    st.division.fromBatch,
                    st.division.parts};
  } else {
    mine.shardClock = st.options.regroup.shardClock;
  }
  if (r.shardStep >= 0) mine.shardClock = mine.shardClock < 0 ? r.shardStep : std::min(mine.shardClock, r.shardStep);
  std::vector<Standing> all(size_t(c.size()));
  Status s = c.allGather(&mine, all.data(), sizeof(Standing));
  if (!s.isOk()) return s;
  // Where the group goes on from (every rank decides alike from the same facts).
  auto plan = planRegroup(all, core.options().keepPrevious);  // hybrid: back to the least
  if (!plan.hasValue()) return plan.status();
  const int64_t at = plan->step, epoch = plan->epoch, samples = plan->samples;
  const int64_t epochBatch = plan->epochBatch;
  const int source = plan->source;
  if (!replacement && core.steps() > at) {
    s = core.revertLastStep();
    if (!s.isOk()) return s;
    st.epochSteps -= 1;  // its place goes back with it, should this group fail too
  }
  // The dense state: everyone receives it into a buffer first (a broadcast
  // that fails half-way leaves the weights as they were).
  std::vector<float> state(size_t(core.denseStateFloats()));
  if (c.rank() == source) std::copy_n(core.denseState(), state.size(), state.begin());
  s = c.broadcast(state.data(), state.size() * 4, source);
  if (!s.isOk()) return s;
  const bool needsModel = replacement || core.steps() != at;
  if (core.options().replicatedTables) {
    s = copyTables(self, c, source, needsModel, at);
    if (!s.isOk()) return s;
  }
  // What is left of the epoch is divided among the ranks of this group
  // (as many as before, or fewer once the group shrank).
  {
    caf::scoped_actor ask{self->system()};
    std::string error;
    ask->request(st.trainLoader, st.options.requestTimeout, share_atom::value, epoch, epochBatch, int64_t(c.rank()),
                 int64_t(c.size()))
        .receive([](int64_t) {}, [&](caf::error& e) { error = caf::to_string(e); });
    if (!error.empty()) return Status::internal(fmt::format("worker {}: its share of the data: {}", rank, error));
  }
  if (needsModel) std::copy(state.begin(), state.end(), core.denseState());
  core.setPosition(at, samples);
  logger("worker")->info("worker {}: the group formed again (epoch {}, {} ranks, this one {}): it goes on from step {} "
                         "(epoch {}, batch {}), the model {}",
                         rank, r.epoch, c.size(), c.rank(), at, epoch, epochBatch,
                         needsModel ? fmt::format("copied from worker {}", source) : std::string("its own"));
  st.options.regroup.rejoin = false;
  st.regrouping = false;
  st.groupEpoch = r.epoch;
  st.epoch = epoch;
  st.division = DataDivision{epoch, epochBatch, c.size()};
  st.toSkip = 0;
  return Status::ok();
}

caf::behavior worker(Self* self, WorkerOptions options, std::shared_ptr<WorkerCore> core, caf::actor trainLoader,
                     caf::actor testLoader, caf::actor tables) {
  auto& st = self->state;
  st.options = std::move(options);
  st.faultFired.assign(st.options.faults.size(), false);
  st.slowBase.assign(st.options.faults.size(), 0.0);
  if (st.options.progressEverySteps < 1) st.options.progressEverySteps = 1;
  st.core = std::move(core);
  st.trainLoader = std::move(trainLoader);
  st.testLoader = std::move(testLoader);
  st.tables = std::move(tables);
  st.toSkip = std::max<int64_t>(0, st.options.skipBatches);
  st.epoch = std::max<int64_t>(0, st.options.startEpoch);
  st.division = st.options.division;
  return {
      [=](run_atom) -> caf::typed_response_promise<TrainReportPtr> {
        auto& st = self->state;
        st.done = self->make_response_promise<TrainReportPtr>();
        st.running = true;
        st.snapshotStep = st.core->steps();  // (a replacement's or a resumed job's schedule goes on from here)
        if (st.options.regroup.rejoin || st.options.regroup.first) {
          // A replacement (the model comes from the group), or the first
          // group failed as it formed.
          enterRegroup(self, Status::unavailable("the group failed as it formed"));
        } else if (!st.regrouping) {  // told to wait for a group before it ran: the group starts it
          startEpoch(self);
        }
        return st.done;
      },
      [=](const Regroup& r) {
        auto& st = self->state;
        if (!st.regrouping || st.finished) return;  // not waiting for a group: changes nothing
        Status s = formGroup(self, r);
        if (s.isOk()) {
          self->send(st.options.regroup.coordinator,
                     RegroupDone{st.core->options().worker, r.epoch, st.core->steps(), st.division.epoch,
                                 st.division.fromBatch, st.division.parts});
          return startEpoch(self);  // back to the place in the data, then the step again
        }
        if (s.code() != Status::Code::kUnavailable && s.code() != Status::Code::kTimeout) return fail(self, s);
        // The new group failed too (another rank went down): wait for the next.
        st.core->setCommunicator(nullptr);
        st.regrouping = false;
        enterRegroup(self, s);
      },
      [=](const RegroupNow& n) {
        // A rank of the group was lost while this worker waits on something
        // else than a collective (hybrid: a pull the shards hold for the lost
        // rank's push): it leaves the step and waits for the group.
        auto& st = self->state;
        if (!st.running || st.regrouping || st.finished || st.trainingOver || !st.options.regroup.join) return;
        if (n.epoch <= st.groupEpoch) return;  // late: the group that took the replacement formed already
        ++st.attempt;
        enterRegroup(self, Status::unavailable(fmt::format("rank {} was lost", n.lost)));
      },
      [=](regroup_timeout_atom, int64_t token) {
        auto& st = self->state;
        if (!st.regrouping || token != st.regroupToken) return;
        if (st.options.awaitRestart.count() > 0 && !st.options.regroup.join) {
          return fail(self, Status::timeout(fmt::format("worker {}: the job did not start its pipeline's stages again "
                                                        "within {} s", st.core->options().worker,
                                                        st.options.awaitRestart.count())));
        }
        fail(self, Status::timeout(fmt::format("worker {}: the group did not form again within {} s",
                                               st.core->options().worker, st.options.regroup.timeout.count())));
      },
      [=](const CheckpointPause& p) {
        auto& st = self->state;
        const auto pauser = caf::actor_cast<caf::actor>(self->current_sender());
        if (st.finished || (st.trainingOver && st.pushesInFlight == 0)) {
          self->send(pauser, CheckpointPaused{st.core->options().worker, p.id, st.core->steps(), false, true});
          return;
        }
        if (st.trainingOver) {  // its last pushes are on their way: it answers once they are acknowledged
          st.pauseId = p.id;
          st.pauser = pauser;
          return;
        }
        if (st.paused) {
          // Paused already (for a checkpoint given up since): paused for this one too.
          st.pauseId = p.id;
          st.pauser = pauser;
          self->send(pauser, CheckpointPaused{st.core->options().worker, p.id, st.core->steps(), false});
          return;
        }
        // Past the boundary asked for (or at it, with that step under way):
        // it cannot stop there.
        if (p.atStep >= 0 && (st.core->steps() > p.atStep || st.passed >= p.atStep)) {
          self->send(pauser, CheckpointPaused{st.core->options().worker, p.id, st.core->steps(), true});
          return;
        }
        st.pauseId = p.id;
        st.pauseAt = p.atStep;
        st.pauser = pauser;
      },
      [=](const ModelSnapshot& m) -> caf::result<ModelCut> {
        auto& st = self->state;
        WorkerCore& core = *st.core;
        if (!st.paused || m.id != st.pauseId || !core.options().comm) {
          return caf::make_error(caf::sec::runtime_error,
                                 fmt::format("worker {} is not paused for checkpoint {} in a sync mode",
                                             core.options().worker, m.id));
        }
        const auto copyStart = Clock::now();
        // A pipeline stage's process: the whole model and optimizer state
        // from its replica's stages, paused at this step too.
        // (within the coordinator's 60 s for the copy: a stage that does not
        // answer gives the checkpoint up, not this worker's next steps)
        Status whole = core.assembleModel(std::min<std::chrono::milliseconds>(st.options.requestTimeout,
                                                                              std::chrono::seconds(50)),
                                          true);
        if (!whole.isOk()) {
          return caf::make_error(caf::sec::runtime_error,
                                 fmt::format("worker {}: {}", core.options().worker, whole.message()));
        }
        auto img = std::make_shared<ModelImage>();
        img->workers = m.workers;
        img->step = core.steps();
        img->epoch = st.epoch;
        // Batches of the epoch the steps so far took (still to pass over count as passed).
        img->epochBatch = st.division.batchesTaken(st.epoch, st.epochSteps + st.toSkip);
        img->samplesApplied = core.samplesApplied();
        img->denseParameters = core.denseParameters();
        img->dense.assign(core.denseState(), core.denseState() + core.denseStateFloats());
        if (core.options().replicatedTables) {
          caf::scoped_actor ask{self->system()};
          std::string error;
          ask->request(st.tables, st.options.requestTimeout, ps::image_atom::value)
              .receive([&](ps::TableImagesPtr& p) { img->tables = std::move(p); },
                       [&](caf::error& e) { error = caf::to_string(e); });
          if (!error.empty()) {
            return caf::make_error(caf::sec::runtime_error,
                                   fmt::format("worker {} could not copy its tables: {}", core.options().worker, error));
          }
        }
        logger("worker")->info("worker {}: copied the model for checkpoint {} in {:.3f} s", core.options().worker, m.id,
                               secondsSince(copyStart));
        if (st.writer && st.writer->joinable()) st.writer->join();  // one checkpoint at a time
        const ModelCut cut{core.options().worker, m.id, img->step, img->epoch, img->epochBatch, img->samplesApplied};
        auto requester = caf::actor_cast<caf::actor>(self->current_sender());
        st.writer = std::make_unique<std::thread>([img, path = m.path, cut, requester] {
          uint64_t checksum = 0, bytes = 0;
          Status s = writeModelImage(*img, path, &checksum, &bytes);
          if (requester) {
            caf::anon_send(requester, ModelWritten{cut.rank, cut.id, path, bytes, checksum,
                                                   s.isOk() ? std::string() : s.message()});
          }
        });
        return cut;
      },
      [=](const ResidualSnapshot& m) -> caf::result<int64_t> {
        auto& st = self->state;
        WorkerCore& core = *st.core;
        const int64_t rank = core.options().worker;
        if (!st.paused || m.id != st.pauseId) {
          return caf::make_error(caf::sec::runtime_error,
                                 fmt::format("worker {} is not paused for checkpoint {}", rank, m.id));
        }
        ResidualImagePtr img = std::make_shared<ResidualImage>();
        if (st.options.pushResiduals && st.tables) {
          caf::scoped_actor ask{self->system()};
          std::string error;
          ask->request(st.tables, st.options.requestTimeout, residuals_atom::value)
              .receive([&](ResidualImagePtr& p) { img = std::move(p); },
                       [&](caf::error& e) { error = caf::to_string(e); });
          if (!error.empty()) {
            return caf::make_error(caf::sec::runtime_error,
                                   fmt::format("worker {} could not copy its push residuals: {}", rank, error));
          }
        }
        img->worker = rank;
        img->step = core.steps();
        if (const auto& c = core.options().compression) {
          img->allreduceCodec = uint8_t(c->kind());
          img->allreduce = c->saveResiduals();
        }
        if (st.residualWriter && st.residualWriter->joinable()) st.residualWriter->join();  // one checkpoint at a time
        auto requester = caf::actor_cast<caf::actor>(self->current_sender());
        st.residualWriter = std::make_unique<std::thread>([img, path = m.path, id = m.id, rank, requester] {
          uint64_t checksum = 0, bytes = 0;
          Status s = writeResidualImage(*img, path, &checksum, &bytes);
          if (requester) {
            caf::anon_send(requester,
                           ResidualWritten{rank, id, path, bytes, checksum, s.isOk() ? std::string() : s.message()});
          }
        });
        return img->step;
      },
      [=](const CheckpointResume& r) {
        auto& st = self->state;
        if (r.id != st.pauseId) return;
        st.pauseId = -1;
        st.pauseAt = -1;
        st.pauser = caf::actor();
        if (st.paused) {
          st.paused = false;
          // Waiting for the group to form again: the group starts it.
          if (!st.regrouping && !st.finished) nextTrainBatch(self);
        }
      },
      [=](const GateDecision& d) {
        auto& st = self->state;
        if (!st.awaitingGate) return;  // not asked for: changes nothing
        st.awaitingGate = false;
        st.gatePassed = true;
        if (d.evaluate) return startEvaluation(self);
        finish(self);
      },
  };
}

}  // namespace

caf::actor spawnWorker(caf::actor_system& system, const WorkerOptions& options, std::unique_ptr<WorkerCore> core,
                       caf::actor trainLoader, caf::actor testLoader, caf::actor tables) {
  return system.spawn<caf::detached>(worker, options, std::shared_ptr<WorkerCore>(std::move(core)),
                                     std::move(trainLoader), std::move(testLoader), std::move(tables));
}

}  // namespace troupe::workers
