#include "ps/shard.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <thread>
#include <unordered_map>

#include <caf/all.hpp>

#include "common/hash.h"
#include "common/logging.h"
#include "common/mailbox.h"
#include "kernels/kernels.h"
#include "ps/applied_window.h"
#include "ps/table_set.h"
#include "ps/wire.h"
#include "transport/remote_actors.h"

namespace troupe::ps {
// A new backup's state as bytes, from the thread that made them to the shard.
struct StateBytes {
  Expected<std::vector<std::byte>> bytes;
};
using StateBytesPtr = std::shared_ptr<StateBytes>;
}  // namespace troupe::ps

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::ps::StateBytesPtr)

namespace troupe::ps {

using transport::DType;
using transport::Tensor;

Expected<Consistency> parseConsistency(const std::string& text) {
  if (text == "bsp") return Consistency::kBsp;
  if (text == "ssp") return Consistency::kSsp;
  if (text == "asp") return Consistency::kAsp;
  return Status::invalidArgument(fmt::format("'{}' is not a consistency model (bsp, ssp, asp)", text));
}

const char* consistencyName(Consistency c) {
  switch (c) {
    case Consistency::kBsp: return "bsp";
    case Consistency::kSsp: return "ssp";
    case Consistency::kAsp: return "asp";
  }
  return "?";
}

Status checkShardImage(const ShardImage& img, const ShardOptions& o) {
  if (img.shard != o.shard || img.shards != o.shards) {
    return Status::invalidArgument(fmt::format("it holds shard {} of {}; this is shard {} of {}", img.shard, img.shards,
                                               o.shard, o.shards));
  }
  if (img.workers != o.workers) {
    return Status::invalidArgument(fmt::format("it is of a job of {} workers; this job has {}", img.workers, o.workers));
  }
  if (img.consistency != int64_t(o.consistency)) {
    return Status::invalidArgument(fmt::format("it was written in {}; this job runs {}",
                                               consistencyName(Consistency(img.consistency)), consistencyName(o.consistency)));
  }
  if (img.tables.size() != o.tables.size()) {
    return Status::invalidArgument(fmt::format("it holds {} tables; the model has {}", img.tables.size(), o.tables.size()));
  }
  for (size_t t = 0; t < o.tables.size(); ++t) {
    const auto& a = img.tables[t];
    const auto& b = o.tables[t];
    if (a.tableId != b.tableId || a.dim != b.dim || a.optimizerKind != int64_t(b.optimizer.kind) ||
        a.rowFloats != kernels::optimizerRowFloats(b.optimizer.kind, b.dim)) {
      return Status::invalidArgument(fmt::format(
          "its table {} has dim {} and optimizer {}; the model's table {} has dim {} and optimizer {}", a.tableId, a.dim,
          a.optimizerKind, b.tableId, b.dim, int(b.optimizer.kind)));
    }
  }
  const int64_t denseSize = int64_t(o.denseInit.size());
  if (img.denseSize != denseSize ||
      int64_t(img.dense.size()) != kernels::optimizerRowFloats(o.denseOptimizer.kind, denseSize)) {
    return Status::invalidArgument(fmt::format("its dense slice has {} weights ({} floats with optimizer state); this "
                                               "shard's has {} ({})",
                                               img.denseSize, img.dense.size(), denseSize,
                                               kernels::optimizerRowFloats(o.denseOptimizer.kind, denseSize)));
  }
  return Status::ok();
}

int shardOfKey(uint64_t key, int shards) { return shards <= 1 ? 0 : int(mix64(key) % uint64_t(shards)); }

std::pair<int64_t, int64_t> denseSlice(int64_t total, int shard, int shards) {
  return {total * shard / shards, total * (shard + 1) / shards};
}

namespace {

using PullPromise = caf::typed_response_promise<Tensor, Tensor>;
using PushPromise = caf::typed_response_promise<int64_t>;

// The answer to a push (or a leave, undo or restore) with a backup
// attached: the sender hears once this copy and the backup have both
// answered the message (forwarded), with this copy's answer; when one took
// it and the other refused it, the copies differ and the backup is dropped.
struct Join {
  explicit Join(PushPromise p) : promise(std::move(p)) {}
  PushPromise promise;
  bool localDone = false, remoteDone = false, delivered = false;
  int64_t value = 0;
  caf::error localError;
  caf::error remoteError;  // the backup's refusal, when it answered with one
  bool remoteAnswered = false;  // the backup answered (took it or refused it), not just went
  uint64_t epoch = 0;      // of the backup it waits for
};

// What a push's sender is owed: answered at once without a backup.
struct Ack {
  PushPromise promise;
  std::shared_ptr<Join> join;
  // A catch-up forward's (no join): this copy's outcome, for the backup's
  // answer to be checked against (-1 not yet, 0 refused, 1 took it).
  std::shared_ptr<int> outcome;
};

using tick_atom = caf::atom_constant<caf::atom("tick")>;
using transfer_ready_atom = caf::atom_constant<caf::atom("xferready")>;

struct ParkedPull {
  caf::message msg;  // keeps the view's buffers alive
  PullView view;
  PullPromise promise;
  caf::actor_clock::time_point since;
};

// The pushes of one BSP step, applied together once every live worker's is in.
struct PendingStep {
  struct Part {
    caf::message msg;
    PushView view;
    std::vector<Ack> promises;  // the push and any duplicates of it
  };
  std::map<int64_t, Part> parts;  // by worker
};

struct ShardState {
  ShardOptions options;
  std::unique_ptr<TableSet> tables;
  std::shared_ptr<kernels::Kernels> kernels;
  std::vector<float> dense;  // [weights | optimizer state] of the slice, one row
  int64_t denseSize = 0;
  int64_t updates = 0;       // optimizer steps applied (the optimizers' global step)
  std::vector<int64_t> clock;          // per worker: steps applied
  std::vector<AppliedWindow> applied;  // per worker: the sequences applied
  std::set<int64_t> live;            // workers still training
  std::vector<ParkedPull> parked;
  std::map<int64_t, PendingStep> pending;  // bsp, by step
  ShardStats stats;
  // The updates applied when each worker's training pull of a step was
  // served (the primary's), until its push of that step is applied.
  std::map<std::pair<int64_t, int64_t>, int64_t> pulledAt;  // (worker, step) -> updates
  // ShardOptions::delayCompensation: the weights each of those pulls was
  // served, kept until its push.
  struct Served {
    std::vector<std::unordered_map<uint64_t, size_t>> index;  // per table: key -> float offset in rows
    std::vector<float> rows, dense;
  };
  std::map<std::pair<int64_t, int64_t>, Served> served;
  std::vector<float> compensated, compensatedDense, now;  // scratch of a compensated push
  std::shared_ptr<spdlog::logger> log = logger("ps");
  // Scratch of a combined BSP update.
  std::vector<uint64_t> counts, keys;
  std::vector<float> grads, denseGrads;
  std::unique_ptr<kernels::Codec> pushCodec, pullCodec;  // compression (null: none)
  std::shared_ptr<transport::BufferPool> replyBuffers = ps::replyBuffers();  // (see shard.h)
  // BSP: what the last applied step changed, as it was before the step. A
  // worker lost after its push of step t reached this shard but not every
  // shard is replaced, and its replacement redoes step t: its pull for step
  // t must see the weights before step t, as the lost one did, for the redone
  // gradient (and so the model) to be the same bits. A hybrid group that
  // goes on without a lost rank undoes step t altogether (revert_atom).
  struct Undo {
    struct Part {
      int64_t worker = 0, sequence = 0, samples = 0;
    };
    int64_t step = -1;
    bool whole = false;  // ShardOptions::undoWholeSteps: rows and dense with their optimizer state
    std::vector<uint64_t> counts, keys;
    std::vector<float> rows;   // key by key: the weights, or (whole) the whole row
    std::vector<float> dense;  // the dense weights, or (whole) the whole dense state
    std::vector<Part> parts;   // the pushes the step applied
    std::vector<std::unordered_map<uint64_t, size_t>> index;  // per table: key -> float offset in rows
    bool indexed = false;
  } undo;
  int64_t generation = 0;  // see ShardOptions::generation
  // Replication (ShardOptions::replication): whether this copy serves as
  // the primary, its backup (null: none), which backup it is (replies of
  // an older one are ignored), and the acknowledgements waiting for it.
  bool primary = true;
  caf::actor backup;
  std::string backupName;
  uint64_t backupEpoch = 0;
  uint64_t nextJoin = 0;
  std::map<uint64_t, std::shared_ptr<Join>> awaitingBackup;
  // A new backup taking the state (replicate with transfer): changes go to
  // it in order but are answered on this copy's word until it has the
  // state and has answered every one of them (then the job counts it).
  bool catchingUp = false;
  int64_t catchUpLeft = 0;
  std::function<void(bool)> onCaughtUp;
  // The state being made into bytes for a new backup: changes wait here
  // (answered on this copy's word) until the bytes went.
  struct Transfer {
    caf::typed_response_promise<int64_t> promise;
    std::chrono::steady_clock::time_point started;
    int64_t generation = 0;  // the state's, as copied
    std::vector<std::pair<caf::message, std::shared_ptr<int>>> queued;
  };
  bool serializing = false;
  std::unique_ptr<Transfer> transfer;
  std::shared_ptr<std::thread> transferThread;
  // The checkpoint being written beside training (one at a time).
  std::shared_ptr<std::thread> writer;
  static inline const char* name = "ps_shard";

  ~ShardState() {
    if (writer && writer->joinable()) writer->join();
    if (transferThread && transferThread->joinable()) {
      // The thread may hold the last reference to this actor and so run
      // this destructor itself.
      if (transferThread->get_id() == std::this_thread::get_id()) {
        transferThread->detach();
      } else {
        transferThread->join();
      }
    }
  }
};

using Self = caf::stateful_actor<ShardState>;

caf::error invalid(const Status& s) { return caf::make_error(caf::sec::invalid_argument, s.message()); }

// Replication -----------------------------------------------------------

// The backup is gone (down, timed out, detached by the coordinator, or it
// answered otherwise than this copy): every acknowledgement waiting for it
// goes out on this copy's word, and the coordinator hears of it.
void dropBackup(Self* self, const std::string& why, bool tell) {
  auto& st = self->state;
  if (!st.backup) return;
  st.log->warn("shard {}: its backup ({}) is gone: {}; it serves alone until a new one is built", st.options.shard,
               st.backupName, why);
  st.backup = nullptr;
  st.backupName.clear();
  ++st.backupEpoch;
  st.catchingUp = false;
  st.catchUpLeft = 0;
  st.serializing = false;
  if (auto t = std::move(st.transfer)) {
    t->promise.deliver(caf::make_error(caf::sec::runtime_error,
                                       fmt::format("shard {}: its new backup was lost before it had the state: {}",
                                                   st.options.shard, why)));
  }
  if (auto f = std::move(st.onCaughtUp)) {
    st.onCaughtUp = nullptr;
    f(false);
  }
  auto waiting = std::move(st.awaitingBackup);
  st.awaitingBackup.clear();
  for (auto& [id, j] : waiting) {
    j->remoteDone = true;
    if (j->localDone && !j->delivered) {
      j->delivered = true;
      if (j->localError) {
        j->promise.deliver(j->localError);
      } else {
        j->promise.deliver(j->value);
      }
    }
  }
  if (tell && st.options.coordinator) {
    self->send(st.options.coordinator, backup_lost_atom::value, int64_t(st.options.shard), why);
  }
}

void finishJoin(Self* self, const std::shared_ptr<Join>& j) {
  if (!j->localDone || !j->remoteDone || j->delivered) return;
  j->delivered = true;
  auto& st = self->state;
  if (j->remoteAnswered && bool(j->remoteError) != bool(j->localError) && j->epoch == st.backupEpoch) {
    // The copies no longer agree: the backup cannot stand in for this one.
    dropBackup(self,
               j->remoteError ? fmt::format("it refused a change this copy took ({})", caf::to_string(j->remoteError))
                              : "it took a change this copy refused",
               true);
  }
  if (j->localError) {
    j->promise.deliver(j->localError);
  } else {
    j->promise.deliver(j->value);
  }
}

bool backupUnreachable(const caf::error& err) {
  return err == caf::sec::request_receiver_down || err == caf::sec::request_timeout ||
         err.category() == transport::kDepartureCategory;
}

// A message that changes the shard's state goes to the backup too, in the
// order this copy takes it; `onReply` sees the backup's answer (or its
// error). A backup that cannot be reached is dropped.
template <class... Ts>
void forward(Self* self, const caf::message& msg, std::function<void(const caf::error*)> onReply) {
  auto& st = self->state;
  if (!st.backup) return;
  const uint64_t epoch = st.backupEpoch;
  self->request(st.backup, st.options.backupTimeout, msg)
      .then([onReply](Ts...) { if (onReply) onReply(nullptr); },
            [self, epoch, onReply](caf::error& err) {
              if (backupUnreachable(err) && self->state.backupEpoch == epoch) {
                dropBackup(self, fmt::format("it did not answer: {}", caf::to_string(err)), true);
              }
              if (onReply) onReply(&err);
            });
}

// The acknowledgement of the push in `msg`: joined with the backup's when
// one is attached (the push goes there too).
void maybeCaughtUp(Self* self);

// The new backup is still catching up (the job does not count it as a
// copy yet): a change goes there in order, answered on this copy's word.
void catchUpForward(Self* self, const caf::message& msg, std::shared_ptr<int> outcome) {
  auto& st = self->state;
  ++st.catchUpLeft;
  const uint64_t epoch = st.backupEpoch;
  forward<int64_t>(self, msg, [self, epoch, outcome](const caf::error* err) {
    auto& st = self->state;
    if (st.backupEpoch != epoch) return;
    const bool answered = !err || !backupUnreachable(*err);
    if (answered && outcome && *outcome >= 0 && (err == nullptr) != (*outcome == 1)) {
      // The copies differ: this one cannot count as a copy.
      dropBackup(self, err ? "it refused a change this copy took, as it caught up"
                           : "it took a change this copy refused, as it caught up",
                 true);
      return;
    }
    --st.catchUpLeft;
    maybeCaughtUp(self);
  });
}

void maybeCaughtUp(Self* self) {
  auto& st = self->state;
  if (st.catchingUp || st.catchUpLeft > 0 || !st.onCaughtUp) return;
  auto f = std::move(st.onCaughtUp);
  st.onCaughtUp = nullptr;
  f(true);
}

Ack ackOf(Self* self, PushPromise promise, const caf::message& msg) {
  auto& st = self->state;
  Ack a{std::move(promise), nullptr};
  if (!st.backup) return a;
  if (st.serializing) {
    // The state is being made into bytes: the change follows them.
    a.outcome = std::make_shared<int>(-1);
    st.transfer->queued.emplace_back(msg, a.outcome);
    return a;
  }
  if (st.catchingUp) {
    // The backup has not answered the state yet. (Once it has, changes wait
    // for it as usual; only those sent before are still counted.)
    a.outcome = std::make_shared<int>(-1);
    catchUpForward(self, msg, a.outcome);
    return a;
  }
  auto j = std::make_shared<Join>(a.promise);
  j->epoch = st.backupEpoch;
  const uint64_t id = st.nextJoin++;
  st.awaitingBackup.emplace(id, j);
  forward<int64_t>(self, msg, [self, j, id](const caf::error* err) {
    if (self->state.awaitingBackup.erase(id) == 0) return;  // dropped with its backup: answered already
    if (!err || !backupUnreachable(*err)) j->remoteAnswered = true;
    if (err && !backupUnreachable(*err)) j->remoteError = *err;
    j->remoteDone = true;
    finishJoin(self, j);
  });
  a.join = std::move(j);
  return a;
}

void settle(Self* self, Ack& a, int64_t value) {
  if (a.outcome) *a.outcome = 1;
  if (!a.join) {
    a.promise.deliver(value);
    return;
  }
  a.join->localDone = true;
  a.join->value = value;
  finishJoin(self, a.join);
}

void settle(Self* self, Ack& a, caf::error err) {
  if (a.outcome) *a.outcome = 0;
  if (!a.join) {
    a.promise.deliver(std::move(err));
    return;
  }
  a.join->localDone = true;
  a.join->localError = std::move(err);
  finishJoin(self, a.join);
}

// A change's outcome, whichever it is.
void settle(Self* self, Ack& a, caf::expected<int64_t> r) {
  if (r) {
    settle(self, a, *r);
  } else {
    settle(self, a, std::move(r.error()));
  }
}

int64_t minLiveClock(const ShardState& st) {
  int64_t m = std::numeric_limits<int64_t>::max();
  for (int64_t w : st.live) m = std::min(m, st.clock[size_t(w)]);
  return m;
}

bool pullReady(const ShardState& st, const PullView& v) {
  if (!v.create || st.options.consistency == Consistency::kAsp || st.live.empty()) return true;
  const int64_t bound = st.options.consistency == Consistency::kBsp ? 0 : st.options.staleness;
  return minLiveClock(st) >= v.step - bound;
}

// The rest of a shard's state from a checkpoint's image (its tables are
// loaded already).
void restoreFrom(ShardState& st, const ShardImage& img, bool exactLive = false) {
  st.dense = img.dense;
  st.updates = img.updates;
  st.pulledAt.clear();  // (pulls of the state before; its workers pull again before they push)
  st.served.clear();
  st.live.clear();
  for (int w = 0; w < st.options.workers; ++w) {
    const WorkerCut& c = img.workerCut[size_t(w)];
    st.applied[size_t(w)] = AppliedWindow(c.floor, c.early);
    st.clock[size_t(w)] = c.clock;
    if (c.live || (st.options.groupTrains && !exactLive)) st.live.insert(w);
  }
  st.stats.samplesApplied = img.samplesApplied;
  st.stats.pushesApplied = img.pushesApplied;
  st.stats.duplicatePushes = img.duplicatePushes;
  st.undo = ShardState::Undo{};
  st.log->info("shard {}: restored {} rows and the pushes of {} workers from {}", st.options.shard,
               st.tables->rows(), st.options.workers, exactLive ? "its primary" : "a checkpoint");
}

caf::error staleGeneration(const ShardState& st, int64_t worker, int64_t generation) {
  return caf::make_error(caf::sec::runtime_error,
                         fmt::format("shard {}: a message of worker {} of generation {}; the job is at generation {} "
                                     "(it rolled back to a checkpoint)",
                                     st.options.shard, worker, generation, st.generation));
}

// A redone step's pull: the weights its step changed, as they were before.
void overlayUndo(ShardState& st, const PullView& v, float* rows, float* dense, size_t denseFloats) {
  auto& u = st.undo;
  const auto& dims = st.tables->dims();
  if (!u.indexed) {
    u.index.assign(dims.size(), {});
    size_t at = 0, k = 0;
    for (size_t t = 0; t < dims.size(); ++t) {
      const size_t stride = size_t(u.whole ? st.tables->table(t).rowFloats() : dims[t]);
      for (uint64_t i = 0; i < u.counts[t]; ++i, ++k, at += stride) u.index[t].emplace(u.keys[k], at);
    }
    u.indexed = true;
  }
  size_t at = 0, k = 0;
  for (size_t t = 0; t < dims.size(); ++t) {
    for (uint64_t i = 0; i < v.counts[t]; ++i, ++k, at += size_t(dims[t])) {
      auto it = u.index[t].find(v.keys[k]);
      if (it != u.index[t].end()) std::copy_n(u.rows.data() + it->second, dims[t], rows + at);
    }
  }
  if (denseFloats) std::copy_n(u.dense.begin(), denseFloats, dense);
}

// A part of a pull's reply: `floats` floats of the shard's reply buffers,
// written through `*out`.
Expected<Tensor> replyPart(ShardState& st, size_t floats, float** out) {
  if (floats == 0) {
    *out = nullptr;
    return Tensor::adopt(std::vector<float>(), DType::kFloat32);
  }
  std::byte* p = nullptr;
  Tensor t = Tensor::fromPool(*st.replyBuffers, uint64_t(floats) * sizeof(float), DType::kFloat32, &p);
  *out = reinterpret_cast<float*>(p);
  if (p == nullptr) {
    return Status::unavailable(fmt::format("no memory for a pull reply of {} floats", floats));
  }
  return t;
}

void serve(Self* self, const PullView& v, PullPromise& promise) {
  auto& st = self->state;
  if (v.create && !st.live.empty()) st.stats.maxLead = std::max(st.stats.maxLead, v.step - minLiveClock(st));
  const size_t denseFloats = v.dense ? size_t(st.denseSize) : 0;
  float* rows = nullptr;
  float* dense = nullptr;
  auto rowsT = replyPart(st, v.rowFloats, &rows);
  auto denseT = replyPart(st, denseFloats, &dense);
  // A part that could not be made (no memory, or its encoding failed): the
  // pull fails, saying why.
  auto failed = [&](const char* doing) {
    if (rowsT.hasValue() && denseT.hasValue()) return false;
    const Status& bad = rowsT.hasValue() ? denseT.status() : rowsT.status();
    st.log->error("shard {}: {}{}", st.options.shard, doing, bad.message());
    promise.deliver(caf::make_error(caf::sec::runtime_error, bad.toString()));
    return true;
  };
  if (failed("")) return;
  st.tables->pull(v.counts, v.keys, v.create, rows);
  std::copy_n(st.dense.begin(), denseFloats, dense);
  if (v.create && st.undo.step >= 0 && v.step == st.undo.step) overlayUndo(st, v, rows, dense, denseFloats);
  ++st.stats.pullsServed;
  if (v.create && st.primary) {
    st.pulledAt[{v.worker, v.step}] = st.updates;  // (its push's staleness)
    if (st.options.delayCompensation > 0 && st.options.consistency != Consistency::kBsp) {
      ShardState::Served& was = st.served[{v.worker, v.step}];
      const auto& dims = st.tables->dims();
      was.index.assign(dims.size(), {});
      size_t off = 0, k = 0;
      for (size_t t = 0; t < dims.size(); ++t) {
        for (uint64_t i = 0; i < v.counts[t]; ++i, ++k, off += size_t(dims[t])) was.index[t].emplace(v.keys[k], off);
      }
      was.rows.assign(rows, rows + v.rowFloats);
      was.dense.assign(st.dense.begin(), st.dense.begin() + st.denseSize);
    }
  }
  // compression.pull: a training pull past the warm-up gets its weights
  // cast (no residual: weights are sent whole every time).
  const kernels::Codec* codec = v.create && v.step >= st.options.warmupSteps ? st.pullCodec.get() : nullptr;
  if (codec != nullptr && codec->kind() != kernels::CodecKind::kNone) {
    rowsT = encodePart(rows, v.rowFloats, codec, nullptr, uint64_t(v.step));
    if (denseFloats) denseT = encodePart(dense, denseFloats, codec, nullptr, uint64_t(v.step));
    if (failed("cannot encode a pull's reply: ")) return;
  }
  promise.deliver(std::move(*rowsT), std::move(*denseT));
}

void serveParked(Self* self) {
  auto& parked = self->state.parked;
  for (size_t i = 0; i < parked.size();) {
    if (pullReady(self->state, parked[i].view)) {
      serve(self, parked[i].view, parked[i].promise);
      parked.erase(parked.begin() + int64_t(i));
    } else {
      ++i;
    }
  }
}

// The first sequence (= step) of `worker` this shard has neither applied
// nor holds for its BSP step.
int64_t received(const ShardState& st, int64_t worker) {
  int64_t next = st.applied[size_t(worker)].floor();
  for (bool held = true; held;) {
    held = st.applied[size_t(worker)].contains(next);
    for (const auto& [s, pendingStep] : st.pending) {
      auto it = pendingStep.parts.find(worker);
      held = held || (it != pendingStep.parts.end() && it->second.view.sequence == next);
    }
    if (held) ++next;
  }
  return next;
}

// A push of `worker` for `step` just applied on the weights of update
// `before` (the shard's count of updates then): how many updates its
// gradient missed since the pull it was computed on (ShardStats::staleness).
// The worker's older pulls are forgotten with it (a step it left undone).
void recordStaleness(ShardState& st, int64_t worker, int64_t step, int64_t before) {
  if (!st.primary) {  // (a backup serves no pulls: what it applies before a promotion is unknown)
    ++st.stats.stalenessUnknown;
    return;
  }
  auto it = st.pulledAt.find({worker, step});
  if (it == st.pulledAt.end()) {
    ++st.stats.stalenessUnknown;
  } else {
    const int64_t missed = std::clamp<int64_t>(before - it->second, 0, kStalenessBuckets - 1);
    if (st.stats.staleness.size() <= size_t(missed)) st.stats.staleness.resize(size_t(missed) + 1, 0);
    ++st.stats.staleness[size_t(missed)];
  }
  for (auto at = st.pulledAt.lower_bound({worker, std::numeric_limits<int64_t>::min()});
       at != st.pulledAt.end() && at->first.first == worker && at->first.second <= step;) {
    at = st.pulledAt.erase(at);
  }
  for (auto at = st.served.lower_bound({worker, std::numeric_limits<int64_t>::min()});
       at != st.served.end() && at->first.first == worker && at->first.second <= step;) {
    at = st.served.erase(at);
  }
}

// ShardOptions::staleLr and delayCompensation for an ASP / SSP push of
// `worker` for `step`, before it is applied: the learning rate's scale
// (1: as configured), and with delay compensation *grads and *denseGrads
// pointed at the compensated gradients (st.compensated*).
float staleAware(ShardState& st, const PushView& v, int64_t step, const float** grads, const float** denseGrads) {
  auto at = st.pulledAt.find({v.worker, step});
  if (!st.primary || at == st.pulledAt.end()) return 1.0f;  // unknown staleness: as it is
  const int64_t missed = std::max<int64_t>(0, st.updates - at->second);
  const float lrScale = st.options.staleLr ? 1.0f / float(missed + 1) : 1.0f;
  if (missed == 0 || st.options.delayCompensation <= 0) return lrScale;  // w_now = w_stale
  auto served = st.served.find({v.worker, step});
  if (served == st.served.end()) return lrScale;
  const float lambda = st.options.delayCompensation;
  const ShardState::Served& was = served->second;
  // The rows as they are now (every pushed key was created by its pull).
  st.now.resize(v.gradFloats);
  st.tables->pull(v.counts, v.keys, false, st.now.data());
  st.compensated.assign(*grads, *grads + v.gradFloats);
  const auto& dims = st.tables->dims();
  size_t off = 0, k = 0;
  for (size_t t = 0; t < dims.size(); ++t) {
    const size_t dim = size_t(dims[t]);
    for (uint64_t i = 0; i < v.counts[t]; ++i, ++k, off += dim) {
      if (t >= was.index.size()) continue;
      auto it = was.index[t].find(v.keys[k]);
      if (it == was.index[t].end()) continue;  // not in its pull: as it is
      for (size_t j = 0; j < dim; ++j) {
        const float g = st.compensated[off + j];
        st.compensated[off + j] = g + lambda * g * g * (st.now[off + j] - was.rows[it->second + j]);
      }
    }
  }
  *grads = st.compensated.data();
  if (*denseGrads && v.denseFloats > 0 && was.dense.size() == v.denseFloats) {
    st.compensatedDense.assign(*denseGrads, *denseGrads + v.denseFloats);
    for (size_t j = 0; j < v.denseFloats; ++j) {
      const float g = st.compensatedDense[j];
      st.compensatedDense[j] = g + lambda * g * g * (st.dense[j] - was.dense[j]);
    }
    *denseGrads = st.compensatedDense.data();
  }
  return lrScale;
}

// One optimizer step for the tables and the dense slice; lrScale scales
// every learning rate (ps.stale_lr), denseScale the dense one too (the
// pushes' train.lr_decay).
Status apply(ShardState& st, const uint64_t* counts, const uint64_t* keys, const float* grads,
             const float* denseGrads, float lrScale = 1.0f, float denseScale = 1.0f) {
  const int64_t step = ++st.updates;
  Status s = st.tables->push(counts, keys, grads, step, *st.kernels, lrScale);
  if (!s.isOk()) return s;
  if (denseGrads && st.denseSize > 0) {
    kernels::OptimizerConfig c = st.options.denseOptimizer;
    c.step = step;
    c.learningRate *= lrScale * denseScale;
    float* row = st.dense.data();
    s = st.kernels->applyRowOptimizer(c, &row, 1, st.denseSize, denseGrads);
  }
  ++st.stats.pushesApplied;
  return s;
}

// Applies every complete BSP step, in order.
void applyReadySteps(Self* self) {
  auto& st = self->state;
  while (!st.pending.empty()) {
    auto it = st.pending.begin();
    PendingStep& step = it->second;
    bool complete = !step.parts.empty();
    for (int64_t w : st.live) complete = complete && step.parts.count(w) > 0;
    if (!complete) return;
    // Average the parts: the gradient of the mean loss over the global batch.
    const float scale = 1.0f / float(step.parts.size());
    const size_t tables = st.tables->size();
    st.counts.assign(tables, 0);
    st.keys.clear();
    st.grads.clear();
    st.denseGrads.assign(size_t(st.denseSize), 0.0f);
    bool anyDense = false;
    // Table by table, each part's keys and gradients in turn: every part's
    // read position moves through its own message once.
    std::vector<std::pair<const uint64_t*, const float*>> at;
    for (auto& [w, part] : step.parts) at.emplace_back(part.view.keys, part.view.grads);
    for (size_t t = 0; t < tables; ++t) {
      const int64_t dim = st.tables->dims()[t];
      size_t p = 0;
      for (auto& [w, part] : step.parts) {
        const uint64_t n = part.view.counts[t];
        auto& [keys, grads] = at[p++];
        st.counts[t] += n;
        st.keys.insert(st.keys.end(), keys, keys + n);
        const size_t floats = size_t(n) * size_t(dim), from = st.grads.size();
        st.grads.resize(from + floats);
        float* __restrict out = st.grads.data() + from;
        for (size_t i = 0; i < floats; ++i) out[i] = grads[i] * scale;
        keys += n;
        grads += n * uint64_t(dim);
      }
    }
    for (auto& [w, part] : step.parts) {
      if (!part.view.denseGrads) continue;
      anyDense = true;
      for (size_t i = 0; i < part.view.denseFloats; ++i) st.denseGrads[i] += part.view.denseGrads[i] * scale;
    }
    const int64_t stepIndex = it->first;
    // What this step changes, as it was (see ShardState::Undo).
    auto& u = st.undo;
    u.step = stepIndex;
    u.counts = st.counts;
    u.keys = st.keys;
    u.whole = st.options.undoWholeSteps;
    size_t floats = 0;
    for (size_t t = 0; t < tables; ++t) {
      floats += size_t(st.counts[t]) * size_t(u.whole ? st.tables->table(t).rowFloats() : st.tables->dims()[t]);
    }
    u.rows.resize(floats);
    if (!u.whole) {
      st.tables->pull(u.counts.data(), u.keys.data(), false, u.rows.data());
      u.dense.assign(st.dense.begin(), st.dense.begin() + st.denseSize);
    } else {
      float* out = u.rows.data();
      const uint64_t* key = u.keys.data();
      for (size_t t = 0; t < tables; ++t) {
        EmbeddingTable& table = st.tables->table(t);
        const size_t rowFloats = size_t(table.rowFloats());
        for (uint64_t i = 0; i < u.counts[t]; ++i, ++key, out += rowFloats) {
          std::copy_n(table.findOrCreate(*key), rowFloats, out);  // the push creates it anyway
        }
      }
      u.dense = st.dense;
    }
    u.parts.clear();
    for (auto& [w, part] : step.parts) u.parts.push_back({w, part.view.sequence, part.view.samples});
    u.indexed = false;
    const int64_t before = st.updates;
    // (A step's parts may be of two epochs, where the ranks' shares of an
    // epoch differ by a batch: the least scale.)
    double denseScale = 1;
    for (auto& [w, part] : step.parts) denseScale = std::min(denseScale, part.view.lrScale);
    Status s = apply(st, st.counts.data(), st.keys.data(), st.grads.data(), anyDense ? st.denseGrads.data() : nullptr,
                     1.0f, float(denseScale));
    if (s.isOk()) {
      for (auto& [w, part] : step.parts) recordStaleness(st, w, stepIndex, before);  // (one update for them all)
    }
    for (auto& [w, part] : step.parts) {
      if (s.isOk()) {
        st.applied[size_t(w)].insert(part.view.sequence);
        st.stats.samplesApplied += part.view.samples;
      }
      st.clock[size_t(w)] = std::max(st.clock[size_t(w)], stepIndex + 1);
      for (auto& p : part.promises) {
        if (s.isOk()) {
          settle(self, p, part.view.sequence);
        } else {
          settle(self, p, caf::make_error(caf::sec::runtime_error, s.toString()));
        }
      }
    }
    st.pending.erase(it);
  }
}

// This copy's whole state, exactly (a new backup's, and a checkpoint's
// before snapshot_atom cuts a group job's lost ranks where the group is).
std::shared_ptr<ShardImage> imageOf(const ShardState& st) {
  auto img = std::make_shared<ShardImage>();
  img->shard = st.options.shard;
  img->shards = st.options.shards;
  img->workers = st.options.workers;
  img->consistency = int64_t(st.options.consistency);
  img->updates = st.updates;
  img->tables = st.tables->image();
  img->denseSize = st.denseSize;
  img->dense = st.dense;
  for (int w = 0; w < st.options.workers; ++w) {
    img->workerCut.push_back(WorkerCut{st.applied[size_t(w)].floor(), st.applied[size_t(w)].earlyList(),
                                       st.clock[size_t(w)], st.live.count(w) > 0});
  }
  img->samplesApplied = st.stats.samplesApplied;
  img->pushesApplied = st.stats.pushesApplied;
  img->duplicatePushes = st.stats.duplicatePushes;
  return img;
}

std::string transferPath(int shard) {
  static std::atomic<uint64_t> next{0};
  return (std::filesystem::temp_directory_path() /
          fmt::format("troupe-transfer-{}-{}-{}.img", ::getpid(), shard, next.fetch_add(1)))
      .string();
}

// An image as the bytes of its file (checksummed: the receiver checks it
// as it checks a checkpoint).
Expected<std::vector<std::byte>> imageBytes(const ShardImage& img) {
  const std::string path = transferPath(int(img.shard));
  Status s = writeShardImage(img, path);
  if (!s.isOk()) return s;
  std::vector<std::byte> bytes;
  {
    std::ifstream in(path, std::ios::binary);
    in.seekg(0, std::ios::end);
    bytes.resize(size_t(std::max<std::streamoff>(0, in.tellg())));
    in.seekg(0);
    in.read(reinterpret_cast<char*>(bytes.data()), std::streamsize(bytes.size()));
    if (!in) s = Status::ioError(fmt::format("{}: cannot read back the image just written", path));
  }
  std::filesystem::remove(path);
  if (!s.isOk()) return s;
  return bytes;
}

Expected<ShardImage> imageFromBytes(const Tensor& bytes, int shard) {
  const std::string path = transferPath(shard);
  {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data), std::streamsize(bytes.bytes));
    if (!out) return Status::ioError(fmt::format("{}: cannot write the image received", path));
  }
  auto image = readShardImage(path);
  std::filesystem::remove(path);
  return image;
}

// wire.h, install: the state a primary sent becomes this copy's (what it
// held for a BSP step is dropped: the primary sends it again).
caf::expected<int64_t> installImage(Self* self, const Tensor& bytes, int64_t generation) {
  auto& st = self->state;
  auto image = imageFromBytes(bytes, st.options.shard);
  Status s = image.hasValue() ? checkShardImage(*image, st.options) : image.status();
  auto tables = std::make_unique<TableSet>(st.options.tables);
  if (s.isOk()) s = tables->load(image->tables);
  if (!s.isOk()) {
    st.log->error("shard {}: refused the state its primary sent: {}", st.options.shard, s.message());
    return caf::make_error(caf::sec::invalid_argument, s.message());
  }
  const auto gone = caf::make_error(caf::sec::runtime_error, "the copy took its primary's state anew");
  for (auto& [step, pendingStep] : st.pending) {
    for (auto& [w, part] : pendingStep.parts) {
      for (auto& p : part.promises) settle(self, p, gone);
    }
  }
  st.pending.clear();
  for (auto& p : st.parked) p.promise.deliver(gone);
  st.parked.clear();
  st.tables = std::move(tables);
  restoreFrom(st, *image, true);
  st.generation = generation;
  return int64_t(st.options.shard);
}

// The state's bytes are ready (made on a thread of their own): the backup
// gets them, then every change queued meanwhile, in order.
void sendState(Self* self, uint64_t epoch, Expected<std::vector<std::byte>> bytes) {
  auto& st = self->state;
  auto& t = st.transfer;
  if (!t || st.backupEpoch != epoch || !st.backup) return;  // dropped meanwhile: answered then
  auto promise = t->promise;
  const int64_t shard = st.options.shard;
  if (!bytes.hasValue()) {
    // Answers the replicate request (the transfer's promise) with why.
    dropBackup(self, fmt::format("shard {}: cannot copy its state: {}", shard, bytes.status().message()), false);
    return;
  }
  const size_t size = bytes->size();
  const auto started = t->started;
  st.serializing = false;
  self->request(st.backup, st.options.backupTimeout, install_atom::value,
                Tensor::adopt(std::move(*bytes), DType::kBytes), t->generation)
      .then(
          [=](int64_t) mutable {
            auto& st = self->state;
            if (st.backupEpoch != epoch) {
              promise.deliver(caf::make_error(
                  caf::sec::runtime_error, fmt::format("shard {}: its backup was replaced or lost as it took the state",
                                                       shard)));
              return;
            }
            st.catchingUp = false;
            st.onCaughtUp = [=](bool ok) mutable {
              if (!ok) {
                promise.deliver(caf::make_error(caf::sec::runtime_error,
                                                fmt::format("shard {}: its backup was lost as it caught up", shard)));
                return;
              }
              const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
              self->state.log->info("shard {}: its new backup {} has its state ({} bytes) and what came since, in "
                                    "{:.3f} s: two copies again",
                                    shard, self->state.backupName, size, secs);
              promise.deliver(shard);
            };
            maybeCaughtUp(self);
          },
          [=](caf::error& err) mutable {
            if (self->state.backupEpoch == epoch) {
              dropBackup(self, fmt::format("it did not take the state: {}", caf::to_string(err)), false);
            }
            promise.deliver(err);
          });
  // What came while the bytes were made, after them.
  auto queued = std::move(t->queued);
  t.reset();
  for (auto& [msg, outcome] : queued) catchUpForward(self, msg, outcome);
}

// wire.h, replicate: the copy `name` on node `node` becomes the backup.
caf::result<int64_t> replicateTo(Self* self, int64_t node, const std::string& name, bool transfer) {
  auto& st = self->state;
  const int64_t shard = st.options.shard;
  caf::actor b = st.options.locate ? st.options.locate(uint64_t(node), name) : caf::actor{};
  if (!b) {
    return caf::make_error(caf::sec::invalid_argument,
                           fmt::format("shard {}: no copy '{}' on node {:x} to replicate to", shard, name, node));
  }
  dropBackup(self, "a new backup replaces it", false);
  st.primary = true;
  st.backup = b;
  st.backupName = fmt::format("'{}' on node {:x}", name, uint64_t(node));
  ++st.backupEpoch;
  if (!transfer) {
    st.log->info("shard {}: replicated to {}", shard, st.backupName);
    return shard;
  }
  // The state as it is now (copied here: a consistent cut), made into bytes
  // on a thread of its own while this copy serves on. The backup gets the
  // state first, then the pushes held for a BSP step (not in the image),
  // then every change from now on, in order. Until it has the state and has
  // answered every change sent after it, changes are answered on this
  // copy's word (ackOf), and the answer to replicate (the job counts two
  // copies again) waits for that.
  auto img = imageOf(st);
  auto promise = self->make_response_promise<int64_t>();
  const uint64_t epoch = st.backupEpoch;
  st.transfer = std::make_unique<ShardState::Transfer>();
  st.transfer->promise = promise;
  st.transfer->started = std::chrono::steady_clock::now();
  st.transfer->generation = st.generation;
  st.serializing = true;
  st.catchingUp = true;
  st.catchUpLeft = 0;
  for (auto& [step, pendingStep] : st.pending) {
    for (auto& [w, part] : pendingStep.parts) st.transfer->queued.emplace_back(part.msg, nullptr);
  }
  if (st.transferThread && st.transferThread->joinable()) st.transferThread->join();
  // A weak handle: the thread must not keep the shard alive.
  auto weak = caf::actor_cast<caf::weak_actor_ptr>(self->ctrl());
  st.transferThread = std::make_shared<std::thread>([img, weak, epoch] {
    auto bytes = imageBytes(*img);
    if (auto strong = weak.lock()) {
      caf::anon_send(caf::actor_cast<caf::actor>(strong), transfer_ready_atom::value, epoch,
                     std::make_shared<StateBytes>(StateBytes{std::move(bytes)}));
    }
  });
  return promise;
}

caf::behavior shard(Self* self, ShardOptions options, std::shared_ptr<std::unique_ptr<TableSet>> tables) {
  auto& st = self->state;
  st.options = std::move(options);
  st.tables = std::move(*tables);
  st.kernels = st.options.kernels ? st.options.kernels
                                  : std::shared_ptr<kernels::Kernels>(
                                        kernels::createKernels({kernels::Device::kCpu, st.options.threads}));
  st.denseSize = int64_t(st.options.denseInit.size());
  st.dense.assign(size_t(kernels::optimizerRowFloats(st.options.denseOptimizer.kind, st.denseSize)), 0.0f);
  std::copy(st.options.denseInit.begin(), st.options.denseInit.end(), st.dense.begin());
  kernels::initRowState(st.options.denseOptimizer, st.dense.data(), st.denseSize);
  st.clock.assign(size_t(st.options.workers), 0);
  st.applied.assign(size_t(st.options.workers), AppliedWindow{});
  for (int w = 0; w < st.options.workers; ++w) st.live.insert(w);
  st.generation = st.options.generation;
  st.primary = !st.options.backup;
  if (st.options.pushCodec.kind != kernels::CodecKind::kNone) st.pushCodec = kernels::makeCodec(st.options.pushCodec);
  if (st.options.pullCodec.kind != kernels::CodecKind::kNone) st.pullCodec = kernels::makeCodec(st.options.pullCodec);
  if (const auto& img = st.options.restore) {
    restoreFrom(st, *img);  // checked, and its tables loaded, by spawnShard
    st.options.restore.reset();  // its rows are in the tables now
  }
  // Whatever else arrives (a stray error, an unknown message from the
  // network) is logged and dropped: it must not stop the shard.
  self->set_error_handler([=](caf::error& err) {
    self->state.log->warn("shard {}: ignored an error message: {}", self->state.options.shard, caf::to_string(err));
  });
  auto refuse = [=](caf::scheduled_actor*, caf::message_view& x) -> caf::result<caf::message> {
    self->state.log->warn("shard {}: refused an unknown message {}", self->state.options.shard,
                          caf::to_string(x.content()));
    return caf::sec::unexpected_message;
  };
  self->set_default_handler(refuse);
  caf::behavior serving{
      [=](pull_atom a, int64_t worker, int64_t step, bool create, bool dense, const Tensor& counts,
          const Tensor& keys, int64_t generation) -> PullPromise {
        auto& st = self->state;
        auto promise = self->make_response_promise<Tensor, Tensor>();
        if (generation != st.generation) {
          promise.deliver(staleGeneration(st, worker, generation));
          return promise;
        }
        caf::message msg = caf::make_message(a, worker, step, create, dense, counts, keys, generation);
        auto view = pullFromWire(msg, st.tables->dims());
        if (!view.hasValue()) {
          st.log->warn("shard {}: refused a pull: {}", st.options.shard, view.status().message());
          promise.deliver(invalid(view.status()));
          return promise;
        }
        if (pullReady(st, *view)) {
          serve(self, *view, promise);
        } else {
          ++st.stats.pullsDelayed;
          if (st.parked.empty() && st.options.parkTimeout.count() > 0) {
            self->delayed_send(self, std::chrono::seconds(1), tick_atom::value);
          }
          st.parked.push_back(ParkedPull{std::move(msg), *view, promise, self->clock().now()});
        }
        return promise;
      },
      [=](push_atom a, int64_t worker, int64_t sequence, int64_t step, int64_t samples, const Tensor& counts,
          const Tensor& keys, const Tensor& grads, const Tensor& denseGrads, int64_t generation,
          double lrScale) -> PushPromise {
        auto& st = self->state;
        auto promise = self->make_response_promise<int64_t>();
        caf::message msg = caf::make_message(a, worker, sequence, step, samples, counts, keys, grads, denseGrads,
                                             generation, lrScale);
        // With a backup, the push goes there too, and its sender hears once both have it.
        Ack ack = ackOf(self, promise, msg);
        if (generation != st.generation) {
          settle(self, ack, staleGeneration(st, worker, generation));
          return promise;
        }
        // compression.push: encoded gradients become float32 here (the
        // backup got the message as it came, and decodes it alike).
        auto decoded = decodePush(msg, st.tables->dims(), size_t(st.denseSize), st.pushCodec.get());
        if (decoded.hasValue()) msg = std::move(*decoded);
        auto view = decoded.hasValue() ? pushFromWire(msg, st.tables->dims(), size_t(st.denseSize))
                                       : Expected<PushView>(decoded.status());
        Status bad = view.hasValue() ? Status::ok() : view.status();
        if (bad.isOk() && (worker < 0 || worker >= st.options.workers)) {
          bad = Status::invalidArgument(fmt::format("push from worker {}; the job has {}", worker, st.options.workers));
        }
        if (bad.isOk() && step < 0) bad = Status::invalidArgument(fmt::format("push for step {}", step));
        if (bad.isOk() && !st.applied[size_t(worker)].acceptable(sequence)) {
          bad = Status::invalidArgument(fmt::format("push {} of worker {}, whose oldest unapplied push is {}", sequence,
                                                    worker, st.applied[size_t(worker)].floor()));
        }
        if (!bad.isOk()) {
          st.log->warn("shard {}: refused a push: {}", st.options.shard, bad.message());
          settle(self, ack, invalid(bad));
          return promise;
        }
        if (st.applied[size_t(worker)].contains(sequence)) {
          ++st.stats.duplicatePushes;
          settle(self, ack, sequence);
          return promise;
        }
        if (st.options.consistency == Consistency::kBsp) {
          for (auto& [s, pendingStep] : st.pending) {
            auto it = pendingStep.parts.find(worker);
            if (it != pendingStep.parts.end() && it->second.view.sequence == sequence) {
              ++st.stats.duplicatePushes;
              it->second.promises.push_back(ack);
              return promise;
            }
          }
          auto& part = st.pending[step].parts[worker];
          if (!part.promises.empty()) {
            settle(self, ack, invalid(Status::invalidArgument(
                fmt::format("worker {} pushed step {} twice (sequences {} and {})", worker, step,
                            part.view.sequence, sequence))));
            return promise;
          }
          part.msg = std::move(msg);
          part.view = *view;
          part.promises.push_back(ack);
          applyReadySteps(self);
        } else {
          const int64_t before = st.updates;
          const float* grads = view->grads;
          const float* denseGrads = view->denseGrads;
          const float lrScale = st.options.staleLr || st.options.delayCompensation > 0
                                    ? staleAware(st, *view, step, &grads, &denseGrads)
                                    : 1.0f;
          Status s = apply(st, view->counts, view->keys, grads, denseGrads, lrScale, float(view->lrScale));
          if (!s.isOk()) {
            settle(self, ack, caf::make_error(caf::sec::runtime_error, s.toString()));
            return promise;
          }
          recordStaleness(st, worker, step, before);
          st.applied[size_t(worker)].insert(sequence);
          st.stats.samplesApplied += view->samples;
          st.clock[size_t(worker)] = std::max(st.clock[size_t(worker)], step + 1);
          settle(self, ack, sequence);
        }
        serveParked(self);
        return promise;
      },
      [=](leave_atom a, int64_t worker, int64_t generation) -> PushPromise {
        // Answered once the backup has it too (and it answered alike).
        auto promise = self->make_response_promise<int64_t>();
        Ack ack = ackOf(self, promise, caf::make_message(a, worker, generation));
        auto r = [&]() -> caf::expected<int64_t> {
          auto& st = self->state;
          if (generation != st.generation) return staleGeneration(st, worker, generation);
          if (st.live.erase(worker) == 0) return worker;
          st.log->debug("shard {}: worker {} left", st.options.shard, worker);
          // (Its pulls' records go: it pushes no more.)
          auto ofWorker = [worker](const auto& e) { return e.first.first == worker; };
          std::erase_if(st.pulledAt, ofWorker);
          std::erase_if(st.served, ofWorker);
          if (st.options.consistency == Consistency::kBsp) applyReadySteps(self);
          serveParked(self);
          return worker;
        }();
        settle(self, ack, std::move(r));
        return promise;
      },
      [=](clock_atom, int64_t worker) -> caf::result<int64_t> {
        auto& st = self->state;
        if (worker < 0 || worker >= st.options.workers) {
          return caf::make_error(caf::sec::invalid_argument,
                                 fmt::format("clock of worker {}; the job has {}", worker, st.options.workers));
        }
        return received(st, worker);
      },
      [=](revert_atom a, int64_t lost, int64_t from, int64_t generation) -> PushPromise {
        // Answered once the backup has it too (and it answered alike).
        auto promise = self->make_response_promise<int64_t>();
        Ack ack = ackOf(self, promise, caf::make_message(a, lost, from, generation));
        auto r = [&]() -> caf::expected<int64_t> {
          auto& st = self->state;
          if (generation < st.generation) return staleGeneration(st, lost, generation);
          if (lost < 0 || lost >= st.options.workers || from < 0) {
            return invalid(Status::invalidArgument(
                fmt::format("revert of worker {} from step {}; the job has {} workers", lost, from, st.options.workers)));
          }
          if (st.options.consistency != Consistency::kBsp) {
            return invalid(Status::invalidArgument("only a BSP shard can undo a step"));
          }
          int64_t highest = 0;  // steps applied, over the workers
          for (int64_t c : st.clock) highest = std::max(highest, c);
          if (highest > from + 1 || (highest == from + 1 && (st.undo.step != from || !st.undo.whole))) {
            const std::string why = fmt::format("shard {}: cannot go back to step {}: it applied steps up to {} and kept "
                                                "the state before step {} only",
                                                st.options.shard, from, highest - 1, st.undo.step);
            st.log->error("{}", why);
            return caf::make_error(caf::sec::runtime_error, why);
          }
          const auto gone = caf::make_error(
              caf::sec::runtime_error,
              fmt::format("shard {}: steps from {} were undone (worker {} was lost; the group goes on without it)",
                          st.options.shard, from, lost));
          for (auto it = st.pending.lower_bound(from); it != st.pending.end(); it = st.pending.erase(it)) {
            for (auto& [w, part] : it->second.parts) {
              for (auto& p : part.promises) settle(self, p, gone);
            }
          }
          for (auto& p : st.parked) p.promise.deliver(gone);
          st.parked.clear();
          if (highest == from + 1) {
            // Step `from` as if it never was: its rows, the dense slice, the counters.
            auto& u = st.undo;
            const float* in = u.rows.data();
            const uint64_t* key = u.keys.data();
            for (size_t t = 0; t < st.tables->size(); ++t) {
              EmbeddingTable& table = st.tables->table(t);
              const size_t rowFloats = size_t(table.rowFloats());
              for (uint64_t i = 0; i < u.counts[t]; ++i, ++key, in += rowFloats) {
                std::copy_n(in, rowFloats, table.findOrCreate(*key));
              }
            }
            st.dense = u.dense;
            st.updates -= 1;
            st.stats.pushesApplied -= 1;
            for (const auto& p : u.parts) st.stats.samplesApplied -= p.samples;
            st.log->info("shard {}: undid step {} ({} pushes): worker {} was lost and the group goes on without it",
                         st.options.shard, from, u.parts.size(), lost);
            st.undo = ShardState::Undo{};  // used (one not used stays: a later revert may go back to it)
          }
          for (int w = 0; w < st.options.workers; ++w) {
            st.applied[size_t(w)].forgetFrom(from);
            st.clock[size_t(w)] = std::min(st.clock[size_t(w)], from);
          }
          st.live.erase(lost);
          st.generation = generation;
          return from;
        }();
        settle(self, ack, std::move(r));
        return promise;
      },
      [=](tick_atom) {
        // Pulls parked past parkTimeout fail, naming whom they waited for.
        auto& st = self->state;
        const auto now = self->clock().now();
        auto& parked = st.parked;
        for (size_t i = 0; i < parked.size();) {
          if (now - parked[i].since < st.options.parkTimeout) {
            ++i;
            continue;
          }
          std::vector<std::string> behind;
          const int64_t bound = st.options.consistency == Consistency::kBsp ? 0 : st.options.staleness;
          for (int64_t w : st.live) {
            const int64_t next = received(st, w);
            if (next < parked[i].view.step - bound) behind.push_back(fmt::format("worker {} (at step {})", w, next));
          }
          const std::string why = fmt::format(
              "shard {}: the pull for step {} waited {} s for {}", st.options.shard, parked[i].view.step,
              std::chrono::duration_cast<std::chrono::seconds>(st.options.parkTimeout).count(), fmt::join(behind, ", "));
          st.log->error("{}", why);
          parked[i].promise.deliver(caf::make_error(caf::sec::request_timeout, why));
          parked.erase(parked.begin() + int64_t(i));
        }
        if (!parked.empty()) self->delayed_send(self, std::chrono::seconds(1), tick_atom::value);
      },
      [=](snapshot_atom, int64_t id,
          const std::string& path) -> caf::result<int64_t, std::vector<int64_t>, int64_t> {
        auto& st = self->state;
        if (st.writer && st.writer->joinable()) st.writer->join();  // one checkpoint at a time
        // The state as it is (pushes held for a BSP step are not in it:
        // their workers redo them, they were not acknowledged).
        auto img = imageOf(st);
        // A group job (hybrid) whose group went on without a lost rank: that
        // rank is cut where the group is (every rank trains again from the
        // cut when the job resumes).
        int64_t groupFloor = -1, groupClock = -1;
        for (int64_t w : st.live) {
          groupFloor = std::max(groupFloor, st.applied[size_t(w)].floor());
          groupClock = std::max(groupClock, st.clock[size_t(w)]);
        }
        std::vector<int64_t> floors;
        for (WorkerCut& cut : img->workerCut) {
          if (st.options.groupTrains && !cut.live && groupFloor >= 0) {
            cut.floor = groupFloor;
            cut.early.clear();
            cut.clock = groupClock;
          }
          floors.push_back(cut.floor);
        }
        auto requester = caf::actor_cast<caf::actor>(self->current_sender());
        const int64_t shard = st.options.shard;
        st.writer = std::make_shared<std::thread>([img, path, id, shard, requester] {
          uint64_t checksum = 0, bytes = 0;
          Status s = writeShardImage(*img, path, &checksum, &bytes);
          if (requester) {
            caf::anon_send(requester, written_atom::value, id, shard, path, bytes, checksum,
                           s.isOk() ? std::string() : s.message());
          }
        });
        return {id, std::move(floors), st.stats.samplesApplied};
      },
      [=](restore_atom a, const std::string& path, int64_t generation) -> PushPromise {
        // Answered once the backup has it too (and it answered alike).
        auto promise = self->make_response_promise<int64_t>();
        Ack ack = ackOf(self, promise, caf::make_message(a, path, generation));
        auto r = [&]() -> caf::expected<int64_t> {
          // The job rolls back: this shard's state becomes the checkpoint's,
          // and what waits on the old state is told it is gone (the backup
          // does the same).
          auto& st = self->state;
          auto image = readShardImage(path);
          Status s = image.hasValue() ? checkShardImage(*image, st.options) : image.status();
          auto tables = std::make_unique<TableSet>(st.options.tables);
          if (s.isOk()) s = tables->load(image->tables);
          if (!s.isOk()) {
            st.log->error("shard {}: cannot roll back: {}", st.options.shard, s.message());
            return caf::make_error(caf::sec::runtime_error, s.message());
          }
          const auto gone = caf::make_error(caf::sec::runtime_error, "the job rolled back to a checkpoint");
          for (auto& p : st.parked) p.promise.deliver(gone);
          st.parked.clear();
          for (auto& [step, pendingStep] : st.pending) {
            for (auto& [w, part] : pendingStep.parts) {
              for (auto& p : part.promises) settle(self, p, gone);
            }
          }
          st.pending.clear();
          st.tables = std::move(tables);
          restoreFrom(st, *image);
          st.generation = generation;
          return generation;
        }();
        settle(self, ack, std::move(r));
        return promise;
      },
      [=](stats_atom) {
        auto& st = self->state;
        st.stats.rows = st.tables->rows();
        const ShardStats& s = st.stats;
        // The ledger: per worker, the distinct pushes in this shard's state.
        std::vector<int64_t> applied;
        for (const auto& w : st.applied) applied.push_back(w.floor() + int64_t(w.early()));
        return caf::make_message(s.rows, s.pushesApplied, s.duplicatePushes, s.pullsServed, s.pullsDelayed,
                                 s.maxLead, s.samplesApplied, std::move(applied));
      },
      [=](queues_atom) {
        const auto& st = self->state;
        return caf::make_message(int64_t(st.parked.size()), int64_t(st.pending.size()),
                                 int64_t(st.awaitingBackup.size()), mailboxDepth(self));
      },
      [=](staleness_atom) {
        const auto& s = self->state.stats;
        return caf::make_message(s.staleness, s.stalenessUnknown);
      },
      [=](replicate_atom, int64_t node, const std::string& name, bool transfer) -> caf::result<int64_t> {
        return replicateTo(self, node, name, transfer);
      },
      [=](promote_atom) -> int64_t {
        auto& st = self->state;
        st.primary = true;
        st.log->warn("shard {}: this copy is the primary now (its primary was lost); it serves alone until a new "
                     "backup is built",
                     st.options.shard);
        return st.options.shard;
      },
      [=](install_atom, const Tensor& bytes, int64_t generation) -> caf::result<int64_t> {
        // A backup built again (it and its primary disagreed, or it was slow).
        if (self->state.primary) {
          return caf::make_error(caf::sec::invalid_argument,
                                 fmt::format("shard {}: this copy is the primary; it takes no state from another",
                                             self->state.options.shard));
        }
        auto r = installImage(self, bytes, generation);
        if (r) return *r;
        return r.error();
      },
      [=](transfer_ready_atom, uint64_t epoch, const StateBytesPtr& state) {
        if (self->current_sender() || !state) return;  // only from its own thread (anonymous)
        sendState(self, epoch, std::move(state->bytes));
      },
      [=](detach_atom) -> int64_t {
        dropBackup(self, "the job found its process lost", false);
        return self->state.options.shard;
      },
  };
  // A replicated copy's start (ShardOptions::Start): what is not for it
  // waits in the mailbox until it can serve.
  switch (st.options.start) {
    case ShardOptions::Start::kServe:
      return serving;
    case ShardOptions::Start::kAwaitBackup:
      self->set_default_handler(caf::skip);
      return {
          [=](replicate_atom, int64_t node, const std::string& name, bool transfer) -> caf::result<int64_t> {
            auto r = replicateTo(self, node, name, transfer);
            if (self->state.backup) {
              self->set_default_handler(refuse);
              self->become(serving);
            }
            return r;
          },
      };
    case ShardOptions::Start::kAwaitImage:
      self->set_default_handler(caf::skip);
      return {
          [=](install_atom, const Tensor& bytes, int64_t generation) -> caf::result<int64_t> {
            auto r = installImage(self, bytes, generation);
            if (r) {
              self->set_default_handler(refuse);
              self->become(serving);
              return *r;
            }
            return r.error();
          },
      };
  }
  return serving;
}

}  // namespace

const std::shared_ptr<transport::BufferPool>& replyBuffers() {
  static const auto pool = std::make_shared<transport::BufferPool>(size_t{512} << 20);
  return pool;
}

caf::actor spawnShard(caf::actor_system& system, const ShardOptions& options) {
  // Set-up errors (a bad table, an image that does not fit) throw here,
  // before any actor starts.
  auto tables = std::make_shared<std::unique_ptr<TableSet>>(std::make_unique<TableSet>(options.tables));
  if (options.restore) {
    Status s = checkShardImage(*options.restore, options);
    if (s.isOk()) s = (*tables)->load(options.restore->tables);
    if (!s.isOk()) TROUPE_SETUP_ERROR("shard {}: the checkpoint does not fit: {}", options.shard, s.message());
  }
  return system.spawn<caf::detached>(shard, options, std::move(tables));
}

}  // namespace troupe::ps
