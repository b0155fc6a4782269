// The worker-side vocabulary: loader and worker actors (ps/messages.h has the
// table messages). Atom texts at most 10 characters.
#pragma once

#include <memory>

#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/atom.hpp>

#include "workers/batch.h"

namespace troupe::workers {

struct TrainReport;
using TrainReportPtr = std::shared_ptr<const TrainReport>;

// loader:  (epoch_atom, int64_t epoch) -> int64_t rows per epoch;  (next_atom) -> BatchPtr (null at the end)
using epoch_atom = caf::atom_constant<caf::atom("epoch")>;
using next_atom = caf::atom_constant<caf::atom("next")>;
//          (share_atom, epoch, fromBatch, part, parts) -> int64_t 0: BatchSource::reshare
using share_atom = caf::atom_constant<caf::atom("share")>;
// worker:  (run_atom) starts training; it answers the run with a TrainReportPtr when done
using run_atom = caf::atom_constant<caf::atom("run")>;

}  // namespace troupe::workers

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::workers::BatchPtr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::workers::TrainReportPtr)
