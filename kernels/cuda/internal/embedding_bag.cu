#include <cub/cub.cuh>

#include "kernels/cuda/internal/launchers.h"
#include "kernels/cuda/internal/scratch.cuh"

namespace troupe::kernels::cuda::internal {
namespace {

__device__ __forceinline__ int64_t loadIndex(const void* indices, bool indices64, int64_t i) {
  return indices64 ? static_cast<const int64_t*>(indices)[i] : static_cast<const int32_t*>(indices)[i];
}

int threadsForDim(int64_t dim) {
  int64_t t = (dim + 31) / 32 * 32;
  return int(t < 32 ? 32 : (t > 256 ? 256 : t));
}

// One block per bag (grid-stride), threads over the embedding dimension.
__global__ void forwardKernel(const float* __restrict__ rows, int64_t dim, const void* indices,
                              bool indices64, const int64_t* __restrict__ offsets, int64_t batch,
                              const float* __restrict__ weights, bool mean, float* __restrict__ out) {
  for (int64_t b = blockIdx.x; b < batch; b += gridDim.x) {
    const int64_t begin = offsets[b], end = offsets[b + 1];
    const float scale = (mean && end > begin) ? 1.0f / float(end - begin) : 1.0f;
    for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
      float acc = 0.0f;
      for (int64_t i = begin; i < end; ++i) {
        const float w = weights ? weights[i] : 1.0f;
        acc += w * rows[loadIndex(indices, indices64, i) * dim + d];
      }
      out[b * dim + d] = acc * scale;
    }
  }
}

__global__ void bagOfKernel(const int64_t* offsets, int64_t batch, int64_t* bagOf) {
  for (int64_t b = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; b < batch;
       b += int64_t(gridDim.x) * blockDim.x) {
    for (int64_t i = offsets[b]; i < offsets[b + 1]; ++i) bagOf[i] = b;
  }
}

__global__ void keysAndPositions(const void* indices, bool indices64, int64_t nnz, int64_t* keys,
                                 int64_t* positions, int64_t* bagOf) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < nnz;
       i += int64_t(gridDim.x) * blockDim.x) {
    keys[i] = loadIndex(indices, indices64, i);
    positions[i] = i;
    bagOf[i] = -1;
  }
}

// One block per run of equal row indices; contributions added in index order.
__global__ void backwardSegments(const float* __restrict__ gradOut, int64_t dim,
                                 const int64_t* __restrict__ sortedPos,
                                 const int64_t* __restrict__ runRows,
                                 const int64_t* __restrict__ runStarts,
                                 const int64_t* __restrict__ runCounts, const int64_t* numRuns,
                                 const int64_t* __restrict__ bagOf,
                                 const int64_t* __restrict__ offsets,
                                 const float* __restrict__ weights, bool mean,
                                 float* __restrict__ gradRows) {
  const int64_t runs = *numRuns;
  for (int64_t s = blockIdx.x; s < runs; s += gridDim.x) {
    const int64_t row = runRows[s], start = runStarts[s], count = runCounts[s];
    for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
      float acc = gradRows[row * dim + d];
      for (int64_t j = start; j < start + count; ++j) {
        const int64_t p = sortedPos[j];
        const int64_t b = bagOf[p];
        if (b < 0) continue;
        float scale = weights ? weights[p] : 1.0f;
        if (mean) scale /= float(offsets[b + 1] - offsets[b]);
        acc += gradOut[b * dim + d] * scale;
      }
      gradRows[row * dim + d] = acc;
    }
  }
}

}  // namespace

cudaError_t embeddingBagForward(const float* rows, int64_t dim, const void* indices, bool indices64,
                                const int64_t* offsets, int64_t batch, const float* weights,
                                bool mean, float* out, cudaStream_t stream) {
  if (batch == 0 || dim == 0) return cudaSuccess;
  forwardKernel<<<gridFor(batch, 1), threadsForDim(dim), 0, stream>>>(rows, dim, indices, indices64,
                                                                     offsets, batch, weights, mean, out);
  return cudaGetLastError();
}

cudaError_t embeddingBagBackward(const float* gradOut, int64_t dim, const void* indices,
                                 bool indices64, int64_t nnz, const int64_t* offsets, int64_t batch,
                                 const float* weights, bool mean, float* gradRows,
                                 cudaStream_t stream) {
  if (nnz == 0 || batch == 0 || dim == 0) return cudaSuccess;
  Scratch s(stream);
  int64_t* keys = s.get<int64_t>(nnz);
  int64_t* positions = s.get<int64_t>(nnz);
  int64_t* bagOf = s.get<int64_t>(nnz);
  int64_t* sortedKeys = s.get<int64_t>(nnz);
  int64_t* sortedPos = s.get<int64_t>(nnz);
  int64_t* runRows = s.get<int64_t>(nnz);
  int64_t* runCounts = s.get<int64_t>(nnz);
  int64_t* runStarts = s.get<int64_t>(nnz);
  int64_t* numRuns = s.get<int64_t>(1);
  TROUPE_CUDA_TRY(s.error());

  keysAndPositions<<<gridFor(nnz, 256), 256, 0, stream>>>(indices, indices64, nnz, keys, positions, bagOf);
  bagOfKernel<<<gridFor(batch, 256), 256, 0, stream>>>(offsets, batch, bagOf);
  TROUPE_CUDA_TRY(cudaMemsetAsync(runCounts, 0, nnz * sizeof(int64_t), stream));

  size_t bytes = 0, need = 0;
  TROUPE_CUDA_TRY(cub::DeviceRadixSort::SortPairs(nullptr, need, keys, sortedKeys, positions,
                                                  sortedPos, nnz, 0, 64, stream));
  bytes = need;
  TROUPE_CUDA_TRY(cub::DeviceRunLengthEncode::Encode(nullptr, need, sortedKeys, runRows, runCounts,
                                                     numRuns, nnz, stream));
  bytes = need > bytes ? need : bytes;
  TROUPE_CUDA_TRY(cub::DeviceScan::ExclusiveSum(nullptr, need, runCounts, runStarts, nnz, stream));
  bytes = need > bytes ? need : bytes;
  void* temp = s.get<char>(bytes);
  TROUPE_CUDA_TRY(s.error());

  need = bytes;
  TROUPE_CUDA_TRY(cub::DeviceRadixSort::SortPairs(temp, need, keys, sortedKeys, positions, sortedPos,
                                                  nnz, 0, 64, stream));
  need = bytes;
  TROUPE_CUDA_TRY(cub::DeviceRunLengthEncode::Encode(temp, need, sortedKeys, runRows, runCounts,
                                                     numRuns, nnz, stream));
  need = bytes;
  TROUPE_CUDA_TRY(cub::DeviceScan::ExclusiveSum(temp, need, runCounts, runStarts, nnz, stream));
  backwardSegments<<<gridFor(nnz, 1), threadsForDim(dim), 0, stream>>>(
      gradOut, dim, sortedPos, runRows, runStarts, runCounts, numRuns, bagOf, offsets, weights, mean,
      gradRows);
  return cudaGetLastError();
}

}  // namespace troupe::kernels::cuda::internal
