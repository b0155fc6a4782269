// The evaluator: the test metrics of the model while it trains
// (train.eval_every_steps / train.eval_every_seconds), beside the workers
// instead of in their way.
//
// A worker (rank 0 of a job, or the only one) hands it a snapshot at a step
// boundary where an evaluation is due: its step, its training seconds and
// samples, and a copy of its dense weights (a copy of a few MB at most: the
// worker does not wait for the evaluation). The evaluator then runs its own
// model (a WorkerCore of the same shape) over the whole test set, which it
// read into memory once when it was made:
//   - dense weights: the snapshot's; in ps mode the shards' as its pulls
//     find them (PullRequest::dense), which may be a few steps past the
//     snapshot's step;
//   - embedding rows: pulled from the same tables the worker trains on (the
//     worker's ps client, or its table holder), as evaluation pulls
//     (create = false: no row is made, no consistency gate waits, the
//     shards count no staleness for them). Rows change while the pass goes
//     on: like the final evaluation of a job whose workers still push, the
//     pass sees the tables as they are.
// and gives `onPoint` an EvalPoint. A snapshot that comes while a pass is
// under way waits; a later one replaces it (the points are of the latest
// model, and none piles up: `skipped` counts those replaced).
//
// (drain_atom) -> int64_t: answered once no pass is under way or waiting,
// with the points made so far: the worker asks at the end of training, so
// that every snapshot it handed over was evaluated (or replaced) before the
// job ends.
//
// A pass that fails (a pull the shards refuse: a shard lost meanwhile) is
// logged and dropped; the evaluator goes on with the next snapshot, so an
// evaluation never stops training. It ends when its supervisor stops it.
//
// Runs detached: a pass computes on its own thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <caf/actor.hpp>
#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/atom.hpp>
#include <caf/fwd.hpp>

#include "workers/batch_source.h"
#include "workers/eval_schedule.h"
#include "workers/job_messages.h"
#include "workers/worker_core.h"

namespace troupe::workers {

using drain_atom = caf::atom_constant<caf::atom("evaldrain")>;

// What a worker hands the evaluator (in-process only).
struct EvalSnapshot {
  int64_t epoch = 0, step = 0, samples = 0;
  double trainSeconds = 0;
  std::vector<float> dense;  // the worker's dense weights (empty in ps mode: the shards')
};
using EvalSnapshotPtr = std::shared_ptr<const EvalSnapshot>;

struct EvaluatorOptions {
  // The model's shape and options (comm, stage, pipeline and compression
  // are dropped: the evaluator only runs forward).
  WorkerCoreOptions core;
  // The test set, read whole when the evaluator is made (on the caller's
  // thread: the source must not be read by anyone else meanwhile).
  std::shared_ptr<BatchSource> test;
  // Where rows (and in ps mode the dense weights) are pulled from; null for
  // a model without tables in a sync mode.
  caf::actor tables;
  std::chrono::milliseconds requestTimeout{60000};
  // Called on the evaluator's thread with each pass's point.
  std::function<void(const EvalPoint&)> onPoint;
  int64_t rank = 0;  // of the worker whose snapshots it evaluates (its log lines)
};

// Reads the test set (SetupError on a read error) and spawns the evaluator.
caf::actor spawnEvaluator(caf::actor_system& system, EvaluatorOptions options);


}  // namespace troupe::workers

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::workers::EvalSnapshotPtr)
