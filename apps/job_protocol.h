// The vocabulary of a multi-process job between the coordinator and its
// processes (apps/job.h). Atom texts at most 10 characters.
#pragma once

#include <caf/atom.hpp>

namespace troupe::apps {

inline constexpr const char* kCoordinatorActor = "coordinator";
inline constexpr const char* kProcessActor = "process";
inline constexpr const char* kShardActor = "shard";

// (hello_atom, string role, i64 requested rank, u64 node, string address) -> (i64 rank, string config TOML)
using hello_atom = caf::atom_constant<caf::atom("hello")>;
// (ready_atom, string role, i64 rank) -> Tensor u64[S] shard node ids, when all are ready
using ready_atom = caf::atom_constant<caf::atom("ready")>;
// Workers of a sync mode whose collectives.backend is not "ring", after ready:
// (commid_atom, i64 rank, i64 CUDA devices, string why this rank cannot use NCCL or "",
//  Tensor bytes NCCL unique id (rank 0))
//   -> (string backend "nccl" or "ring", Tensor bytes rank 0's id, i64 this rank's device), when every
//      worker asked
using commid_atom = caf::atom_constant<caf::atom("commid")>;
// (progress_atom, i64 rank, i64 epoch, i64 step, i64 epoch rows, i64 rows per epoch, f64 loss, f64 samples/s)
using progress_atom = caf::atom_constant<caf::atom("progress")>;
// (done_atom, i64 rank, bool ok, string error, i64 steps, i64 samples, i64 pushes acked, i64 pulled rows,
//  f64 train s, f64 eval s, bool evaluated, f64 auc, f64 loss, f64 accuracy, i64 rows,
//  Tensor f32 labels, Tensor f32 predictions) -> i64 rank
using done_atom = caf::atom_constant<caf::atom("done")>;
// to "process": (shutdown_atom) -> the process exits
using shutdown_atom = caf::atom_constant<caf::atom("shutdown")>;
// local: (abort_atom, string why); (run_atom) -> JobOutcomePtr; start deadline
using abort_atom = caf::atom_constant<caf::atom("abort")>;
using deadline_atom = caf::atom_constant<caf::atom("deadline")>;

}  // namespace troupe::apps
