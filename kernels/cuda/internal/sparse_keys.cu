#include <cub/cub.cuh>

#include "kernels/cuda/internal/launchers.h"
#include "kernels/cuda/internal/scratch.cuh"

namespace troupe::kernels::cuda::internal {
namespace {

constexpr int kThreads = 256;

#define TROUPE_GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

__global__ void iota(int64_t* out, int64_t n) {
  TROUPE_GRID_STRIDE(i, n) out[i] = i;
}

__global__ void minusOne(int64_t* x, int64_t n) {
  TROUPE_GRID_STRIDE(i, n) x[i] -= 1;
}

__global__ void headFlags(const uint64_t* sorted, int64_t n, int64_t* head) {
  TROUPE_GRID_STRIDE(i, n) head[i] = (i == 0 || sorted[i] != sorted[i - 1]) ? 1 : 0;
}

// For each run head j: the run's key, start and first (smallest) position.
__global__ void scatterRuns(const uint64_t* sortedKeys, const int64_t* sortedPos, const int64_t* segId,
                            int64_t n, uint64_t* runKey, int64_t* runStart, int64_t* runFirstPos) {
  TROUPE_GRID_STRIDE(j, n) {
    if (j == 0 || segId[j] != segId[j - 1]) {
      const int64_t s = segId[j];
      runKey[s] = sortedKeys[j];
      runStart[s] = j;
      runFirstPos[s] = sortedPos[j];
    }
  }
}

__global__ void rankRuns(const int64_t* order, const uint64_t* runKey, int64_t runs, uint64_t* uniqueKeys,
                         int64_t* rankOf) {
  TROUPE_GRID_STRIDE(r, runs) {
    uniqueKeys[r] = runKey[order[r]];
    rankOf[order[r]] = r;
  }
}

__global__ void writeInverse(const int64_t* sortedPos, const int64_t* segId, const int64_t* rankOf, int64_t n,
                             int64_t* inverse) {
  TROUPE_GRID_STRIDE(j, n) inverse[sortedPos[j]] = rankOf[segId[j]];
}

// One block per run: grads of equal keys summed in increasing position.
__global__ void sumRuns(const float* __restrict__ grads, int64_t dim, const int64_t* __restrict__ sortedPos,
                        const int64_t* __restrict__ runStart, const int64_t* __restrict__ rankOf,
                        int64_t runs, int64_t n, float* __restrict__ summed) {
  for (int64_t s = blockIdx.x; s < runs; s += gridDim.x) {
    const int64_t begin = runStart[s], end = s + 1 < runs ? runStart[s + 1] : n;
    float* out = summed + rankOf[s] * dim;
    for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
      float acc = 0.0f;
      for (int64_t j = begin; j < end; ++j) acc += grads[sortedPos[j] * dim + d];
      out[d] = acc;
    }
  }
}

}  // namespace

cudaError_t uniqueKeys(const uint64_t* keys, int64_t n, const float* grads, int64_t dim,
                       uint64_t* uniqueOut, float* summedGrads, int64_t* inverse, int64_t* hostUnique,
                       cudaStream_t stream) {
  *hostUnique = 0;
  if (n == 0) return cudaSuccess;
  Scratch s(stream);
  int64_t* positions = s.get<int64_t>(n);
  uint64_t* sortedKeys = s.get<uint64_t>(n);
  int64_t* sortedPos = s.get<int64_t>(n);
  int64_t* head = s.get<int64_t>(n);
  int64_t* segId = s.get<int64_t>(n);
  uint64_t* runKey = s.get<uint64_t>(n);
  int64_t* runStart = s.get<int64_t>(n);
  int64_t* runFirstPos = s.get<int64_t>(n);
  int64_t* runIndex = s.get<int64_t>(n);
  int64_t* sortedFirst = s.get<int64_t>(n);
  int64_t* order = s.get<int64_t>(n);
  int64_t* rankOf = s.get<int64_t>(n);
  TROUPE_CUDA_TRY(s.error());

  const int grid = gridFor(n, kThreads);
  iota<<<grid, kThreads, 0, stream>>>(positions, n);
  size_t need = 0, bytes = 0;
  TROUPE_CUDA_TRY(cub::DeviceRadixSort::SortPairs(nullptr, need, keys, sortedKeys, positions, sortedPos,
                                                  n, 0, 64, stream));
  bytes = need;
  TROUPE_CUDA_TRY(cub::DeviceScan::InclusiveSum(nullptr, need, head, segId, n, stream));
  bytes = need > bytes ? need : bytes;
  TROUPE_CUDA_TRY(cub::DeviceRadixSort::SortPairs(nullptr, need, runFirstPos, sortedFirst, runIndex, order,
                                                  n, 0, 64, stream));
  bytes = need > bytes ? need : bytes;
  void* temp = s.get<char>(bytes);
  TROUPE_CUDA_TRY(s.error());

  need = bytes;
  TROUPE_CUDA_TRY(cub::DeviceRadixSort::SortPairs(temp, need, keys, sortedKeys, positions, sortedPos, n, 0,
                                                  64, stream));
  headFlags<<<grid, kThreads, 0, stream>>>(sortedKeys, n, head);
  need = bytes;
  TROUPE_CUDA_TRY(cub::DeviceScan::InclusiveSum(temp, need, head, segId, n, stream));
  minusOne<<<grid, kThreads, 0, stream>>>(segId, n);  // 0-based run ids
  int64_t runs = 0;
  TROUPE_CUDA_TRY(cudaMemcpyAsync(&runs, segId + n - 1, sizeof runs, cudaMemcpyDeviceToHost, stream));
  TROUPE_CUDA_TRY(cudaStreamSynchronize(stream));
  runs += 1;

  scatterRuns<<<grid, kThreads, 0, stream>>>(sortedKeys, sortedPos, segId, n, runKey, runStart, runFirstPos);
  iota<<<gridFor(runs, kThreads), kThreads, 0, stream>>>(runIndex, runs);
  // First-seen order: runs sorted by the position of their first occurrence.
  need = bytes;
  TROUPE_CUDA_TRY(cub::DeviceRadixSort::SortPairs(temp, need, runFirstPos, sortedFirst, runIndex, order, runs,
                                                  0, 64, stream));
  rankRuns<<<gridFor(runs, kThreads), kThreads, 0, stream>>>(order, runKey, runs, uniqueOut, rankOf);
  writeInverse<<<grid, kThreads, 0, stream>>>(sortedPos, segId, rankOf, n, inverse);
  if (grads != nullptr && dim > 0) {
    int threads = int((dim + 31) / 32 * 32);
    threads = threads > 256 ? 256 : threads;
    sumRuns<<<gridFor(runs, 1), threads, 0, stream>>>(grads, dim, sortedPos, runStart, rankOf, runs, n,
                                                     summedGrads);
  }
  TROUPE_CUDA_TRY(cudaGetLastError());
  *hostUnique = runs;
  return cudaSuccess;
}

}  // namespace troupe::kernels::cuda::internal
