// Communicator: the collectives of synchronous data parallelism (DESIGN.md,
// Training modes). Every rank of a group calls the same collectives in the
// same order; each call returns when this rank's part is done.
//
// Guarantees, for every backend:
//  - allReduce leaves bit-identical results on every rank, and the same
//    bits for the same inputs from one run to the next (a fixed reduction
//    order per element, no dependence on timing).
//  - A rank that fails, is killed or leaves during a collective makes the
//    collective fail on every other rank with an error naming it, within
//    the transport's heartbeat timeout; it never hangs. After a failure the
//    communicator stays failed: every later call returns the same error.
//  - Buffers belong to the caller again when the call returns.
//
// Element types: float32, bfloat16 and float16 (reduced in float32, rounded
// back to nearest even once per addition); broadcast and the gathers move
// bytes.
//
// Threading: one caller at a time (a training step's communication thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "transport/frame.h"

namespace troupe::collectives {

using transport::DType;

enum class ReduceOp { kSum, kAverage };

// Bytes of one element of an all-reduce type; 0 for a type it does not take.
size_t reduceElementBytes(DType dtype);

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* backend() const = 0;

  // In place: `count` elements of `dtype` at `data` become their sum (or
  // mean) over every rank.
  virtual Status allReduce(void* data, size_t count, DType dtype, ReduceOp op) = 0;
  // `bytes` at `data` on every rank become root's.
  virtual Status broadcast(void* data, size_t bytes, int root) = 0;
  // Every rank gives `bytes` at `in`; `out` (size() x bytes) gets rank r's
  // at r x bytes, on every rank.
  virtual Status allGather(const void* in, void* out, size_t bytes) = 0;
  // Like allGather with a size of each rank's own; the blocks in rank order.
  virtual Expected<std::vector<std::vector<std::byte>>> allGatherV(const void* in, size_t bytes) = 0;
  // Returns once every rank has called it.
  virtual Status barrier() = 0;
  // Every rank gives n blocks of `bytes` at `in` (block j for rank j);
  // `out` (n x bytes, not overlapping `in`) gets rank r's block for this
  // rank at r x bytes. A backend without it says so.
  virtual Status allToAll(const void* in, void* out, size_t bytes) {
    (void)in, (void)out, (void)bytes;
    return Status::invalidArgument(fmt::format("the {} backend has no all-to-all", backend()));
  }
  // Fails the group with `why` from this rank (a failure of its own
  // between collectives): every later call fails, and the other ranks are
  // told, so that none waits for this one. Returns the group's failure
  // (`why`, or an earlier one that already ended it).
  virtual Status abort(Status why) { return why; }
  // The tensor bytes this rank sends in allReduce of `count` elements of
  // `dtype` (the algorithm's share: 2 (n - 1) / n of the buffer for a ring).
  virtual double allReduceBytesSent(size_t count, DType dtype) const {
    const int n = size();
    return n <= 1 ? 0.0 : 2.0 * double(n - 1) / double(n) * double(count) * double(reduceElementBytes(dtype));
  }
  // The label the transport counts this communicator's bytes under from
  // now on (transport/remote_actors.h, traffic): "collective" at first.
  virtual void setTrafficLabel(const std::string& label) { (void)label; }
};

const char* reduceOpName(ReduceOp op);

}  // namespace troupe::collectives
