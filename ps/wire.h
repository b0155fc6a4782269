// The shard protocol: what workers (through workers/ps_client.h) and
// parameter-server shards (ps/shard.h) say to each other, in a form that
// crosses processes through transport proxies unchanged. Keys, rows and
// gradients travel as transport::Tensors (raw buffers beside the envelope,
// zero copy on receive); small fields as integers. One key count per table,
// keys of all tables back to back.
//
//   pull:   (pull_atom, i64 worker, i64 step, bool create, bool dense,
//            Tensor key counts u64[T], Tensor keys u64[n], i64 generation)
//           -> (Tensor rows f32[sum_t n_t x dim_t], Tensor dense f32[slice or 0])
//   push:   (push_atom, i64 worker, i64 sequence, i64 step, i64 samples,
//            Tensor key counts u64[T], Tensor keys u64[n],
//            Tensor grads f32[sum_t n_t x dim_t], Tensor dense grads f32[slice or 0],
//            i64 generation, f64 dense learning-rate scale in (0, 1])
//           -> i64 sequence, once applied
//   leave:  (leave_atom, i64 worker, i64 generation) -> i64 worker   the worker
//           trains no more (refused from an older generation, like pulls and pushes)
//   clock:  (clock_atom, i64 worker) -> i64 the first step of the worker this
//           shard has not received (every push below it applied or held for
//           its BSP step): where a replacement of the worker resumes
//   stats:  (stats_atom) -> ShardStats as 7 x i64, and per worker the
//           distinct pushes in the shard's state (vector<i64>: the ledger)
//   staleness: (staleness_atom) -> (vector<i64> histogram, i64 unknown):
//           for every push this copy applied as the primary, how many
//           updates its gradient missed (ShardStats::staleness)
//   queues: (queues_atom) -> (i64 pulls parked at the consistency gate,
//           i64 BSP steps waiting for a worker's push, i64 pushes waiting
//           for the backup's answer, i64 messages in the shard actor's
//           mailbox behind this one): what waits in the shard now
//   restore: (restore_atom, string path, i64 generation) -> i64 generation:
//           the shard drops its state for the checkpoint image at `path`
//           (the job rolls back) and from then on refuses pulls and pushes
//           of an older generation (from workers of before the rollback)
//   revert: (revert_atom, i64 lost, i64 from, i64 generation) -> i64 from:
//           BSP only. A hybrid group goes on without worker `lost` and
//           redoes step `from` with the data divided anew: the shard
//           undoes what it applied of steps >= from (at most its last
//           step, from the copy it kept), drops what it holds for them,
//           no longer waits for `lost`, and refuses messages of an older
//           generation (pushes of the old group still on their way)
//   snapshot: (snapshot_atom, i64 id, string path) -> (i64 id, vector<i64>
//           every worker's applied floor, i64 samples applied) once the shard's state is copied
//           in memory; then the shard writes it to `path` and sends the
//           requester (written_atom, i64 id, i64 shard, string path, u64
//           bytes, u64 checksum, string error ("" when written))
//
// Replication (ps.replicas = 2; DESIGN.md, Supervision and fault
// tolerance): every state-changing message a primary takes (push, leave,
// revert, restore) it forwards to its backup in the order it takes them, and
// a push is acknowledged once both copies answered it.
//   replicate: (replicate_atom, i64 node, string name, bool transfer) -> i64
//           shard: the copy published as `name` by node `node`'s process is
//           this primary's backup from now on; with `transfer` the backup
//           (started empty) first gets this copy's state (install) and the
//           BSP pushes it holds, and the answer comes once it took them
//   install: (install_atom, Tensor image bytes, i64 generation) -> i64 shard
//           (primary to a new backup): the whole state, as a checkpoint
//           image's bytes (checked like a file)
//   promote: (promote_atom) -> i64 shard: the primary is lost, this backup
//           serves from now on
//   detach: (detach_atom) -> i64 shard: the backup is lost; what waits for
//           it is acknowledged on the primary's word
//   to the coordinator: (backup_lost_atom, i64 shard, string why): the
//           primary's backup stopped answering (or answered otherwise)
//
// `step` is the worker's training step (0-based): the consistency clock.
// `generation`: how many times the job has rolled back when the worker
// started (cluster.generation); a shard refuses an older one.
// `samples`: the rows of the batch the push is the gradient of (the ledger
// of samples applied). A worker's sequence numbers start at 0 and grow by
// one per push (a push's sequence is its step).
// Decoders trust nothing: element types, dtypes, lengths and counts are
// checked against the shard's tables and dense slice, and a mismatch is a
// corruption Status naming it.
//
// Threading: plain functions; safe from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <caf/atom.hpp>
#include <caf/fwd.hpp>

#include "common/status.h"
#include "kernels/codec.h"
#include "ps/messages.h"
#include "transport/tensor.h"

namespace troupe::ps {

using leave_atom = caf::atom_constant<caf::atom("leave")>;
using staleness_atom = caf::atom_constant<caf::atom("staleness")>;
using queues_atom = caf::atom_constant<caf::atom("queues")>;
using clock_atom = caf::atom_constant<caf::atom("clock")>;
using snapshot_atom = caf::atom_constant<caf::atom("snapshot")>;
using written_atom = caf::atom_constant<caf::atom("written")>;
using restore_atom = caf::atom_constant<caf::atom("restore")>;
using revert_atom = caf::atom_constant<caf::atom("revert")>;
using replicate_atom = caf::atom_constant<caf::atom("replicate")>;
using install_atom = caf::atom_constant<caf::atom("install")>;
using promote_atom = caf::atom_constant<caf::atom("promote")>;
using detach_atom = caf::atom_constant<caf::atom("detach")>;
using backup_lost_atom = caf::atom_constant<caf::atom("backuplost")>;
// To a worker's ps client (local): its pulls and pushes carry this
// generation from now on.
using generation_atom = caf::atom_constant<caf::atom("gen")>;
// To a worker's ps client (from the coordinator, or its answer to
// routes_atom): (route_atom, vector<i64> node of every shard's primary).
using route_atom = caf::atom_constant<caf::atom("route")>;
// To the coordinator: (routes_atom) -> vector<i64> the node of every
// shard's primary.
using routes_atom = caf::atom_constant<caf::atom("routes")>;

// The name a ps process publishes each copy of a shard it holds under
// (ps.replicas = 2: copies of shard k live in ps processes k and k+1).
inline std::string shardCopyName(int64_t shard) { return "shard-copy-" + std::to_string(shard); }

// More tables than this in one message is refused.
inline constexpr size_t kMaxWireTables = 4096;

// A pull as received; the pointers live as long as the message.
struct PullView {
  int64_t worker = 0;
  int64_t step = 0;
  bool create = true;
  bool dense = false;
  const uint64_t* counts = nullptr;  // [tables]
  const uint64_t* keys = nullptr;    // [keyCount]
  size_t keyCount = 0;
  size_t rowFloats = 0;              // sum_t counts[t] x dims[t]
  int64_t generation = 0;
};

struct PushView {
  int64_t worker = 0;
  int64_t sequence = 0;
  int64_t step = 0;
  int64_t samples = 0;
  const uint64_t* counts = nullptr;
  const uint64_t* keys = nullptr;
  size_t keyCount = 0;
  const float* grads = nullptr;  // [sum_t counts[t] x dims[t]]
  size_t gradFloats = 0;
  const float* denseGrads = nullptr;  // [denseFloats], 0 or the shard's slice
  size_t denseFloats = 0;
  int64_t generation = 0;
  // The dense learning rate's scale for this push (train.lr_decay per
  // epoch, in (0, 1]): the shards that hold the dense optimizer apply it.
  double lrScale = 1;
};

struct PullReplyView {
  const float* rows = nullptr;
  size_t rowFloats = 0;
  const float* dense = nullptr;
  size_t denseFloats = 0;
};

// `dims`: floats per row of each table the receiver holds; `denseSlice`: the
// floats of its dense slice (a dense part must be empty or exactly that).
Expected<PullView> pullFromWire(const caf::message& msg, const std::vector<int64_t>& dims);
Expected<PushView> pushFromWire(const caf::message& msg, const std::vector<int64_t>& dims, size_t denseSlice);
// `rowFloats` and `denseFloats`: what the pull asked for.
Expected<PullReplyView> pullReplyFromWire(const caf::message& msg, size_t rowFloats, size_t denseFloats);

caf::message pullToWire(int64_t worker, int64_t step, bool create, bool dense, transport::Tensor counts,
                        transport::Tensor keys, int64_t generation = 0);
caf::message pushToWire(int64_t worker, int64_t sequence, int64_t step, int64_t samples, transport::Tensor counts,
                        transport::Tensor keys, transport::Tensor grads, transport::Tensor denseGrads, int64_t generation = 0,
                        double lrScale = 1.0);
caf::message pullReplyToWire(transport::Tensor rows, transport::Tensor dense);

// Compression (compression.push, compression.pull; DESIGN.md, Compression):
// a push's gradients (rows, dense) and a training pull's reply (rows,
// dense) may travel encoded (kernels/codec.h) in a tensor of dtype kBytes
// where a float32 one would be, each part encoded on its own. The receiver
// decodes with the job's codec for that path and trusts nothing: an
// encoded part with no codec configured, or one that does not decode to
// the floats expected, is a corruption Status naming it.
//
// The same push with float32 gradients (the message itself when nothing in
// it is encoded). `codec` null: an encoded push is refused.
Expected<caf::message> decodePush(const caf::message& msg, const std::vector<int64_t>& dims, size_t denseSlice,
                                  const kernels::Codec* codec);
// A part of `floats` values for the wire: float32 as it is, or encoded by
// `codec` (null: float32) with `residual` (null or `floats` long).
Expected<transport::Tensor> encodePart(std::vector<float> values, const kernels::Codec* codec, float* residual,
                                       uint64_t step);
// The same from `floats` values at `values` (float32: a copy).
Expected<transport::Tensor> encodePart(const float* values, size_t floats, const kernels::Codec* codec, float* residual,
                                       uint64_t step);
// A received part that must hold exactly `floats` values: float32, or
// encoded and decoded here by `codec`.
Expected<transport::Tensor> decodePart(const transport::Tensor& part, size_t floats, const kernels::Codec* codec,
                                       const char* what);

// A shard's counters (stats reply).
struct ShardStats {
  int64_t rows = 0;            // embedding rows held, all tables
  int64_t pushesApplied = 0;   // distinct pushes applied
  int64_t duplicatePushes = 0; // pushes seen again and only acknowledged
  int64_t pullsServed = 0;
  int64_t pullsDelayed = 0;    // pulls that waited for the consistency clock
  int64_t maxLead = 0;         // largest (pull step - slowest live worker's clock) served
  int64_t samplesApplied = 0;  // rows of the batches of the pushes applied (the ledger)
  // Staleness: for every push applied, the updates (optimizer steps of this
  // shard) applied between the serving of the worker's training pull of
  // that step, whose weights its gradient was computed on, and the push's
  // own: staleness[k] pushes missed k updates (the last entry: k or more).
  // BSP applies a step's pushes as one update: 0 for all. Every apply this
  // copy made counts, also of a step undone later (a rollback's redone
  // steps count again); a push this copy applied as a backup, or whose pull
  // it did not serve (the primary's, before a promotion), is counted in
  // stalenessUnknown.
  std::vector<int64_t> staleness;
  int64_t stalenessUnknown = 0;
};
// The last staleness bucket: this many updates or more.
inline constexpr int64_t kStalenessBuckets = 1024;

}  // namespace troupe::ps
