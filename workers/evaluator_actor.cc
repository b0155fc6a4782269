#include "workers/evaluator_actor.h"

#include <algorithm>
#include <chrono>

#include <caf/all.hpp>

#include "common/check.h"
#include "common/logging.h"
#include "ps/messages.h"

namespace troupe::workers {
namespace {

using Clock = std::chrono::steady_clock;

struct EvaluatorState {
  EvaluatorOptions options;
  std::unique_ptr<WorkerCore> core;
  std::vector<BatchPtr> batches;  // the test set
  EvalSnapshotPtr current;        // the pass under way (null: none)
  EvalSnapshotPtr waiting;        // the next one
  int64_t skipped = 0;            // snapshots replaced before a pass took them
  size_t next = 0;                // the batch the pass is at
  EvalResult eval;
  Clock::time_point started;
  int64_t points = 0;
  std::vector<caf::response_promise> drains;  // answered once idle
  static inline const char* name = "evaluator";
};

using Self = caf::stateful_actor<EvaluatorState>;

void startPass(Self* self);

void endPass(Self* self, const Status& failure) {
  auto& st = self->state;
  if (!failure.isOk()) {
    logger("worker")->warn("worker {}: the evaluation at step {} is dropped: {}", st.options.rank, st.current->step,
                           failure.message());
  } else {
    st.core->finishEval(&st.eval);
    EvalPoint p;
    p.rank = st.options.rank;
    p.epoch = st.current->epoch;
    p.step = st.current->step;
    p.samples = st.current->samples;
    p.rows = st.eval.rows;
    p.skipped = st.skipped;
    p.trainSeconds = st.current->trainSeconds;
    p.evalSeconds = std::chrono::duration<double>(Clock::now() - st.started).count();
    p.loss = st.eval.loss;
    p.auc = st.eval.auc;
    p.accuracy = st.eval.accuracy;
    ++st.points;
    if (st.options.onPoint) st.options.onPoint(p);
  }
  st.current = nullptr;
  if (st.waiting) {
    st.current = std::move(st.waiting);
    st.waiting = nullptr;
    return startPass(self);
  }
  for (auto& d : st.drains) d.deliver(st.points);
  st.drains.clear();
}

void nextBatch(Self* self) {
  auto& st = self->state;
  if (!st.current) return;
  if (st.next >= st.batches.size()) return endPass(self, Status::ok());
  const BatchPtr batch = st.batches[st.next++];
  if (!st.core->needsServer()) {
    Status s = st.core->evalStep(*batch, nullptr, &st.eval);
    if (!s.isOk()) return endPass(self, s);
    // One batch a message: a stop or a newer snapshot is taken in between.
    return self->send(self, ps::pull_atom::value);
  }
  auto pull = st.core->prepare(*batch, false);
  if (!pull.hasValue()) return endPass(self, pull.status());
  self->request(st.options.tables, st.options.requestTimeout, ps::pull_atom::value, *pull)
      .then(
          [=](ps::PullReplyPtr rows) {
            Status s = self->state.core->evalStep(*batch, rows, &self->state.eval);
            if (!s.isOk()) return endPass(self, s);
            nextBatch(self);
          },
          [=](caf::error& err) { endPass(self, Status::unavailable(caf::to_string(err))); });
}

void startPass(Self* self) {
  auto& st = self->state;
  st.started = Clock::now();
  st.eval = EvalResult{};
  st.next = 0;
  const auto& dense = st.current->dense;
  if (!dense.empty()) {
    if (int64_t(dense.size()) != st.core->denseParameters()) {
      return endPass(self, Status::internal(fmt::format("the snapshot has {} dense weights, the model {}",
                                                        dense.size(), st.core->denseParameters())));
    }
    std::copy(dense.begin(), dense.end(), st.core->denseState());  // [weights | optimizer state]
  }
  nextBatch(self);
}

caf::behavior evaluator(Self* self, std::shared_ptr<EvaluatorState> init) {
  auto& st = self->state;
  st.options = std::move(init->options);
  st.batches = std::move(init->batches);
  st.core = std::move(init->core);
  return {
      [=](const EvalSnapshotPtr& snapshot) {
        auto& st = self->state;
        if (!st.current) {
          st.current = snapshot;
          return startPass(self);
        }
        if (st.waiting) ++st.skipped;
        st.waiting = snapshot;
      },
      [=](ps::pull_atom) { nextBatch(self); },  // the next batch of a pass without pulls
      [=](drain_atom) -> caf::result<int64_t> {
        auto& st = self->state;
        if (!st.current) return st.points;
        st.drains.push_back(self->make_response_promise());
        return st.drains.back();
      },
  };
}

}  // namespace

caf::actor spawnEvaluator(caf::actor_system& system, EvaluatorOptions options) {
  auto init = std::make_shared<EvaluatorState>();
  WorkerCoreOptions core = options.core;
  core.comm.reset();
  core.stage.reset();
  core.pipeline.reset();
  core.compression.reset();
  core.keepPrevious = false;
  core.replicatedTables = false;  // (a forward pass merges nothing)
  core.kernels.reset();            // its own, of one thread: a pass must not take the workers' cores
  core.threads = 1;
  init->core = std::make_unique<WorkerCore>(core);
  if (!options.test) TROUPE_SETUP_ERROR("the evaluator has no test set");
  Status s = options.test->startEpoch(0);
  if (!s.isOk()) TROUPE_SETUP_ERROR("the test set for evaluations during training: {}", s.message());
  for (;;) {
    auto batch = options.test->next();
    if (!batch.hasValue()) TROUPE_SETUP_ERROR("the test set for evaluations during training: {}", batch.status().message());
    if (!*batch) break;
    init->batches.push_back(std::move(*batch));
  }
  if (init->batches.empty()) TROUPE_SETUP_ERROR("the test set is empty: nothing to evaluate during training");
  if (init->core->needsServer() && !options.tables) TROUPE_SETUP_ERROR("the evaluator's model pulls, but has no tables");
  options.test.reset();
  init->options = std::move(options);
  return system.spawn<caf::detached>(evaluator, init);
}

}  // namespace troupe::workers
