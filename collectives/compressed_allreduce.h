// CompressedAllReduce: the average of a float gradient over a group, sent
// through a codec (kernels/codec.h; DESIGN.md, Compression), for
// `compression.allreduce`. Each codec goes the way it can be summed:
//
//   fp16, bf16   the casts are reduced in the ring as they are (in float32,
//                rounded back once per addition): Communicator::allReduce
//                of the encoded halves
//   int8, onebit cannot be summed encoded: an all-to-all of every rank's
//                encoded segments (reduce-scatter), the owner of a segment
//                decodes them, sums in float32, averages and encodes the
//                mean again, then an all-gather of the encoded means;
//                two residuals, the rank's (its whole gradient) and the
//                owner's (its segment's mean), as 1-bit Adam keeps
//   topk         an all-gather of every rank's (index, value) pairs, each
//                decoded and added in rank order
//   randomk      the indices come from (seed, step): the same on every rank,
//                so the k values are summed in the ring where they are
//
// Every rank ends with the same bits (decode is deterministic and sums run
// in rank order). Error feedback: the residuals keep what was not sent; a
// tensor (its key) whose length, group size or rank changes starts again
// with zeros. The first `warmupSteps` steps go uncompressed, and so does a
// group of one (nothing crosses). A rank whose decode fails aborts the
// group (Communicator::abort), so that no peer waits for it.
//
// Threading: one caller at a time (a GradientBuckets thread).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <memory>
#include <mutex>
#include <vector>

#include "collectives/communicator.h"
#include "kernels/codec.h"

namespace troupe::collectives {

// What a reduction handed the transport, as tensor bytes this rank sent:
// encoded, and the float32 a plain ring all-reduce of the same tensors
// sends (2 (n - 1) / n of it), so encoded / raw is the path's ratio.
struct CompressionStats {
  int64_t reductions = 0, compressed = 0;
  double encodedBytes = 0, rawBytes = 0;
};

// One tensor's residuals as a checkpoint holds them: for the group of
// `size` ranks it was reduced in, as rank `rank`; `owned` is the owner's
// residual of its segment (used by int8 and onebit; zeros otherwise).
struct TensorResiduals {
  int32_t key = 0;
  int64_t count = 0;
  int32_t size = 0, rank = 0;
  std::vector<float> residual, owned;
};

class CompressedAllReduce final {
 public:
  // Throws SetupError for options makeCodec refuses.
  CompressedAllReduce(const kernels::CodecOptions& codec, int64_t warmupSteps);

  // `count` floats at `data` become their mean over `comm`'s ranks. `key`
  // names the tensor (its residuals); `step` is the training step, the same
  // on every rank (it seeds random-k's indices and int8's rounding).
  Status reduce(Communicator& comm, int key, float* data, int64_t count, int64_t step);

  // Forgets every residual (a step undone, a group formed again: what the
  // aborted encodings held back must not be sent twice). Between steps.
  void reset() { tensors_.clear(); }

  // The rank's residual of `key` (empty before its first compressed
  // reduction).
  std::vector<float> residuals(int key) const;
  // int8, onebit: the owner's residual of this rank's segment of `key`
  // (count x rank / size to count x (rank + 1) / size).
  std::vector<float> ownerResiduals(int key) const;
  // Every tensor's residuals (a checkpoint's cut), and putting them back
  // (a job resumed from it): between steps, like reset. restoreResiduals
  // refuses lengths that do not fit the tensor, naming it; a tensor whose
  // group differs from the one it is next reduced in starts again with
  // zeros (as after reset).
  std::vector<TensorResiduals> saveResiduals() const;
  Status restoreResiduals(const std::vector<TensorResiduals>& saved);
  // A snapshot; safe from any thread.
  CompressionStats stats() const;
  kernels::CodecKind kind() const { return options_.kind; }

  // Whether a backend can carry a codec: the ring every codec, NCCL the
  // casts (and none); anything else refused with a message naming the pair.
  static Status supports(const std::string& backend, kernels::CodecKind kind);

 private:
  struct Tensor {
    int64_t count = -1;
    int size = 0, rank = 0;
    std::vector<float> residual;  // the rank's, count floats
    std::vector<float> owned;     // int8, onebit: the owner's, its segment
  };
  Tensor& stateOf(int key, int64_t count, int size, int rank);
  Status reduceCast(Communicator& comm, Tensor& t, float* data, int64_t count, uint64_t seed);
  Status reduceScattered(Communicator& comm, Tensor& t, float* data, int64_t count, uint64_t seed);
  Status reduceTopK(Communicator& comm, Tensor& t, float* data, int64_t count, uint64_t seed);
  Status reduceRandomK(Communicator& comm, Tensor& t, float* data, int64_t count, uint64_t seed);

  kernels::CodecOptions options_;
  int64_t warmupSteps_;
  std::unique_ptr<kernels::Codec> codec_;
  std::map<int, Tensor> tensors_;
  std::vector<std::byte> a_, b_, c_;  // scratch
  std::vector<float> sum_;
  mutable std::mutex statsMutex_;
  CompressionStats stats_;  // guarded by statsMutex_
  void tally(bool compressed, double encoded, double raw);  // into stats_
};

}  // namespace troupe::collectives
