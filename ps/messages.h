// What workers and table holders / shards say to each other. Payloads travel
// by shared ownership inside a process (the transport issue gives them a wire
// form). Atoms in CAF's snake_case; texts at most 10 characters.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/atom.hpp>

namespace troupe::ps {

// Rows of the given keys, one key list per table (keys may repeat). With
// create == false, keys never seen get their initial weights without being
// inserted (evaluation must not grow the tables).
struct PullRequest {
  std::vector<std::vector<uint64_t>> keys;
  bool create = true;
  int64_t step = 0;    // the worker's step this pull is for (consistency clock)
  bool dense = false;  // also the dense parameters (PS mode keeps them on shards)
};

// rows[t] is [keys[t].size() x dim_t], in request order.
struct PullReply {
  std::vector<std::vector<float>> rows;
  std::vector<float> dense;  // every dense weight, when asked for
};

// Gradients for the rows of the given keys; applied once, in arrival order.
// (worker, sequence) identifies the push; the reply is the sequence number.
struct PushRequest {
  int64_t worker = 0;
  int64_t sequence = 0;
  int64_t step = 1;  // the optimizer's global step
  int64_t samples = 0;  // rows of the batch (the ledger of samples applied)
  std::vector<std::vector<uint64_t>> keys;
  std::vector<std::vector<float>> grads;  // grads[t]: [keys[t].size() x dim_t]
  std::vector<float> denseGrads;          // PS mode: every dense gradient
  int64_t clock = 0;                      // the worker's step (0-based) this push ends
  double lrScale = 1;                     // PS mode: the dense learning rate's scale (train.lr_decay), in (0, 1]
  // No key repeats within a table: the worker made them unique. Trusted by
  // the table holder in the same process only; never on the wire (ps/wire.h),
  // so a shard sums repeated keys whatever a peer sends.
  bool keysUnique = false;
};

using PullRequestPtr = std::shared_ptr<const PullRequest>;
using PullReplyPtr = std::shared_ptr<const PullReply>;
using PushRequestPtr = std::shared_ptr<const PushRequest>;

using pull_atom = caf::atom_constant<caf::atom("pull")>;
using push_atom = caf::atom_constant<caf::atom("push")>;
using stats_atom = caf::atom_constant<caf::atom("stats")>;

}  // namespace troupe::ps

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::ps::PullRequestPtr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::ps::PullReplyPtr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::ps::PushRequestPtr)
