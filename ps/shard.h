// A parameter-server shard (DESIGN.md, Parameter server): an actor owning
// hash(key) mod S of every embedding table and one contiguous slice of the
// dense parameters, applying server-side optimizers, and answering the shard
// protocol of ps/wire.h (pull, push, leave, stats) under the job's
// consistency model:
//
//  - asp: pulls are served at once; pushes applied as they arrive.
//  - ssp(s): a training pull for step t waits until every live worker's
//    clock (steps whose pushes this shard applied) is >= t - s.
//  - bsp: as ssp(0), and the pushes of one step from every live worker are
//    averaged and applied as one update, so a step equals one step of a
//    single process on the concatenated global batch.
//
// Checkpoints (wire.h, snapshot_atom): the shard copies its state in memory
// (the caller pauses the workers first, so the copy is a consistent cut),
// answers, and writes the copy to its file beside training; the written
// message follows. A shard restored from an image goes on from that cut.
//
// Evaluation pulls (create == false) never wait, and a training pull waits
// at most ShardOptions::parkTimeout (then it fails, naming the workers it
// waited for). A push is acknowledged (its sequence number) only once
// applied; a push whose (worker, sequence) was applied or is pending
// already is acknowledged without being applied again, whatever order
// pushes arrive in (AppliedWindow). A worker that leaves (done, or lost:
// the coordinator says so) no longer holds anyone back; its replacement asks
// where to resume (clock_atom). Malformed messages are answered with an
// error naming what is wrong and change nothing.
//
// Runs detached (its own thread); optimizers run on the given kernels.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include "common/status.h"
#include "kernels/codec.h"
#include "kernels/row_optimizer.h"
#include "ps/embedding_table.h"
#include "ps/shard_image.h"
#include "transport/buffer_pool.h"

namespace troupe::ps {

enum class Consistency { kBsp, kSsp, kAsp };

// "bsp", "ssp", "asp"; anything else is an error naming the text.
Expected<Consistency> parseConsistency(const std::string& text);
const char* consistencyName(Consistency c);

// The shard owning `key` among `shards`.
int shardOfKey(uint64_t key, int shards);
// The dense slice [begin, end) of `shard` among `shards`, of `total` floats.
std::pair<int64_t, int64_t> denseSlice(int64_t total, int shard, int shards);

struct ShardOptions {
  int shard = 0;
  int shards = 1;
  int workers = 1;  // worker ids are 0 .. workers-1
  std::vector<EmbeddingTableOptions> tables;
  // This shard's slice of the dense parameters: initial weights (empty: none)
  // and the optimizer that updates them.
  std::vector<float> denseInit;
  kernels::OptimizerConfig denseOptimizer;
  Consistency consistency = Consistency::kAsp;
  int64_t staleness = 0;  // ssp
  // A training pull parked this long for the clock fails (0: never).
  std::chrono::milliseconds parkTimeout{0};
  // Start from a checkpoint's image of this shard (checked with
  // checkShardImage) instead of fresh tables.
  std::shared_ptr<const ShardImage> restore;
  // Rollbacks of the job so far (cluster.generation): pulls and pushes of
  // another generation are refused.
  int64_t generation = 0;
  // The workers train as one group (allreduce / hybrid): after a restore
  // from a checkpoint every worker trains again (a group that shrank before
  // the cut resumes with all of them), so the shard waits for every one.
  bool groupTrains = false;
  // BSP: keep each step's rows with their optimizer state and the whole
  // dense state (not only the weights a redone pull needs), so that
  // revert_atom can undo the step (hybrid with supervision.on_worker_loss
  // = shrink). It costs a copy of the step's rows per step.
  bool undoWholeSteps = false;
  int threads = 1;
  std::shared_ptr<kernels::Kernels> kernels;  // null: its own, with `threads`
  // Compression (wire.h): pushes whose gradients come encoded are decoded
  // with `pushCodec` (kind none: refused); training pulls of steps from
  // `warmupSteps` on are answered encoded with `pullCodec` (a cast, or
  // none: float32).
  kernels::CodecOptions pushCodec, pullCodec;
  int64_t warmupSteps = 0;
  // Replication (ps.replicas = 2; wire.h, replicate ... detach): how this
  // copy starts. kAwaitBackup: a primary that serves nothing until it has
  // its backup (replicate); kAwaitImage: a new backup that takes nothing
  // until its primary sent the state (install). Messages meanwhile wait in
  // the mailbox.
  enum class Start { kServe, kAwaitBackup, kAwaitImage } start = Start::kServe;
  // This copy starts as a backup (promote makes it the primary). A backup
  // takes a primary's state (install) whenever it is sent again.
  bool backup = false;
  // The actor published as `name` on node `node` (a proxy through
  // transport::RemoteActors): how a primary reaches its backup.
  std::function<caf::actor(uint64_t node, const std::string& name)> locate;
  // Told (backup_lost) when the backup stops answering; may be null.
  caf::actor coordinator;
  // A forwarded message (or the state's transfer) unanswered this long
  // drops the backup.
  std::chrono::milliseconds backupTimeout{60000};
  // Staleness-aware updates of ASP and SSP pushes (BSP's miss nothing), off
  // by default; a push whose pull this shard did not serve (unknown
  // staleness) is applied as it is. staleLr (ps.stale_lr = inverse): the
  // learning rate of the push's update divided by its staleness + 1 (Zhang
  // et al.). delayCompensation (ps.delay_compensation = lambda > 0,
  // DC-ASGD): each gradient g becomes g + lambda * g * g * (w_now -
  // w_stale), w_stale the weights its pull was served; the shard keeps a
  // copy of every training pull's rows and dense slice until its push
  // comes (a batch's unique rows per worker and step in flight).
  bool staleLr = false;
  float delayCompensation = 0.0f;
};

// Whether a checkpoint's image fits a shard of these options (index, shard
// and worker counts, consistency, every table's id, dim and optimizer, the
// dense slice); the error names what differs.
Status checkShardImage(const ShardImage& image, const ShardOptions& options);

// Throws SetupError on bad tables or an image that does not fit.
caf::actor spawnShard(caf::actor_system& system, const ShardOptions& options);

// The buffers every shard of this process writes its pull replies into,
// straight from its tables (the rows' one copy before the wire): reused,
// never zeroed; at most 512 MiB of released ones are kept, for the life of
// the process (also after its shards have stopped).
const std::shared_ptr<transport::BufferPool>& replyBuffers();

}  // namespace troupe::ps
