// What a worker's codecs held back at a checkpoint's cut (compression with
// error feedback, kernels/codec.h): the residuals of its pushes (by shard,
// the dense slice's; by table, a row per embedding key pushed) and of its
// all-reduce (by tensor: the rank's, and the owner's of its segment). They
// are the worker's state as much as its step: a resumed job that dropped
// them would send less than the uninterrupted one. Each paused worker
// writes its own file, residuals-<rank>.ckpt, beside the shards' and the
// model's (workers/checkpoint.h), with common/checksum_file.h; on resume
// the rank reads its file back, refused, naming the file and what is wrong,
// when it is truncated, corrupt or not of this job.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <caf/allowed_unsafe_message_type.hpp>

#include "collectives/compressed_allreduce.h"
#include "common/status.h"

namespace troupe::workers {

inline constexpr const char* kResidualImageMagic = "TRPRESI1";

// The residual rows of one table: keys.size() rows of the table's dim.
struct PushResidualRows {
  std::vector<uint64_t> keys;
  std::vector<float> values;
};

struct ResidualImage {
  int64_t worker = 0;
  int64_t step = 0;  // the steps the worker had taken at the cut
  // The codecs that made them (kernels::CodecKind): residuals mean
  // something only to the codec that keeps them.
  uint8_t pushCodec = 0, allreduceCodec = 0;
  std::vector<std::vector<float>> pushDense;  // by shard: empty, or the shard's dense slice
  std::vector<PushResidualRows> pushRows;     // by table (none without compressed pushes)
  std::vector<collectives::TensorResiduals> allreduce;
};
using ResidualImagePtr = std::shared_ptr<ResidualImage>;

// The file of worker `rank` in a checkpoint directory.
std::string residualFileName(int64_t rank);

Status writeResidualImage(const ResidualImage& image, const std::string& path, uint64_t* checksum = nullptr,
                          uint64_t* bytes = nullptr);
Expected<ResidualImage> readResidualImage(const std::string& path);

// Whether it fits worker `rank` resuming at `step` in a job of these
// tables (their dims), shards (their dense slices' lengths); the first
// difference, named with the file.
Status checkResidualImage(const ResidualImage& image, const std::string& path, int64_t rank, int64_t step,
                          const std::vector<int64_t>& dims, const std::vector<int64_t>& denseSlices);

}  // namespace troupe::workers

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::workers::ResidualImagePtr)
