// What the workers of a multi-process training job say to its coordinator,
// beside the lifecycle (actors/messages.h). Records (transport/record.h):
// structs that cross processes field by field, registered with CAF's type
// ids.
//
//   Progress       worker -> coordinator, every train.progress_every steps
//   GateRequest    worker -> coordinator once it has trained its share and
//                  every push is acknowledged; answered with GateDecision
//                  once every live worker has asked (the lowest live rank
//                  evaluates the final model). An answer, not a request:
//                  the wait lasts as long as the slowest worker trains, and
//                  ends with the coordinator if it goes.
//   EvalPoint      worker 0's evaluator -> coordinator, a test-set
//                  evaluation during training (train.eval_every_*)
//   WorkerReport   worker -> coordinator at the end -> int64_t rank (ack)
//   CheckpointPause / CheckpointPaused / CheckpointResume
//                  coordinator -> worker (its "trainer" actor): stop at the
//                  next step boundary once every push is acknowledged, say
//                  where (the step), wait for the resume. Workers that no
//                  longer train say so at once.
//   ModelSnapshot / ModelCut / ModelWritten
//                  sync modes, a checkpoint: once every rank is paused at
//                  the same step, the lowest live one copies the group's
//                  model (-> ModelCut: step, place in the data, ledger) and
//                  writes it beside training (-> ModelWritten)
//   ResidualSnapshot / ResidualWritten
//                  compression with error feedback, a checkpoint: every
//                  paused worker copies what its codecs held back (-> the
//                  step it is paused at) and writes it beside training
//                  (-> ResidualWritten)
//   CommOffer      worker -> coordinator, sync modes whose
//                  collectives.backend is not "ring": whether it can use
//                  NCCL (and worker 0's NCCL id) -> CommChoice once every
//                  worker offered: the backend for all, rank 0's id, this
//                  worker's device
//   RegroupReady / Regroup
//                  sync modes, after a worker was lost: every live worker
//                  (the survivors once their collective failed and their
//                  old group is gone, the replacement once it runs) says it
//                  is ready; once all are, the coordinator sends each the
//                  new group (an epoch and the node of every rank), and the
//                  workers agree among themselves on the step to go on from
//                  and copy the model from a survivor (workers/worker_actor.h);
//                  each then says RegroupDone (the step it goes on from).
//                  A hybrid group that goes on without a lost rank (shrink)
//                  gets the step the shards went back to and their new
//                  generation with it.
//                  RegroupNow (coordinator -> workers, at the loss) makes a
//                  survivor that waits on something else than a collective
//                  (a pull held for the lost rank) leave its step
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <caf/fwd.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/type_id.hpp>

#include "actors/messages.h"
#include "transport/record.h"
#include "transport/tensor.h"

namespace troupe::workers {

struct Progress {
  int64_t rank = 0, epoch = 0, step = 0, epochRows = 0, rowsPerEpoch = 0;
  double loss = 0, samplesPerSec = 0;
  double wireRatio = 1;  // compression: the worker's encoded / float32 tensor bytes so far
  int64_t mailbox = 0;   // messages waiting in the worker actor's mailbox
};

struct GateRequest {
  int64_t rank = 0, steps = 0, samples = 0;
  double trainSeconds = 0;
};

// Evaluation during training (workers/evaluator_actor.h): the evaluator
// beside worker 0 -> coordinator, a point of the test metrics: the
// snapshot's place (epoch, step, the worker's training seconds and
// samples), the test rows, their metrics, the pass's own seconds, and the
// snapshots replaced before a pass took them.
struct EvalPoint {
  int64_t rank = 0, epoch = 0, step = 0, samples = 0, rows = 0, skipped = 0;
  double trainSeconds = 0, evalSeconds = 0, loss = 0, auc = 0, accuracy = 0;
};

struct GateDecision {
  bool evaluate = false;
};

struct WorkerReport {
  int64_t rank = 0;
  int64_t steps = 0, samples = 0, pushesAcked = 0, pulledRows = 0;
  double trainSeconds = 0, evalSeconds = 0;
  bool evaluated = false;
  double auc = 0, loss = 0, accuracy = 0;
  int64_t rows = 0;
  transport::Tensor labels, predictions;  // f32, one per test row (the evaluating worker)
  uint64_t denseHash = 0;                 // of the final dense weights
  int64_t datasetRows = 0;                // training rows per epoch, the whole data set
  int64_t resumedAt = 0;                  // a replacement: the step it resumed at
  int64_t stepsRedone = 0;                // and the steps it redid (some shard had them; applied there once)
  int64_t samplesApplied = 0;             // sync modes: every rank's samples in the steps taken (the ledger)
  int64_t pushesAcknowledged = 0;         // the ledger: distinct pushes every shard acknowledged (TrainReport)
  // The count model (model.kind = count), the evaluating worker: values
  // checked against the counts, those wrong, the first few named.
  int64_t countChecked = 0, countWrong = 0;
  std::string countErrors;
  // The bytes of each path this process's worker used ("push", "pull",
  // "allreduce"), kWireFigures figures a path in wireFigures: frames and
  // bytes as the transport counted them (pull: the replies received), the
  // tensor bytes handed to it encoded and in float32, messages, and those
  // of them compressed.
  std::vector<std::string> wirePaths;
  std::vector<double> wireFigures;
  double pullWaitSeconds = 0, collectiveSeconds = 0;  // of trainSeconds (TrainReport)
};
inline constexpr size_t kWireFigures = 6;

struct CheckpointPause {
  int64_t id = 0;
  // Stop at the boundary before this step (BSP: every worker at the same
  // one, since a step's pushes are acknowledged only once every worker's
  // is in); -1: at the next boundary.
  int64_t atStep = -1;
};

struct CheckpointPaused {
  int64_t rank = 0, id = 0;
  int64_t step = 0;   // steps taken; every push acknowledged
  bool late = false;  // it was past atStep already: not paused
  bool over = false;  // it trains no more (as good as paused in ps mode; no cut in a sync mode)
};

struct CheckpointResume {
  int64_t id = 0;
};

// Sync modes: coordinator -> the lowest live rank once every rank is
// paused at the same step: copy the group's model in memory (-> ModelCut),
// then write it to `path` beside training (-> ModelWritten, to the sender).
struct ModelSnapshot {
  int64_t id = 0;
  std::string path;
  int64_t workers = 0;  // the job's (cluster.workers): a group that shrank resumes with all of them
};

struct ModelCut {
  int64_t rank = 0, id = 0;
  int64_t step = 0, epoch = 0, epochBatch = 0, samplesApplied = 0;
};

struct ModelWritten {
  int64_t rank = 0, id = 0;
  std::string path;
  uint64_t bytes = 0, checksum = 0;
  std::string error;  // "" when written
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ModelSnapshot& x) {
  return f(caf::meta::type_name("ModelSnapshot"), x.id, x.path, x.workers);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ModelCut& x) {
  return f(caf::meta::type_name("ModelCut"), x.rank, x.id, x.step, x.epoch, x.epochBatch, x.samplesApplied);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ModelWritten& x) {
  return f(caf::meta::type_name("ModelWritten"), x.rank, x.id, x.path, x.bytes, x.checksum, x.error);
}

// Compression with error feedback: coordinator -> each paused worker: copy
// the codecs' residuals (-> int64_t, the steps taken), then write them to
// `path` beside training (-> ResidualWritten, to the sender).
struct ResidualSnapshot {
  int64_t id = 0;
  std::string path;
};

struct ResidualWritten {
  int64_t rank = 0, id = 0;
  std::string path;
  uint64_t bytes = 0, checksum = 0;
  std::string error;  // "" when written
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ResidualSnapshot& x) {
  return f(caf::meta::type_name("ResidualSnapshot"), x.id, x.path);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ResidualWritten& x) {
  return f(caf::meta::type_name("ResidualWritten"), x.rank, x.id, x.path, x.bytes, x.checksum, x.error);
}

struct CommOffer {
  int64_t rank = 0;
  int64_t devices = 0;      // CUDA devices this worker can use
  std::string unavailable;  // why it cannot use NCCL, or ""
  transport::Tensor ncclId; // worker 0: NCCL's unique id (bytes)
};

struct CommChoice {
  std::string backend;  // "nccl" or "ring"
  transport::Tensor ncclId;
  int64_t device = -1;
};

struct RegroupReady {
  int64_t rank = 0;
  int64_t steps = 0;        // steps taken (-1: a replacement, which has no model yet)
  int64_t incarnation = 0;  // which process of the rank (a late word of a lost one changes nothing)
  // The nodes of the members of its group this worker's transport found
  // down. The coordinator may see them alive (a cut between workers, or
  // one that healed just before its own heartbeat timeout): if the group
  // then cannot form, it takes the member most workers found down as lost,
  // unreachable.
  std::vector<uint64_t> unreachable;
};

struct Regroup {
  int64_t epoch = 0;
  std::vector<uint64_t> nodes;  // node id of each rank
  // Hybrid shrink: the shards undid every step from `shardStep` on (the
  // group goes on from there at the latest) and refuse pulls and pushes of
  // a generation older than `generation`. -1: the shards did not move.
  int64_t shardStep = -1;
  int64_t generation = -1;
};

// coordinator -> every live worker (its "trainer") when a rank is lost.
struct RegroupNow {
  int64_t lost = 0;
  int64_t epoch = 0;  // of the group to come (a worker in that group already drops it)
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, RegroupNow& x) {
  return f(caf::meta::type_name("RegroupNow"), x.lost, x.epoch);
}

struct RegroupDone {
  int64_t rank = 0, epoch = 0;
  int64_t step = 0;  // the step the group goes on from
  // How the group divides the data from there (workers/regroup.h DataDivision).
  int64_t dataEpoch = 0, fromBatch = 0, parts = 1;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, RegroupDone& x) {
  return f(caf::meta::type_name("RegroupDone"), x.rank, x.epoch, x.step, x.dataEpoch, x.fromBatch, x.parts);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, RegroupReady& x) {
  return f(caf::meta::type_name("RegroupReady"), x.rank, x.steps, x.incarnation, x.unreachable);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Regroup& x) {
  return f(caf::meta::type_name("Regroup"), x.epoch, x.nodes, x.shardStep, x.generation);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Progress& x) {
  return f(caf::meta::type_name("Progress"), x.rank, x.epoch, x.step, x.epochRows, x.rowsPerEpoch, x.loss,
           x.samplesPerSec, x.wireRatio, x.mailbox);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, EvalPoint& x) {
  return f(caf::meta::type_name("EvalPoint"), x.rank, x.epoch, x.step, x.samples, x.rows, x.skipped, x.trainSeconds,
           x.evalSeconds, x.loss, x.auc, x.accuracy);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, GateRequest& x) {
  return f(caf::meta::type_name("GateRequest"), x.rank, x.steps, x.samples, x.trainSeconds);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, GateDecision& x) {
  return f(caf::meta::type_name("GateDecision"), x.evaluate);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, WorkerReport& x) {
  return f(caf::meta::type_name("WorkerReport"), x.rank, x.steps, x.samples, x.pushesAcked, x.pulledRows,
           x.trainSeconds, x.evalSeconds, x.evaluated, x.auc, x.loss, x.accuracy, x.rows, x.labels, x.predictions,
           x.denseHash, x.datasetRows, x.resumedAt, x.stepsRedone, x.samplesApplied, x.pushesAcknowledged,
           x.countChecked, x.countWrong, x.countErrors, x.wirePaths, x.wireFigures, x.pullWaitSeconds,
           x.collectiveSeconds);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, CheckpointPause& x) {
  return f(caf::meta::type_name("CheckpointPause"), x.id, x.atStep);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, CheckpointPaused& x) {
  return f(caf::meta::type_name("CheckpointPaused"), x.rank, x.id, x.step, x.late, x.over);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, CheckpointResume& x) {
  return f(caf::meta::type_name("CheckpointResume"), x.id);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, CommOffer& x) {
  return f(caf::meta::type_name("CommOffer"), x.rank, x.devices, x.unavailable, x.ncclId);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, CommChoice& x) {
  return f(caf::meta::type_name("CommChoice"), x.backend, x.ncclId, x.device);
}

// The training job's records (merge with actors::lifecycleWireTypes()).
transport::WireTypes trainingWireTypes();
// Registers them with an actor system (after actors::configureActorSystem).
void addTrainingTypes(caf::actor_system_config& cfg);

}  // namespace troupe::workers

CAF_BEGIN_TYPE_ID_BLOCK(troupe_workers, caf::first_custom_type_id + 50)
CAF_ADD_TYPE_ID(troupe_workers, (troupe::workers::Progress))
CAF_ADD_TYPE_ID(troupe_workers, (troupe::workers::GateRequest))
CAF_ADD_TYPE_ID(troupe_workers, (troupe::workers::GateDecision))
CAF_ADD_TYPE_ID(troupe_workers, (troupe::workers::WorkerReport))
CAF_ADD_TYPE_ID(troupe_workers, (troupe::workers::CommOffer))
CAF_ADD_TYPE_ID(troupe_workers, (troupe::workers::CommChoice))
CAF_ADD_TYPE_ID(troupe_workers, (troupe::workers::CheckpointPause))
CAF_ADD_TYPE_ID(troupe_workers, (troupe::workers::CheckpointPaused))
CAF_ADD_TYPE_ID(troupe_workers, (troupe::workers::CheckpointResume))
CAF_ADD_TYPE_ID(troupe_workers, (troupe::workers::RegroupReady))
CAF_ADD_TYPE_ID(troupe_workers, (troupe::workers::Regroup))
CAF_ADD_TYPE_ID(troupe_workers, (troupe::workers::RegroupDone))
CAF_ADD_TYPE_ID(troupe_workers, (troupe::workers::RegroupNow))
CAF_ADD_TYPE_ID(troupe_workers, (troupe::workers::ModelSnapshot))
CAF_ADD_TYPE_ID(troupe_workers, (troupe::workers::ModelCut))
CAF_ADD_TYPE_ID(troupe_workers, (troupe::workers::ModelWritten))
CAF_ADD_TYPE_ID(troupe_workers, (troupe::workers::ResidualSnapshot))
CAF_ADD_TYPE_ID(troupe_workers, (troupe::workers::ResidualWritten))
CAF_ADD_TYPE_ID(troupe_workers, (troupe::workers::EvalPoint))
CAF_END_TYPE_ID_BLOCK(troupe_workers)
