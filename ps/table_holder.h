// The table holder: an actor owning every embedding table of a model in one
// process, serving pulls and applying pushes in arrival order. It is the
// in-process precursor of a parameter-server shard and speaks the same
// messages (ps/messages.h):
//
//   (pull_atom, PullRequestPtr)  -> PullReplyPtr
//   (push_atom, PushRequestPtr)  -> int64_t sequence   (after the update is applied)
//   (stats_atom)                 -> int64_t rows held over all tables
//   (leave_atom)                 -> int64_t 0 (a worker is done; nothing to release)
//
// A push whose (worker, sequence) was already applied is acknowledged again
// without being applied twice. A malformed request (wrong table count, sizes
// that do not match) is answered with an error and changes nothing.
//
// Runs detached (its own thread); the optimizer runs on the given kernels.
#pragma once

#include <memory>
#include <vector>

#include <caf/fwd.hpp>

#include "ps/embedding_table.h"

namespace troupe::ps {

struct TableHolderOptions {
  std::vector<EmbeddingTableOptions> tables;
  int threads = 1;
  // Kernels to share with other actors of the process (one compute pool per
  // process keeps the thread budget); when null the holder makes its own
  // with `threads` threads.
  std::shared_ptr<kernels::Kernels> kernels;
};

caf::actor spawnTableHolder(caf::actor_system& system, const TableHolderOptions& options);

}  // namespace troupe::ps
