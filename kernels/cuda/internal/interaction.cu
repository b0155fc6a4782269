#include <cmath>

#include "kernels/cuda/internal/launchers.h"
#include "kernels/cuda/internal/scratch.cuh"

namespace troupe::kernels::cuda::internal {
namespace {

// One block per sample; threads over the pairs (i > j, i-major order).
__global__ void forwardKernel(const float* const* inputs, int64_t numInputs, int64_t batch, int64_t dim,
                              float* out, int64_t outStride) {
  const int64_t pairs = numInputs * (numInputs - 1) / 2;
  for (int64_t b = blockIdx.x; b < batch; b += gridDim.x) {
    for (int64_t p = threadIdx.x; p < pairs; p += blockDim.x) {
      int64_t i = int64_t((1.0 + sqrt(1.0 + 8.0 * double(p))) / 2.0);
      while (i * (i - 1) / 2 > p) --i;
      while ((i + 1) * i / 2 <= p) ++i;
      const int64_t j = p - i * (i - 1) / 2;
      const float* zi = inputs[i] + b * dim;
      const float* zj = inputs[j] + b * dim;
      float acc = 0.0f;
      for (int64_t d = 0; d < dim; ++d) acc += zi[d] * zj[d];
      out[b * outStride + p] = acc;
    }
  }
}

// One block per sample; threads over (input i, coordinate d); j in order.
__global__ void backwardKernel(const float* const* inputs, int64_t numInputs, int64_t batch, int64_t dim,
                               const float* dOut, int64_t dOutStride, float* const* dInputs) {
  for (int64_t b = blockIdx.x; b < batch; b += gridDim.x) {
    const float* go = dOut + b * dOutStride;
    for (int64_t t = threadIdx.x; t < numInputs * dim; t += blockDim.x) {
      const int64_t i = t / dim, d = t % dim;
      float acc = 0.0f;
      for (int64_t j = 0; j < numInputs; ++j) {
        if (j == i) continue;
        const int64_t hi = i > j ? i : j, lo = i > j ? j : i;
        acc += go[hi * (hi - 1) / 2 + lo] * inputs[j][b * dim + d];
      }
      dInputs[i][b * dim + d] = acc;
    }
  }
}

}  // namespace

cudaError_t dotInteractionForward(const float* const* inputs, int64_t numInputs, int64_t batch, int64_t dim,
                                  float* out, int64_t outStride, cudaStream_t stream) {
  if (batch == 0 || numInputs < 2) return cudaSuccess;
  forwardKernel<<<gridFor(batch, 1), 128, 0, stream>>>(inputs, numInputs, batch, dim, out, outStride);
  return cudaGetLastError();
}

cudaError_t dotInteractionBackward(const float* const* inputs, int64_t numInputs, int64_t batch, int64_t dim,
                                   const float* dOut, int64_t dOutStride, float* const* dInputs,
                                   cudaStream_t stream) {
  if (batch == 0 || numInputs == 0) return cudaSuccess;
  backwardKernel<<<gridFor(batch, 1), 256, 0, stream>>>(inputs, numInputs, batch, dim, dOut, dOutStride, dInputs);
  return cudaGetLastError();
}

}  // namespace troupe::kernels::cuda::internal
