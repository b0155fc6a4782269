#include "kernels/cuda/internal/launchers.h"

namespace troupe::kernels::cuda::internal {
namespace {

constexpr int kThreads = 256;

int blocksFor(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  return int(b < 65535 ? (b > 0 ? b : 1) : 65535);
}

__global__ void badIndexKernel(const void* indices, bool indices64, int64_t nnz, int64_t numRows,
                               unsigned long long* bad) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < nnz;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t v = indices64 ? static_cast<const int64_t*>(indices)[i]
                          : static_cast<const int32_t*>(indices)[i];
    if (v < 0 || v >= numRows) atomicMin(bad, static_cast<unsigned long long>(i));
  }
}

__global__ void badOffsetKernel(const int64_t* offsets, int64_t batch, int64_t nnz,
                                unsigned long long* bad) {
  for (int64_t b = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; b <= batch;
       b += int64_t(gridDim.x) * blockDim.x) {
    bool ok = offsets[b] >= 0 && offsets[b] <= nnz && (b == 0 || offsets[b - 1] <= offsets[b]);
    if (!ok) atomicMin(bad, static_cast<unsigned long long>(b));
  }
}

__global__ void badLabelKernel(const float* labels, int64_t n, unsigned long long* bad) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float y = labels[i];
    if (!(y >= 0.0f && y <= 1.0f)) atomicMin(bad, static_cast<unsigned long long>(i));
  }
}

__global__ void badClassKernel(const int32_t* labels, int64_t n, int64_t classes,
                               unsigned long long* bad) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    if (labels[i] < 0 || labels[i] >= classes) atomicMin(bad, static_cast<unsigned long long>(i));
  }
}

cudaError_t reset(unsigned long long* bad, cudaStream_t stream) {
  return cudaMemsetAsync(bad, 0xff, sizeof(*bad), stream);  // all ones: "none"
}

}  // namespace

cudaError_t findBadIndex(const void* indices, bool indices64, int64_t nnz, int64_t numRows,
                         unsigned long long* bad, cudaStream_t stream) {
  if (cudaError_t e = reset(bad, stream)) return e;
  if (nnz > 0) badIndexKernel<<<blocksFor(nnz), kThreads, 0, stream>>>(indices, indices64, nnz, numRows, bad);
  return cudaGetLastError();
}

cudaError_t findBadOffset(const int64_t* offsets, int64_t batch, int64_t nnz,
                          unsigned long long* bad, cudaStream_t stream) {
  if (cudaError_t e = reset(bad, stream)) return e;
  if (offsets != nullptr) badOffsetKernel<<<blocksFor(batch + 1), kThreads, 0, stream>>>(offsets, batch, nnz, bad);
  return cudaGetLastError();
}

cudaError_t findBadLabel(const float* labels, int64_t n, unsigned long long* bad, cudaStream_t stream) {
  if (cudaError_t e = reset(bad, stream)) return e;
  if (n > 0) badLabelKernel<<<blocksFor(n), kThreads, 0, stream>>>(labels, n, bad);
  return cudaGetLastError();
}

cudaError_t findBadClass(const int32_t* labels, int64_t n, int64_t classes, unsigned long long* bad,
                         cudaStream_t stream) {
  if (cudaError_t e = reset(bad, stream)) return e;
  if (n > 0) badClassKernel<<<blocksFor(n), kThreads, 0, stream>>>(labels, n, classes, bad);
  return cudaGetLastError();
}

}  // namespace troupe::kernels::cuda::internal
