// The NCCL backend of collectives/communicator.h, for groups whose ranks each
// have a CUDA device. Built when the configure step finds CUDA and NCCL
// (TROUPE_HAVE_NCCL); without them every function here still exists and
// fails with a clear reason, so callers need no #if.
//
// Buffers: a device (or managed) pointer is reduced in place; a host pointer
// is staged through a device buffer of this communicator (copy in, NCCL,
// copy out on the communicator's stream), so CPU models can use NCCL's
// links too. Every call returns when the result is in the caller's buffer.
// The communicator works on a stream of its own: a device buffer must be
// complete when the call is made (synchronize the stream that wrote it).
// allGather's `in` and `out` may overlap only as in place (in == out +
// rank x bytes).
//
// Devices: the job gives the workers of a host its devices in rank order
// (apps/job.cc), so every worker must see all of them; a launcher that
// hides all but one per process (CUDA_VISIBLE_DEVICES) is not supported
// yet.
//
// Set-up: rank 0 makes an id (makeNcclId()), the job hands it to every
// rank (through the coordinator, apps/job.cc), and every rank calls
// createNcclCommunicator with it. NCCL's bootstrap sockets use the
// interfaces in NCCL_SOCKET_IFNAME (the job sets "lo" when its transport is
// on loopback).
//
// Failure: the communicator is non-blocking (ncclConfig_t::blocking = 0);
// while a call waits it polls NCCL's asynchronous error, the `health`
// callback (a peer the transport saw go down) and the timeout, and on any of
// them aborts the NCCL communicator (ncclCommAbort) and fails this and
// every later call with the reason. It never hangs on a dead peer.
//
// Determinism: NCCL's all-reduce reduces each element on one rank and
// broadcasts the result, so every rank holds the same bits; the same
// inputs, group size and topology give the same bits from run to run.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "collectives/communicator.h"

namespace troupe::collectives {

// Bytes of an NCCL unique id (ncclUniqueId).
inline constexpr size_t kNcclIdBytes = 128;

struct NcclOptions {
  int rank = 0;
  int size = 1;
  std::string id;   // kNcclIdBytes from rank 0's makeNcclId()
  int device = -1;  // CUDA device; -1: rank modulo the devices present
  std::chrono::milliseconds timeout{600000};        // one collective, as a last resort
  std::chrono::milliseconds connectTimeout{60000};  // ncclCommInitRankConfig
  // Polled while a call waits; a non-OK status (a peer that went down) aborts
  // the communicator and fails the call with it. May be empty.
  std::function<Status()> health;
};

// Whether this build has the NCCL backend.
bool ncclBuilt();
// Why this process cannot use NCCL, or "" when it can: not built with NCCL,
// or no CUDA device (or driver) here.
std::string ncclUnavailableReason();
// CUDA devices this process can use for NCCL (0 when ncclUnavailableReason
// is not empty).
int ncclDevices();
// A fresh unique id for a new group (rank 0 calls it).
Expected<std::string> makeNcclId();
// Joins the group; every rank calls it with the same id and size. Fails,
// naming the cause, when NCCL is unavailable (ncclUnavailableReason), the
// options are bad, or the group does not form within connectTimeout.
Expected<std::unique_ptr<Communicator>> createNcclCommunicator(NcclOptions options);

}  // namespace troupe::collectives
