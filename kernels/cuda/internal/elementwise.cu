#include <cub/cub.cuh>

#include "kernels/cuda/internal/launchers.h"
#include "kernels/cuda/internal/scratch.cuh"

namespace troupe::kernels::cuda::internal {
namespace {

constexpr int kThreads = 256;

#define TROUPE_GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

// One thread per (row, coordinate); the same formulas as kernels/cpu/row_optimizer.cc.
__global__ void rowOptimizerKernel(OptimizerParams p, float* const* rows, int64_t numRows, int64_t dim,
                                   const float* __restrict__ grads) {
  TROUPE_GRID_STRIDE(idx, numRows * dim) {
    const int64_t r = idx / dim, i = idx % dim;
    float* w = rows[r];
    float* s0 = w + dim;
    float* s1 = w + 2 * dim;
    const float g = grads[idx];
    switch (p.kind) {
      case 0:
        w[i] -= p.lr * (g + p.weightDecay * w[i]);
        break;
      case 1: {
        const float a = s0[i] + g * g;
        s0[i] = a;
        w[i] -= p.lr * g / (sqrtf(a) + p.eps);
        break;
      }
      case 2: {
        const float m = p.beta1 * s0[i] + (1.0f - p.beta1) * g;
        const float v = p.beta2 * s1[i] + (1.0f - p.beta2) * g * g;
        s0[i] = m;
        s1[i] = v;
        w[i] = w[i] * (1.0f - p.lr * p.weightDecay) - p.adamStepScale * m / (sqrtf(v) + p.eps);
        break;
      }
      default: {
        const float invAlpha = 1.0f / p.lr;
        const float nOld = s1[i];
        const float nNew = nOld + g * g;
        const float sqrtNew = sqrtf(nNew);
        const float sigma = (sqrtNew - sqrtf(nOld)) * invAlpha;
        const float z = s0[i] + g - sigma * w[i];
        s0[i] = z;
        s1[i] = nNew;
        const float shrunk = z > p.l1 ? z - p.l1 : (z < -p.l1 ? z + p.l1 : 0.0f);
        w[i] = -shrunk / ((p.ftrlBeta + sqrtNew) * invAlpha + p.l2);
      }
    }
  }
}

__global__ void addBiasKernel(float* y, const float* bias, int64_t batch, int64_t out) {
  TROUPE_GRID_STRIDE(idx, batch * out) y[idx] += bias[idx % out];
}

// One thread per column, rows summed in order: deterministic.
__global__ void columnSumsKernel(const float* dy, int64_t batch, int64_t out, float* dbias, bool accumulate) {
  TROUPE_GRID_STRIDE(c, out) {
    float acc = accumulate ? dbias[c] : 0.0f;
    for (int64_t b = 0; b < batch; ++b) acc += dy[b * out + c];
    dbias[c] = acc;
  }
}

__global__ void reluForwardKernel(const float* x, int64_t n, float* y) {
  TROUPE_GRID_STRIDE(i, n) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

__global__ void reluBackwardKernel(const float* x, const float* dy, int64_t n, float* dx) {
  TROUPE_GRID_STRIDE(i, n) dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
}

__global__ void sigmoidCeKernel(const float* z, const float* y, int64_t n, float* dz, double* loss) {
  TROUPE_GRID_STRIDE(i, n) {
    const double zi = z[i], yi = y[i];
    loss[i] = fmax(zi, 0.0) - zi * yi + log1p(exp(-fabs(zi)));
    if (dz) {
      const double s = zi >= 0 ? 1.0 / (1.0 + exp(-zi)) : exp(zi) / (1.0 + exp(zi));
      dz[i] = float((s - yi) / double(n));
    }
  }
}

struct MaxOp {
  __device__ double operator()(double a, double b) const { return fmax(a, b); }
};

// One block per row: max, sum of exponentials, loss and gradient.
__global__ void softmaxCeKernel(const float* logits, const int32_t* labels, int64_t batch, int64_t classes,
                                float* dLogits, double* loss) {
  using Reduce = cub::BlockReduce<double, kThreads>;
  __shared__ typename Reduce::TempStorage temp;
  __shared__ double shared;
  for (int64_t b = blockIdx.x; b < batch; b += gridDim.x) {
    const float* z = logits + b * classes;
    double m = -INFINITY;
    for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) m = fmax(m, double(z[c]));
    double rowMax = Reduce(temp).Reduce(m, MaxOp{});
    if (threadIdx.x == 0) shared = rowMax;
    __syncthreads();
    rowMax = shared;
    double sum = 0.0;
    for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) sum += exp(double(z[c]) - rowMax);
    __syncthreads();
    double total = Reduce(temp).Sum(sum);
    if (threadIdx.x == 0) shared = total;
    __syncthreads();
    total = shared;
    const double logZ = rowMax + log(total);
    if (threadIdx.x == 0) loss[b] = logZ - double(z[labels[b]]);
    if (dLogits) {
      for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) {
        const double prob = exp(double(z[c]) - logZ);
        dLogits[b * classes + c] = float((prob - (c == labels[b] ? 1.0 : 0.0)) / double(batch));
      }
    }
    __syncthreads();
  }
}

cudaError_t meanOf(const double* values, int64_t n, double* hostMean, cudaStream_t stream) {
  Scratch s(stream);
  double* sum = s.get<double>(1);
  size_t bytes = 0;
  TROUPE_CUDA_TRY(cub::DeviceReduce::Sum(nullptr, bytes, values, sum, n, stream));
  void* temp = s.get<char>(bytes);
  TROUPE_CUDA_TRY(s.error());
  TROUPE_CUDA_TRY(cub::DeviceReduce::Sum(temp, bytes, values, sum, n, stream));
  double total = 0;
  TROUPE_CUDA_TRY(cudaMemcpyAsync(&total, sum, sizeof total, cudaMemcpyDeviceToHost, stream));
  TROUPE_CUDA_TRY(cudaStreamSynchronize(stream));
  *hostMean = total / double(n);
  return cudaSuccess;
}

}  // namespace

cudaError_t applyRowOptimizer(const OptimizerParams& p, float* const* rows, int64_t numRows, int64_t dim,
                              const float* grads, cudaStream_t stream) {
  if (numRows == 0 || dim == 0) return cudaSuccess;
  rowOptimizerKernel<<<gridFor(numRows * dim, kThreads), kThreads, 0, stream>>>(p, rows, numRows, dim, grads);
  return cudaGetLastError();
}

cudaError_t addBias(float* y, const float* bias, int64_t batch, int64_t out, cudaStream_t stream) {
  if (batch * out == 0) return cudaSuccess;
  addBiasKernel<<<gridFor(batch * out, kThreads), kThreads, 0, stream>>>(y, bias, batch, out);
  return cudaGetLastError();
}

cudaError_t columnSums(const float* dy, int64_t batch, int64_t out, float* dbias, bool accumulate,
                       cudaStream_t stream) {
  if (out == 0) return cudaSuccess;
  columnSumsKernel<<<gridFor(out, kThreads), kThreads, 0, stream>>>(dy, batch, out, dbias, accumulate);
  return cudaGetLastError();
}

cudaError_t reluForward(const float* x, int64_t n, float* y, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  reluForwardKernel<<<gridFor(n, kThreads), kThreads, 0, stream>>>(x, n, y);
  return cudaGetLastError();
}

cudaError_t reluBackward(const float* x, const float* dy, int64_t n, float* dx, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  reluBackwardKernel<<<gridFor(n, kThreads), kThreads, 0, stream>>>(x, dy, n, dx);
  return cudaGetLastError();
}

cudaError_t sigmoidCrossEntropy(const float* logits, const float* labels, int64_t n, float* dLogits,
                                double* hostLoss, cudaStream_t stream) {
  *hostLoss = 0.0;
  if (n == 0) return cudaSuccess;
  Scratch s(stream);
  double* loss = s.get<double>(n);
  TROUPE_CUDA_TRY(s.error());
  sigmoidCeKernel<<<gridFor(n, kThreads), kThreads, 0, stream>>>(logits, labels, n, dLogits, loss);
  TROUPE_CUDA_TRY(cudaGetLastError());
  return meanOf(loss, n, hostLoss, stream);
}

cudaError_t softmaxCrossEntropy(const float* logits, const int32_t* labels, int64_t batch, int64_t classes,
                                float* dLogits, double* hostLoss, cudaStream_t stream) {
  *hostLoss = 0.0;
  if (batch == 0) return cudaSuccess;
  Scratch s(stream);
  double* loss = s.get<double>(batch);
  TROUPE_CUDA_TRY(s.error());
  softmaxCeKernel<<<gridFor(batch, 1), kThreads, 0, stream>>>(logits, labels, batch, classes, dLogits, loss);
  TROUPE_CUDA_TRY(cudaGetLastError());
  return meanOf(loss, batch, hostLoss, stream);
}

}  // namespace troupe::kernels::cuda::internal
