// The parameter-server client of one worker: an actor that speaks the table
// holder's messages (ps/messages.h) to the worker and the shard protocol
// (ps/wire.h) to the S shards, so the worker actor runs unchanged whether
// its tables live in its own process or on shards elsewhere.
//
//   (pull_atom, PullRequestPtr) -> PullReplyPtr     the keys split by
//        shardOfKey and pulled from every shard in parallel (each shard also
//        sends its dense slice when the pull asks for dense parameters)
//   (push_atom, PushRequestPtr) -> int64_t sequence once every shard has
//        applied its part (every shard gets a push each step, empty or not,
//        so their consistency clocks advance)
//   (leave_atom) -> unit once every shard knows this worker trains no more
//   (generation_atom, i64 g) -> g: its pulls and pushes carry generation g
//        from now on (the shards moved on: a rollback, or a hybrid group
//        that went on without a lost rank)
//
//   (residuals_atom) -> ResidualImagePtr: a copy of the residuals of its
//        compressed pushes (pushDense and pushRows filled), for a
//        checkpoint's cut (asked between steps, every push acknowledged)
//
//   (route_atom, vector<i64> nodes): ps.replicas = 2: the node of every
//        shard's primary (from the coordinator, when it promoted a backup);
//        a shard whose primary moved is reached there from now on, and
//        every request still waiting on it is sent there again (a push is
//        applied once: the shard's (worker, sequence) window)
//
// The first error from a shard (or a timeout) fails the request with it;
// with replicas, a shard that went down (or did not answer) is waited for
// until the coordinator names its new primary (asked every half second),
// at most PsClientOptions::rerouteTimeout.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/atom.hpp>
#include <caf/fwd.hpp>

#include "kernels/codec.h"
#include "workers/residual_image.h"

namespace troupe::workers {

using residuals_atom = caf::atom_constant<caf::atom("residuals")>;

// What a worker's compressed paths handed the transport, as tensor bytes:
// encoded, and what the same tensors take in float32 (so encoded / raw is
// the path's ratio). Pushes: counts, keys and gradients; pulls: the
// replies' rows and dense weights. Read from any thread.
struct PsPathBytes {
  std::atomic<uint64_t> pushEncoded{0}, pushRaw{0}, pushes{0}, pushesCompressed{0};
  std::atomic<uint64_t> pullEncoded{0}, pullRaw{0}, pulls{0}, pullsCompressed{0};
};

struct PsClientOptions {
  int64_t worker = 0;
  std::vector<caf::actor> shards;  // by shard index
  std::vector<int64_t> dims;       // floats per row of each table
  int64_t denseSize = 0;           // dense parameters of the model (all shards)
  std::chrono::seconds requestTimeout{600};
  int64_t generation = 0;  // cluster.generation: the job's rollbacks when this worker started
  // ps.replicas = 2: the node of every shard's primary (shards[k] is the
  // copy published as ps::shardCopyName(k) there), how to reach a copy on
  // a node, and whom to ask where the primaries are.
  bool replicated = false;
  std::vector<uint64_t> nodes;
  std::function<caf::actor(uint64_t node, const std::string& name)> locate;
  caf::actor coordinator;
  std::chrono::seconds rerouteTimeout{30};
  // Compression (ps/wire.h): pushes of steps from warmupSteps on go
  // encoded with pushCodec, with error feedback (a residual per shard for
  // the dense slice, and per key for embedding rows: the worker keeps a row
  // of residual for every key it pushed); encoded pull replies are decoded
  // with pullCodec.
  kernels::CodecOptions pushCodec, pullCodec;
  int64_t warmupSteps = 0;
  // At most this many residual rows (all tables; 0: no bound). A push that
  // needs one more drops them all first: a bounded loss, logged.
  int64_t maxResidualRows = 0;
  std::shared_ptr<PsPathBytes> bytes;  // counted here when set
  // A job resumed from a checkpoint: the residuals of this worker's
  // compressed pushes at the cut (checked already: checkResidualImage).
  std::shared_ptr<const ResidualImage> resumedResiduals;
};

caf::actor spawnPsClient(caf::actor_system& system, const PsClientOptions& options);

}  // namespace troupe::workers
