#include "collectives/compressed_allreduce.h"

#include <algorithm>
#include <cstring>

#include "common/check.h"
#include "common/hash.h"

namespace troupe::collectives {
namespace {

using kernels::CodecKind;
using kernels::kCodecHeaderBytes;


int64_t segBegin(int64_t count, int seg, int n) { return count * seg / n; }

}  // namespace

CompressedAllReduce::CompressedAllReduce(const kernels::CodecOptions& codec, int64_t warmupSteps)
    : options_(codec), warmupSteps_(warmupSteps), codec_(kernels::makeCodec(codec)) {
  if (warmupSteps < 0) TROUPE_SETUP_ERROR("compression.warmup_steps must not be negative, got {}", warmupSteps);
}

Status CompressedAllReduce::supports(const std::string& backend, CodecKind kind) {
  if (backend == "ring" || kind == CodecKind::kNone) return Status::ok();
  if (backend == "nccl" && (kind == CodecKind::kFp16 || kind == CodecKind::kBf16)) return Status::ok();
  return Status::invalidArgument(fmt::format(
      "compression.allreduce = {} needs collectives.backend = ring (the {} backend takes none, fp16 and bf16)",
      kernels::codecName(kind), backend));
}

std::vector<float> CompressedAllReduce::residuals(int key) const {
  auto it = tensors_.find(key);
  return it == tensors_.end() ? std::vector<float>{} : it->second.residual;
}

std::vector<float> CompressedAllReduce::ownerResiduals(int key) const {
  auto it = tensors_.find(key);
  return it == tensors_.end() ? std::vector<float>{} : it->second.owned;
}

std::vector<TensorResiduals> CompressedAllReduce::saveResiduals() const {
  std::vector<TensorResiduals> out;
  for (const auto& [key, t] : tensors_) {
    if (t.count < 0) continue;
    out.push_back(TensorResiduals{int32_t(key), t.count, int32_t(t.size), int32_t(t.rank), t.residual, t.owned});
  }
  return out;
}

Status CompressedAllReduce::restoreResiduals(const std::vector<TensorResiduals>& saved) {
  std::map<int, Tensor> tensors;
  for (const TensorResiduals& r : saved) {
    // (the count checked against what was read before it is multiplied)
    const bool shaped = r.count >= 0 && int64_t(r.residual.size()) == r.count && r.size >= 1 && r.rank >= 0 &&
                        r.rank < r.size;
    const int64_t segment = shaped ? segBegin(r.count, r.rank + 1, r.size) - segBegin(r.count, r.rank, r.size) : -1;
    if (!shaped || int64_t(r.owned.size()) != segment || tensors.count(r.key)) {
      return Status::corruption(fmt::format("all-reduce residuals of tensor {}: {} and {} floats for {} values as rank {} "
                                            "of {} (or the tensor twice)",
                                            r.key, r.residual.size(), r.owned.size(), r.count, r.rank, r.size));
    }
    tensors[r.key] = Tensor{r.count, r.size, r.rank, r.residual, r.owned};
  }
  tensors_ = std::move(tensors);
  return Status::ok();
}

CompressedAllReduce::Tensor& CompressedAllReduce::stateOf(int key, int64_t count, int size, int rank) {
  Tensor& t = tensors_[key];
  if (t.count != count || t.size != size || t.rank != rank) {
    t.count = count;
    t.size = size;
    t.rank = rank;
    t.residual.assign(size_t(count), 0.0f);
    t.owned.assign(size_t(segBegin(count, rank + 1, size) - segBegin(count, rank, size)), 0.0f);
  }
  return t;
}

CompressionStats CompressedAllReduce::stats() const {
  std::lock_guard<std::mutex> lock(statsMutex_);
  return stats_;
}

void CompressedAllReduce::tally(bool compressed, double encoded, double raw) {
  std::lock_guard<std::mutex> lock(statsMutex_);
  ++stats_.reductions;
  if (compressed) ++stats_.compressed;
  stats_.encodedBytes += encoded;
  stats_.rawBytes += raw;
}

Status CompressedAllReduce::reduce(Communicator& comm, int key, float* data, int64_t count, int64_t step) {
  const int n = comm.size();
  if (options_.kind == CodecKind::kNone || step < warmupSteps_ || count == 0 || n == 1) {
    const double raw = comm.allReduceBytesSent(size_t(count), DType::kFloat32);
    tally(false, raw, raw);
    return comm.allReduce(data, size_t(count), DType::kFloat32, ReduceOp::kAverage);
  }
  Tensor& t = stateOf(key, count, n, comm.rank());
  // The same on every rank: random-k's indices.
  const uint64_t seed = hashCombine(uint64_t(step), uint64_t(key));
  Status s = Status::internal("compressed all-reduce: no codec");
  switch (options_.kind) {
    case CodecKind::kFp16:
    case CodecKind::kBf16: s = reduceCast(comm, t, data, count, seed); break;
    case CodecKind::kInt8:
    case CodecKind::kOneBit: s = reduceScattered(comm, t, data, count, seed); break;
    case CodecKind::kTopK: s = reduceTopK(comm, t, data, count, seed); break;
    case CodecKind::kRandomK: s = reduceRandomK(comm, t, data, count, seed); break;
    case CodecKind::kNone: break;
  }
  // A failure of this rank's own (a peer's block that does not decode, a
  // value that does not encode) between collectives: the others are told,
  // or they would wait for its next one until their timeout.
  if (!s.isOk()) return comm.abort(s);
  return s;
}

Status CompressedAllReduce::reduceCast(Communicator& comm, Tensor& t, float* data, int64_t count, uint64_t seed) {
  // Each rank's share of the mean is encoded and the shares summed: the
  // ring's partial sums then stay within the mean's range (summing first
  // and scaling at the end can overflow fp16's 65504). The residual is in
  // those units too (it starts again when the group's size changes).
  const float inv = 1.0f / float(comm.size());
  for (int64_t i = 0; i < count; ++i) data[i] *= inv;
  Status s = codec_->encode(data, count, t.residual.data(), seed, &a_);
  if (!s.isOk()) return s;
  tally(true, comm.allReduceBytesSent(size_t(count), DType::kFloat16), comm.allReduceBytesSent(size_t(count), DType::kFloat32));
  const DType dtype = options_.kind == CodecKind::kFp16 ? DType::kFloat16 : DType::kBFloat16;
  s = comm.allReduce(a_.data() + kCodecHeaderBytes, size_t(count), dtype, ReduceOp::kSum);
  if (!s.isOk()) return s;
  return codec_->decode(a_.data(), a_.size(), count, data, false);
}

Status CompressedAllReduce::reduceRandomK(Communicator& comm, Tensor& t, float* data, int64_t count, uint64_t seed) {
  Status s = codec_->encode(data, count, t.residual.data(), seed, &a_);
  if (!s.isOk()) return s;
  const size_t k = (a_.size() - kCodecHeaderBytes) / 4;
  tally(true, comm.allReduceBytesSent(k, DType::kFloat32), comm.allReduceBytesSent(size_t(count), DType::kFloat32));
  s = comm.allReduce(a_.data() + kCodecHeaderBytes, k, DType::kFloat32, ReduceOp::kAverage);
  if (!s.isOk()) return s;
  return codec_->decode(a_.data(), a_.size(), count, data, false);
}

Status CompressedAllReduce::reduceTopK(Communicator& comm, Tensor& t, float* data, int64_t count, uint64_t seed) {
  const int n = comm.size();
  Status s = codec_->encode(data, count, t.residual.data(), seed, &a_);
  if (!s.isOk()) return s;
  const size_t block = a_.size();
  if (block != codec_->encodedBytes(count)) {
    return Status::internal(fmt::format("topk: {} bytes encoded, {} expected", block, codec_->encodedBytes(count)));
  }
  tally(true, double(n - 1) * double(block), comm.allReduceBytesSent(size_t(count), DType::kFloat32));
  b_.resize(block * size_t(n));
  s = comm.allGather(a_.data(), b_.data(), block);
  if (!s.isOk()) return s;
  std::fill_n(data, count, 0.0f);
  for (int r = 0; r < n; ++r) {
    s = codec_->decode(b_.data() + size_t(r) * block, block, count, data, true);
    if (!s.isOk()) return Status::corruption(fmt::format("topk all-gather, rank {}'s block: {}", r, s.message()));
  }
  const float inv = 1.0f / float(n);
  for (int64_t i = 0; i < count; ++i) data[i] *= inv;
  return Status::ok();
}

Status CompressedAllReduce::reduceScattered(Communicator& comm, Tensor& t, float* data, int64_t count,
                                            uint64_t seed) {
  const int n = comm.size(), me = comm.rank();
  auto len = [&](int seg) { return segBegin(count, seg + 1, n) - segBegin(count, seg, n); };
  size_t block = 0;  // every segment's encoding fits; the longest sets it
  for (int j = 0; j < n; ++j) block = std::max(block, codec_->encodedBytes(len(j)));
  // Reduce-scatter: segment j of this rank's gradient (plus its residual),
  // encoded, goes to rank j. The rounding differs by rank (independent
  // errors average down), so the rank goes into int8's seed.
  a_.assign(block * size_t(n), std::byte{0});
  std::vector<std::byte> enc;
  for (int j = 0; j < n; ++j) {
    const int64_t at = segBegin(count, j, n);
    Status s = codec_->encode(data + at, len(j), t.residual.data() + at, hashCombine(seed, uint64_t(me), 1), &enc);
    if (!s.isOk()) return s;
    std::memcpy(a_.data() + size_t(j) * block, enc.data(), enc.size());
  }
  b_.resize(block * size_t(n));
  tally(true, 2.0 * double(n - 1) * double(block), comm.allReduceBytesSent(size_t(count), DType::kFloat32));
  Status s = comm.allToAll(a_.data(), b_.data(), block);
  if (!s.isOk()) return s;
  // This rank's segment: the ranks' encodings decoded and summed in rank
  // order, averaged, then encoded again with the owner's residual.
  const int64_t mine = len(me);
  const size_t mineBytes = codec_->encodedBytes(mine);
  sum_.assign(size_t(mine), 0.0f);
  for (int r = 0; r < n; ++r) {
    s = codec_->decode(b_.data() + size_t(r) * block, mineBytes, mine, sum_.data(), true);
    if (!s.isOk()) return Status::corruption(fmt::format("{} reduce-scatter, rank {}'s block: {}", kernels::codecName(options_.kind), r, s.message()));
  }
  const float inv = 1.0f / float(n);
  for (auto& v : sum_) v *= inv;
  s = codec_->encode(sum_.data(), mine, t.owned.data(), hashCombine(seed, uint64_t(me), 2), &enc);
  if (!s.isOk()) return s;
  a_.assign(block, std::byte{0});
  std::memcpy(a_.data(), enc.data(), enc.size());
  c_.resize(block * size_t(n));
  s = comm.allGather(a_.data(), c_.data(), block);
  if (!s.isOk()) return s;
  for (int j = 0; j < n; ++j) {
    s = codec_->decode(c_.data() + size_t(j) * block, codec_->encodedBytes(len(j)), len(j),
                       data + segBegin(count, j, n), false);
    if (!s.isOk()) return Status::corruption(fmt::format("{} all-gather, rank {}'s segment: {}", kernels::codecName(options_.kind), j, s.message()));
  }
  return Status::ok();
}

}  // namespace troupe::collectives
