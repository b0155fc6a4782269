// The table holder: an actor owning every embedding table of a model in one
// process, serving pulls and applying pushes in arrival order. It is the
// in-process precursor of a parameter-server shard and speaks the same
// messages (ps/messages.h):
//
//   (pull_atom, PullRequestPtr)  -> PullReplyPtr
//   (push_atom, PushRequestPtr)  -> int64_t sequence   (after the update is applied)
//   (stats_atom)                 -> int64_t rows held over all tables
//   (leave_atom)                 -> int64_t 0 (a worker is done; nothing to release)
//   (image_atom)                 -> TableImagesPtr: a copy of every table
//   (load_atom, TableImagesPtr, int64_t worker, int64_t floor)
//                                -> int64_t rows: the tables become the
//                                   images (all of them or, on an error
//                                   naming what differs, none), and the
//                                   worker's pushes below `floor` count as
//                                   applied (a rank of an all-reduce group
//                                   that copied another's replica)
//
// A push whose (worker, sequence) was already applied is acknowledged again
// without being applied twice. A malformed request (wrong table count, sizes
// that do not match) is answered with an error and changes nothing.
//
// Runs detached (its own thread); the optimizer runs on the given kernels.
#pragma once

#include <memory>
#include <vector>

#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/atom.hpp>
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

using TableImagesPtr = std::shared_ptr<const std::vector<TableImage>>;
using image_atom = caf::atom_constant<caf::atom("image")>;
using load_atom = caf::atom_constant<caf::atom("load")>;

caf::actor spawnTableHolder(caf::actor_system& system, const TableHolderOptions& options);

}  // namespace troupe::ps

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::ps::TableImagesPtr)
