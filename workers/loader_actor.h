// The loader: an actor that reads and parses batches ahead of the worker.
//
//   (epoch_atom, int64_t e) -> int64_t   starts epoch e, answers rows per epoch
//   (next_atom)             -> BatchPtr  the next batch; nullptr at the epoch's end
//   (share_atom, epoch, fromBatch, part, parts) -> int64_t 0
//                           another division of the data (BatchSource::reshare);
//                           batches read ahead are dropped, and the next
//                           epoch_atom starts over
//
// After answering `next` it reads up to `prefetch` batches ahead, so parsing
// overlaps the worker's compute. Read errors are answered as errors naming
// file and line. Runs detached: its reads block its own thread only.
#pragma once

#include <memory>

#include <caf/fwd.hpp>

#include "workers/batch_source.h"

namespace troupe::workers {

caf::actor spawnLoader(caf::actor_system& system, std::shared_ptr<BatchSource> source, int prefetch);

}  // namespace troupe::workers
