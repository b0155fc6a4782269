// NCCL backend (see nccl_communicator.h). Compiled only with TROUPE_HAVE_NCCL;
// nccl_unavailable.cc stands in otherwise.
#include "collectives/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "common/logging.h"

namespace troupe::collectives {
namespace {

using Clock = std::chrono::steady_clock;

static_assert(sizeof(ncclUniqueId) == kNcclIdBytes, "ncclUniqueId changed size");

std::shared_ptr<spdlog::logger> log() {
  static auto l = logger("collectives");
  return l;
}

int deviceCount(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    if (why) *why = fmt::format("no usable CUDA device here ({})", cudaGetErrorString(e));
    return 0;
  }
  if (n == 0 && why) *why = "no CUDA device here";
  return n;
}

Status cudaStatus(std::string_view what, cudaError_t e) {
  return Status::internal(fmt::format("{}: CUDA {} ({})", what, cudaGetErrorName(e), cudaGetErrorString(e)));
}

Status ncclStatus(std::string_view what, ncclResult_t r, ncclComm_t comm) {
  const char* detail = comm ? ncclGetLastError(comm) : nullptr;
  return Status::unavailable(fmt::format("{}: NCCL {}{}{}", what, ncclGetErrorString(r),
                                         detail && *detail ? ": " : "", detail ? detail : ""));
}

ncclDataType_t ncclType(DType dtype) {
  switch (dtype) {
    case DType::kBFloat16: return ncclBfloat16;
    case DType::kFloat16: return ncclFloat16;
    default: return ncclFloat32;
  }
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(NcclOptions options, int device, ncclComm_t comm, cudaStream_t stream)
      : options_(std::move(options)), device_(device), comm_(comm), stream_(stream) {}

  ~NcclCommunicator() override {
    cudaSetDevice(device_);
    if (comm_) {  // (a failed communicator was aborted already)
      // Flush what was issued; when that does not finish (a peer is gone),
      // abort instead.
      ncclResult_t state = ncclCommFinalize(comm_);
      const auto deadline = Clock::now() + std::chrono::seconds(10);
      while (state == ncclInProgress && Clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) break;
      }
      if (state == ncclSuccess) {
        ncclCommDestroy(comm_);
      } else {
        ncclCommAbort(comm_);
      }
    }
    if (scratch_) cudaFree(scratch_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }
  const char* backend() const override { return "nccl"; }

  Status allReduce(void* data, size_t count, DType dtype, ReduceOp op) override {
    const size_t elem = reduceElementBytes(dtype);
    if (elem == 0) return Status::invalidArgument("allReduce: the NCCL backend reduces float32, bfloat16 and float16 only");
    if (!data && count) return Status::invalidArgument("allReduce: a null buffer");
    if (Status s = begin(); !s.isOk()) return s;
    if (count == 0) return Status::ok();
    const size_t bytes = count * elem;
    Expected<std::byte*> place = onDevice(data, bytes, 0, data);
    if (!place.hasValue()) return finish(place.status());
    std::byte* p = *place;
    const ncclResult_t r = ncclAllReduce(p, p, count, ncclType(dtype), op == ReduceOp::kAverage ? ncclAvg : ncclSum,
                                         comm_, stream_);
    if (Status s = issued("all-reduce", bytes, r); !s.isOk()) return finish(s);
    return finish(copyOut(data, p, bytes, "all-reduce"));
  }

  Status broadcast(void* data, size_t bytes, int root) override {
    if (root < 0 || root >= size()) {
      return Status::invalidArgument(fmt::format("broadcast: root {} is not a rank of a group of {}", root, size()));
    }
    if (!data && bytes) return Status::invalidArgument("broadcast: a null buffer");
    if (Status s = begin(); !s.isOk()) return s;
    if (bytes == 0) return Status::ok();
    Expected<std::byte*> place = onDevice(data, bytes, 0, rank() == root ? data : nullptr);
    if (!place.hasValue()) return finish(place.status());
    std::byte* p = *place;
    const ncclResult_t r = ncclBroadcast(p, p, bytes, ncclUint8, root, comm_, stream_);
    if (Status s = issued("broadcast", bytes, r); !s.isOk()) return finish(s);
    return finish(copyOut(data, p, bytes, "broadcast"));
  }

  Status allGather(const void* in, void* out, size_t bytes) override {
    if ((!in || !out) && bytes) return Status::invalidArgument("allGather: a null buffer");
    if (Status s = begin(); !s.isOk()) return s;
    if (bytes == 0) return Status::ok();
    const size_t total = bytes * size_t(size());
    std::byte* const outBytes = static_cast<std::byte*>(out);
    std::byte* dst = nullptr;
    if (isDevice(out) && isDevice(in)) {
      dst = outBytes;
      if (in != outBytes + bytes * size_t(rank())) {
        if (Status s = copy(dst + bytes * size_t(rank()), in, bytes, "all-gather"); !s.isOk()) return finish(s);
      }
    } else {
      Expected<std::byte*> place = onDevice(nullptr, total, bytes * size_t(rank()), in, bytes);
      if (!place.hasValue()) return finish(place.status());
      dst = *place;
    }
    const ncclResult_t r = ncclAllGather(dst + bytes * size_t(rank()), dst, bytes, ncclUint8, comm_, stream_);
    if (Status s = issued("all-gather", total, r); !s.isOk()) return finish(s);
    return finish(copyOut(out, dst, total, "all-gather"));
  }

  Expected<std::vector<std::vector<std::byte>>> allGatherV(const void* in, size_t bytes) override {
    if (!in && bytes) return Status::invalidArgument("allGatherV: a null buffer");
    const size_t n = size_t(size());
    std::vector<uint64_t> sizes(n);
    const uint64_t mine = bytes;
    if (Status s = allGather(&mine, sizes.data(), sizeof(mine)); !s.isOk()) return s;
    const uint64_t widest = *std::max_element(sizes.begin(), sizes.end());
    std::vector<std::vector<std::byte>> blocks(n);
    for (size_t r = 0; r < n; ++r) blocks[r].resize(size_t(sizes[r]));
    if (widest == 0) return blocks;
    if (Status s = begin(); !s.isOk()) return s;
    const size_t stride = size_t(widest);
    Expected<std::byte*> place = onDevice(nullptr, stride * n, stride * size_t(rank()), in, bytes);
    if (!place.hasValue()) return finish(place.status());
    std::byte* dst = *place;
    const ncclResult_t r = ncclAllGather(dst + stride * size_t(rank()), dst, stride, ncclUint8, comm_, stream_);
    if (Status s = issued("all-gather", stride * n, r); !s.isOk()) return finish(s);
    for (size_t k = 0; k < n; ++k) {
      if (blocks[k].empty()) continue;
      if (Status s = copy(blocks[k].data(), dst + stride * k, blocks[k].size(), "all-gather"); !s.isOk()) {
        return finish(s);
      }
    }
    if (Status s = finish(Status::ok()); !s.isOk()) return s;
    return blocks;
  }

  Status barrier() override {
    float one = 1;
    return allReduce(&one, 1, DType::kFloat32, ReduceOp::kSum);
  }

  // A failure of this rank's own: NCCL's communicator is aborted (peers
  // blocked with it get an error) and the failure sticks.
  Status abort(Status why) override {
    if (why.isOk()) why = Status::internal("aborted with no reason");
    return finish(std::move(why));
  }

  // Waits for the group to form (ncclCommInitRankConfig returned
  // ncclInProgress).
  Status waitInit() { return finish(wait("joining the group", options_.connectTimeout)); }

 private:
  Status begin() {
    if (!failed_.isOk()) return failed_;
    const cudaError_t e = cudaSetDevice(device_);
    if (e != cudaSuccess) return finish(cudaStatus(fmt::format("selecting CUDA device {}", device_), e));
    return Status::ok();
  }

  // The first failure sticks: NCCL's communicator is aborted, so a peer
  // blocked in a kernel with this rank gets an error rather than a hang.
  Status finish(Status s) {
    if (s.isOk() || !failed_.isOk()) return failed_.isOk() ? s : failed_;
    failed_ = s;
    log()->error("rank {}: the NCCL communicator failed: {}", rank(), s.message());
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
    return failed_;
  }

  bool isDevice(const void* p) const {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return (a.type == cudaMemoryTypeDevice && a.device == device_) || a.type == cudaMemoryTypeManaged;
  }

  // Where NCCL works on `bytes`: the caller's buffer when `data` is device
  // memory of this rank's device, else the scratch buffer, into which
  // `fill` (fillBytes of it, `bytes` when 0) is copied at `offset`.
  Expected<std::byte*> onDevice(void* data, size_t bytes, size_t offset, const void* fill, size_t fillBytes = 0) {
    if (data && isDevice(data)) return static_cast<std::byte*>(data);
    if (bytes > scratchBytes_) {
      if (scratch_) cudaFree(scratch_);
      scratch_ = nullptr;
      scratchBytes_ = 0;
      const cudaError_t e = cudaMalloc(reinterpret_cast<void**>(&scratch_), bytes);
      if (e != cudaSuccess) return cudaStatus(fmt::format("staging {} bytes on CUDA device {}", bytes, device_), e);
      scratchBytes_ = bytes;
    }
    if (fill) {
      if (Status s = copy(scratch_ + offset, fill, fillBytes ? fillBytes : bytes, "staging"); !s.isOk()) return s;
    }
    return scratch_;
  }

  // A copy on the communicator's stream, any direction, waited for (the
  // stream is idle before and after it).
  Status copy(void* dst, const void* src, size_t bytes, std::string_view what) {
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_);
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream_);
    if (e != cudaSuccess) return cudaStatus(fmt::format("{}: copying {} bytes", what, bytes), e);
    return Status::ok();
  }

  // Waits for an NCCL call issued on the stream.
  Status issued(std::string_view what, size_t bytes, ncclResult_t r) {
    if (r != ncclSuccess && r != ncclInProgress) {
      return ncclStatus(fmt::format("rank {}: the {} of {} bytes", rank(), what, bytes), r, comm_);
    }
    return wait(fmt::format("the {} of {} bytes", what, bytes), options_.timeout);
  }

  // After the result is back on the device: into the caller's buffer.
  Status copyOut(void* data, const std::byte* p, size_t bytes, std::string_view what) {
    if (p == data) return Status::ok();
    return copy(data, p, bytes, what);
  }

  // Polls until NCCL is done with what was issued and the stream is idle:
  // NCCL's asynchronous error, the health callback and the deadline end it
  // early with an error.
  Status wait(std::string_view what, std::chrono::milliseconds limit) {
    const auto start = Clock::now();
    const auto deadline = start + limit;
    for (uint64_t polls = 0;; ++polls) {
      ncclResult_t state = ncclSuccess;
      ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
      if (r != ncclSuccess) state = r;
      if (state != ncclSuccess && state != ncclInProgress) {
        return ncclStatus(fmt::format("rank {}: {}", rank(), what), state, comm_);
      }
      if (state == ncclSuccess) {
        const cudaError_t e = cudaStreamQuery(stream_);
        if (e == cudaSuccess) return Status::ok();
        if (e != cudaErrorNotReady) return cudaStatus(fmt::format("rank {}: {}", rank(), what), e);
      }
      if (options_.health && polls % 16 == 0) {
        if (Status s = options_.health(); !s.isOk()) {
          return Status::unavailable(fmt::format("rank {}: {}: {}", rank(), what, s.message()));
        }
      }
      const auto now = Clock::now();
      if (now > deadline) {
        return Status::timeout(fmt::format("rank {}: {} did not finish within {} ms", rank(), what, limit.count()));
      }
      if (now - start > std::chrono::milliseconds(1)) {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      } else {
        std::this_thread::yield();
      }
    }
  }

  NcclOptions options_;
  int device_;
  ncclComm_t comm_;
  cudaStream_t stream_;
  std::byte* scratch_ = nullptr;
  size_t scratchBytes_ = 0;
  Status failed_;
};

}  // namespace

bool ncclBuilt() { return true; }

std::string ncclUnavailableReason() {
  std::string why;
  return deviceCount(&why) > 0 ? std::string() : why;
}

int ncclDevices() { return deviceCount(nullptr); }

Expected<std::string> makeNcclId() {
  ncclUniqueId id;
  const ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) return ncclStatus("making an NCCL unique id", r, nullptr);
  return std::string(id.internal, sizeof(id.internal));
}

Expected<std::unique_ptr<Communicator>> createNcclCommunicator(NcclOptions options) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return Status::invalidArgument(fmt::format("NCCL communicator: rank {} of a group of {}", options.rank, options.size));
  }
  if (options.id.size() != kNcclIdBytes) {
    return Status::invalidArgument(
        fmt::format("NCCL communicator: the unique id has {} bytes, not {}", options.id.size(), kNcclIdBytes));
  }
  std::string why;
  const int devices = deviceCount(&why);
  if (devices == 0) return Status::unavailable("NCCL communicator: " + why);
  const int device = options.device >= 0 ? options.device : options.rank % devices;
  if (device >= devices) {
    return Status::invalidArgument(
        fmt::format("NCCL communicator: CUDA device {} asked for, {} present", device, devices));
  }
  cudaError_t e = cudaSetDevice(device);
  if (e != cudaSuccess) return cudaStatus(fmt::format("NCCL communicator: selecting CUDA device {}", device), e);
  cudaStream_t stream = nullptr;
  e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (e != cudaSuccess) return cudaStatus("NCCL communicator: creating its stream", e);
  ncclUniqueId id;
  std::memcpy(id.internal, options.id.data(), kNcclIdBytes);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every wait is ours: polled, bounded, abortable
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRankConfig(&comm, options.size, id, options.rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    Status s = ncclStatus(fmt::format("NCCL communicator: rank {} joining a group of {}", options.rank, options.size),
                          r, comm);
    if (comm) ncclCommAbort(comm);
    cudaStreamDestroy(stream);
    return s;
  }
  const int rank = options.rank, size = options.size;
  auto c = std::make_unique<NcclCommunicator>(std::move(options), device, comm, stream);
  if (Status s = c->waitInit(); !s.isOk()) return s;  // ~NcclCommunicator aborts
  log()->info("rank {} of {}: NCCL {}.{}.{} communicator on CUDA device {}", rank, size, NCCL_MAJOR, NCCL_MINOR,
              NCCL_PATCH, device);
  return std::unique_ptr<Communicator>(std::move(c));
}

}  // namespace troupe::collectives
