#include "kernels/cuda/cuda_codec.h"

#include <bit>
#include <cstring>
#include <mutex>

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include "common/check.h"
#include "common/hash.h"
#include "kernels/codec_format.h"
#include "kernels/cuda/internal/launchers.h"
#include "kernels/cuda/internal/scratch.cuh"

namespace troupe::kernels::cuda {
namespace {

namespace in = internal;

constexpr unsigned long long kNoIndex = ~0ull;
constexpr uint32_t kExponent = 0x7f800000u;  // all ones: inf or NaN

Status cudaStatus(cudaError_t e, const char* codec, const char* what) {
  if (e == cudaSuccess) return Status::ok();
  cudaGetLastError();  // handled here: not a later call's error (a sticky one stays)
  return Status::internal(fmt::format("{} on the GPU: CUDA {}: {}", codec, what, cudaGetErrorString(e)));
}

// Whatever a call enqueued is complete when it returns, on every path (an
// error part way leaves no kernel reading or writing the caller's memory).
// Declared after the lock and before any Scratch: it runs after the
// scratch's frees are enqueued and before the lock is released.
class SyncOnExit {
 public:
  explicit SyncOnExit(cudaStream_t stream) : stream_(stream) {}
  ~SyncOnExit() {
    if (cudaStreamSynchronize(stream_) != cudaSuccess) cudaGetLastError();
  }
  SyncOnExit(const SyncOnExit&) = delete;
  SyncOnExit& operator=(const SyncOnExit&) = delete;

 private:
  cudaStream_t stream_;
};

#define TROUPE_CODEC_TRY(expr, what)                                         \
  do {                                                                       \
    Status troupe_s_ = cudaStatus((expr), codecName(o_.kind), (what));       \
    if (!troupe_s_.isOk()) return troupe_s_;                                 \
  } while (0)

class CudaCodec final : public Codec {
 public:
  CudaCodec(const CodecOptions& o, int device, cudaStream_t stream, unsigned long long* bad)
      : o_(o), device_(device), stream_(stream), bad_(bad) {}
  ~CudaCodec() override {
    cudaSetDevice(device_);
    cudaFree(bad_);
    cudaStreamDestroy(stream_);
  }

  CodecKind kind() const override { return o_.kind; }
  size_t encodedBytes(int64_t n) const override { return kCodecHeaderBytes + format::payloadBytes(o_, n); }

  Status encode(const float* values, int64_t n, float* residual, uint64_t step,
                std::vector<std::byte>* out) const override {
    const char* name = codecName(o_.kind);
    if (n < 0 || uint64_t(n) > UINT32_MAX) {
      return Status::invalidArgument(fmt::format("{}: {} values: an encoding holds 0 to 2^32 - 1", name, n));
    }
    if (o_.kind == CodecKind::kTopK && n > INT32_MAX) {
      return Status::invalidArgument(fmt::format("topk on the GPU: {} values, at most 2^31 - 1", n));
    }
    // (host work before the lock: randomk's indices)
    std::vector<uint32_t> randomIdx;
    if (o_.kind == CodecKind::kRandomK) randomIdx = randomIndices(o_.seed, step, n, format::sparseK(o_, n));
    std::byte* host = format::start(o_, out, n, step);
    const size_t payload = format::payloadBytes(o_, n);
    std::lock_guard lock(mu_);
    TROUPE_CODEC_TRY(cudaSetDevice(device_), "cudaSetDevice");
    SyncOnExit sync(stream_);
    in::Scratch s(stream_);
    std::byte* dev = s.get<std::byte>(payload);
    TROUPE_CODEC_TRY(s.error(), "allocating the encoding");
    TROUPE_CODEC_TRY(cudaMemsetAsync(bad_, 0xff, 2 * sizeof(unsigned long long), stream_), "memset");
    switch (o_.kind) {
      case CodecKind::kNone:
        TROUPE_CODEC_TRY(in::plainEncode(values, residual, n, reinterpret_cast<float*>(dev), bad_, stream_), "encode");
        break;
      case CodecKind::kFp16:
      case CodecKind::kBf16:
        TROUPE_CODEC_TRY(in::castEncode(values, residual, n, o_.kind == CodecKind::kBf16,
                                        reinterpret_cast<uint16_t*>(dev), bad_, stream_),
                         "encode");
        break;
      case CodecKind::kInt8: {
        const int64_t nc = format::chunks(o_, n);
        const uint64_t mixed = hashCombine(o_.seed, step);
        const uint32_t draw = uint32_t(mixed ^ (mixed >> 32));
        TROUPE_CODEC_TRY(in::int8Encode(values, residual, n, o_.chunk, draw, reinterpret_cast<float*>(dev),
                                        reinterpret_cast<int8_t*>(dev + nc * 4), bad_, stream_),
                         "encode");
        break;
      }
      case CodecKind::kOneBit: {
        const int64_t nc = format::chunks(o_, n);
        TROUPE_CODEC_TRY(in::oneBitEncode(values, residual, n, o_.chunk, reinterpret_cast<float*>(dev),
                                          reinterpret_cast<uint8_t*>(dev + nc * 4), bad_, stream_),
                         "encode");
        break;
      }
      case CodecKind::kTopK: {
        const int64_t k = format::sparseK(o_, n);
        uint32_t* idx = reinterpret_cast<uint32_t*>(dev);
        if (k < n) {
          TROUPE_CODEC_TRY(in::topKIndices(values, residual, n, k, idx, bad_, stream_), "top-k selection");
        } else {
          std::vector<uint32_t> all(static_cast<size_t>(n));
          for (int64_t i = 0; i < n; ++i) all[size_t(i)] = uint32_t(i);
          // (a copy from pageable memory returns once the bytes are staged)
          TROUPE_CODEC_TRY(cudaMemcpyAsync(idx, all.data(), size_t(n) * 4, cudaMemcpyHostToDevice, stream_), "copy");
        }
        TROUPE_CODEC_TRY(in::sparseGather(values, residual, n, idx, k, reinterpret_cast<float*>(dev + k * 4), bad_,
                                          stream_),
                         "gather");
        break;
      }
      case CodecKind::kRandomK: {
        const int64_t k = format::sparseK(o_, n);
        uint32_t* dIdx = s.get<uint32_t>(size_t(k));
        TROUPE_CODEC_TRY(s.error(), "allocating the indices");
        TROUPE_CODEC_TRY(cudaMemcpyAsync(dIdx, randomIdx.data(), size_t(k) * 4, cudaMemcpyHostToDevice, stream_),
                         "copy");
        TROUPE_CODEC_TRY(in::sparseGather(values, residual, n, dIdx, k, reinterpret_cast<float*>(dev), bad_, stream_),
                         "gather");
        break;
      }
    }
    unsigned long long bad = kNoIndex;
    TROUPE_CODEC_TRY(cudaMemcpyAsync(host, dev, payload, cudaMemcpyDeviceToHost, stream_), "copy of the encoding");
    TROUPE_CODEC_TRY(cudaMemcpyAsync(&bad, bad_, sizeof bad, cudaMemcpyDeviceToHost, stream_), "copy");
    TROUPE_CODEC_TRY(cudaStreamSynchronize(stream_), "encode");
    if (bad != kNoIndex) return notFinite(values, residual, n, int64_t(bad));
    return Status::ok();
  }

  Status decode(const std::byte* data, size_t bytes, int64_t n, float* out, bool accumulate) const override {
    format::Header h;
    Status st = format::check(o_, data, bytes, n, &h);
    if (!st.isOk()) return st;
    const std::byte* payload = data + kCodecHeaderBytes;
    const size_t size = bytes - kCodecHeaderBytes;
    const char* name = codecName(o_.kind);
    const int64_t nc = format::chunks(o_, n);
    const int64_t k = format::sparseK(o_, n);
    std::vector<uint32_t> randomIdx;
    // What the host can check before anything is copied.
    switch (o_.kind) {
      case CodecKind::kInt8:
      case CodecKind::kOneBit: {
        // The scales, here: a bad one must not reach the device (it would
        // make every value of its chunk inf or NaN in `out`). int8 reports
        // what the CPU codec does: the first chunk with a bad scale or a
        // -128 before it.
        for (int64_t c = 0; c < nc && st.isOk(); ++c) {
          float scale;
          std::memcpy(&scale, payload + c * 4, 4);
          if ((std::bit_cast<uint32_t>(scale) & kExponent) == kExponent || scale < 0) {
            const int8_t* q = reinterpret_cast<const int8_t*>(payload + nc * 4);
            for (int64_t i = 0; o_.kind == CodecKind::kInt8 && i < c * o_.chunk && st.isOk(); ++i) {
              if (q[i] == -128) st = Status::corruption(fmt::format("int8: value {} is -128 (the codec sends -127 to 127)", i));
            }
            if (st.isOk()) st = Status::corruption(fmt::format("{}: chunk {}'s scale is {}", name, c, scale));
          }
        }
        if (st.isOk() && o_.kind == CodecKind::kOneBit) {
          st = format::checkTailBits(reinterpret_cast<const uint8_t*>(payload + nc * 4), n);
        }
        break;
      }
      case CodecKind::kTopK:
      case CodecKind::kRandomK: {
        const size_t at = o_.kind == CodecKind::kTopK ? size_t(k) * 4 : 0;
        for (int64_t j = 0; j < k && st.isOk(); ++j) {
          float v;
          std::memcpy(&v, payload + at + size_t(j) * 4, 4);
          if ((std::bit_cast<uint32_t>(v) & kExponent) == kExponent) {
            st = Status::corruption(fmt::format("{}: value {} is not finite", name, j));
          }
        }
        if (st.isOk() && o_.kind == CodecKind::kTopK) {
          std::vector<uint32_t> idx(static_cast<size_t>(k));
          std::memcpy(idx.data(), payload, size_t(k) * 4);
          st = format::checkIndices(o_, idx.data(), k, n);
        }
        if (o_.kind == CodecKind::kRandomK) randomIdx = randomIndices(o_.seed, h.step, n, k);
        break;
      }
      default: break;
    }
    if (!st.isOk()) return st;
    std::lock_guard lock(mu_);
    TROUPE_CODEC_TRY(cudaSetDevice(device_), "cudaSetDevice");
    SyncOnExit sync(stream_);
    in::Scratch s(stream_);
    std::byte* dev = s.get<std::byte>(size);
    TROUPE_CODEC_TRY(s.error(), "allocating the encoding");
    TROUPE_CODEC_TRY(cudaMemcpyAsync(dev, payload, size, cudaMemcpyHostToDevice, stream_), "copy of the encoding");
    TROUPE_CODEC_TRY(cudaMemsetAsync(bad_, 0xff, 2 * sizeof(unsigned long long), stream_), "memset");
    switch (o_.kind) {
      case CodecKind::kNone:
        TROUPE_CODEC_TRY(in::plainDecode(reinterpret_cast<const float*>(dev), n, out, accumulate, bad_, stream_),
                         "decode");
        break;
      case CodecKind::kFp16:
      case CodecKind::kBf16:
        TROUPE_CODEC_TRY(in::castDecode(reinterpret_cast<const uint16_t*>(dev), n, o_.kind == CodecKind::kBf16, out,
                                        accumulate, bad_, stream_),
                         "decode");
        break;
      case CodecKind::kInt8:
        TROUPE_CODEC_TRY(in::int8Decode(reinterpret_cast<const float*>(dev),
                                        reinterpret_cast<const int8_t*>(dev + nc * 4), n, o_.chunk, out, accumulate,
                                        bad_, stream_),
                         "decode");
        break;
      case CodecKind::kOneBit:
        TROUPE_CODEC_TRY(in::oneBitDecode(reinterpret_cast<const float*>(dev),
                                          reinterpret_cast<const uint8_t*>(dev + nc * 4), n, o_.chunk, out,
                                          accumulate, stream_),
                         "decode");
        break;
      case CodecKind::kTopK:
        TROUPE_CODEC_TRY(in::sparseScatter(reinterpret_cast<const uint32_t*>(dev),
                                           reinterpret_cast<const float*>(dev + k * 4), k, n, out, accumulate, stream_),
                         "decode");
        break;
      case CodecKind::kRandomK: {
        uint32_t* dIdx = s.get<uint32_t>(size_t(k));
        TROUPE_CODEC_TRY(s.error(), "allocating the indices");
        TROUPE_CODEC_TRY(cudaMemcpyAsync(dIdx, randomIdx.data(), size_t(k) * 4, cudaMemcpyHostToDevice, stream_),
                         "copy");
        TROUPE_CODEC_TRY(in::sparseScatter(dIdx, reinterpret_cast<const float*>(dev), k, n, out, accumulate, stream_),
                         "decode");
        break;
      }
    }
    unsigned long long bad = kNoIndex;
    TROUPE_CODEC_TRY(cudaMemcpyAsync(&bad, bad_, sizeof bad, cudaMemcpyDeviceToHost, stream_), "copy");
    TROUPE_CODEC_TRY(cudaStreamSynchronize(stream_), "decode");
    if (bad != kNoIndex) {
      if (o_.kind == CodecKind::kInt8) {
        return Status::corruption(fmt::format("int8: value {} is -128 (the codec sends -127 to 127)", bad));
      }
      return Status::corruption(fmt::format("{}: the encoding holds a value that is not finite", name));
    }
    return Status::ok();
  }

 private:
  // The first value that is not finite, named (as the CPU codec does).
  Status notFinite(const float* values, const float* residual, int64_t n, int64_t at) const {
    float v = 0, r = 0;
    if (cudaMemcpy(&v, values + at, 4, cudaMemcpyDeviceToHost) != cudaSuccess ||
        (residual && cudaMemcpy(&r, residual + at, 4, cudaMemcpyDeviceToHost) != cudaSuccess)) {
      cudaGetLastError();
    }
    return Status::invalidArgument(
        fmt::format("{}: value {} of {} to encode is not finite ({})", codecName(o_.kind), at, n, v + r));
  }

  const CodecOptions o_;
  mutable std::mutex mu_;
  const int device_;  // the device current at creation: the stream's (each call sets it)
  cudaStream_t stream_;
  unsigned long long* bad_;  // two device values
};

}  // namespace

std::unique_ptr<Codec> createCudaCodec(const CodecOptions& options) {
  const char* name = codecName(options.kind);
  int count = 0, device = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e == cudaSuccess && count > 0) e = cudaGetDevice(&device);
  if (e != cudaSuccess || count == 0) {
    cudaGetLastError();
    TROUPE_SETUP_ERROR("codec {} on the GPU: no CUDA device ({})", name,
                       e == cudaSuccess ? "none found" : cudaGetErrorString(e));
  }
  cudaStream_t stream = nullptr;
  e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (e != cudaSuccess) TROUPE_SETUP_ERROR("codec {} on the GPU: cudaStreamCreate: {}", name, cudaGetErrorString(e));
  unsigned long long* bad = nullptr;
  e = cudaMalloc(reinterpret_cast<void**>(&bad), 2 * sizeof(unsigned long long));
  if (e != cudaSuccess) {
    cudaStreamDestroy(stream);
    TROUPE_SETUP_ERROR("codec {} on the GPU: cudaMalloc: {}", name, cudaGetErrorString(e));
  }
  return std::make_unique<CudaCodec>(options, device, stream, bad);
}

}  // namespace troupe::kernels::cuda
