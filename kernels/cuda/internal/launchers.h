// Device-side launchers of the CUDA kernels. Plain C++ types only, so the .cu
// files need no troupe headers and the host code (cuda_kernels.cc) needs no
// device code. Every launcher enqueues on `stream` and returns the launch
// error; pointers are device memory unless named host*. Scratch memory comes
// from the stream-ordered allocator (cudaMallocAsync).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace troupe::kernels::cuda::internal {

// ---- validation: writes into *deviceBad the first bad position, or -1 ------
cudaError_t findBadIndex(const void* indices, bool indices64, int64_t nnz, int64_t numRows,
                         unsigned long long* deviceBad, cudaStream_t stream);
cudaError_t findBadOffset(const int64_t* offsets, int64_t batch, int64_t nnz,
                          unsigned long long* deviceBad, cudaStream_t stream);
cudaError_t findBadLabel(const float* labels, int64_t n, unsigned long long* deviceBad,
                         cudaStream_t stream);
cudaError_t findBadClass(const int32_t* labels, int64_t n, int64_t classes,
                         unsigned long long* deviceBad, cudaStream_t stream);

// ---- embedding bags ----------------------------------------------------------
cudaError_t embeddingBagForward(const float* rows, int64_t dim, const void* indices,
                                bool indices64, const int64_t* offsets, int64_t batch,
                                const float* weights, bool mean, float* out, cudaStream_t stream);
// Deterministic: contributions to one row are added in index order.
cudaError_t embeddingBagBackward(const float* gradOut, int64_t dim, const void* indices,
                                 bool indices64, int64_t nnz, const int64_t* offsets,
                                 int64_t batch, const float* weights, bool mean, float* gradRows,
                                 cudaStream_t stream);

// ---- sparse keys: first-seen order, *hostUnique receives the count ------------
// With grads != nullptr, also sums grads [n x dim] per unique key in index
// order into summedGrads.
cudaError_t uniqueKeys(const uint64_t* keys, int64_t n, const float* grads, int64_t dim,
                       uint64_t* uniqueKeys, float* summedGrads, int64_t* inverse,
                       int64_t* hostUnique, cudaStream_t stream);

// ---- optimizers ----------------------------------------------------------------
struct OptimizerParams {
  int kind;  // 0 SGD, 1 Adagrad, 2 Adam, 3 FTRL (OptimizerKind order)
  float lr, weightDecay, eps, beta1, beta2, ftrlBeta, l1, l2;
  float adamStepScale;  // lr * sqrt(1 - beta2^t) / (1 - beta1^t), computed on the host
  float beta1Power, beta2Power;  // beta1^t, beta2^t
};
cudaError_t applyRowOptimizer(const OptimizerParams& p, float* const* rows, int64_t numRows,
                              int64_t dim, const float* grads, cudaStream_t stream);

// ---- DLRM dot interaction (inputs / dInputs: device arrays of device pointers)
cudaError_t dotInteractionForward(const float* const* inputs, int64_t numInputs, int64_t batch, int64_t dim,
                                  float* out, int64_t outStride, cudaStream_t stream);
cudaError_t dotInteractionBackward(const float* const* inputs, int64_t numInputs, int64_t batch, int64_t dim,
                                   const float* dOut, int64_t dOutStride, float* const* dInputs,
                                   cudaStream_t stream);

// ---- elementwise, losses -------------------------------------------------------
cudaError_t addBias(float* y, const float* bias, int64_t batch, int64_t out, cudaStream_t stream);
cudaError_t columnSums(const float* dy, int64_t batch, int64_t out, float* dbias, bool accumulate,
                       cudaStream_t stream);
cudaError_t reluForward(const float* x, int64_t n, float* y, cudaStream_t stream);
cudaError_t reluBackward(const float* x, const float* dy, int64_t n, float* dx, cudaStream_t stream);
// *hostLoss receives the mean loss (the call synchronises the stream).
cudaError_t sigmoidCrossEntropy(const float* logits, const float* labels, int64_t n,
                                float* dLogits, double* hostLoss, cudaStream_t stream);
cudaError_t softmaxCrossEntropy(const float* logits, const int32_t* labels, int64_t batch,
                                int64_t classes, float* dLogits, double* hostLoss,
                                cudaStream_t stream);

// ---- gradient codecs (kernels/codec.h): the CPU codecs' bytes, bit for bit -----
// `bad` (one value, set to ~0 before) receives the lowest index of a value
// (plus residual) that is not finite, or int8Decode's lowest value -128.
// The decoders' scales are checked on the host before.
cudaError_t castEncode(const float* values, float* residual, int64_t n, bool bf16, uint16_t* dst,
                       unsigned long long* bad, cudaStream_t stream);
cudaError_t castDecode(const uint16_t* src, int64_t n, bool bf16, float* out, bool accumulate,
                       unsigned long long* bad, cudaStream_t stream);
cudaError_t int8Encode(const float* values, float* residual, int64_t n, int64_t chunk, uint32_t draw,
                       float* scales, int8_t* q, unsigned long long* bad, cudaStream_t stream);
cudaError_t int8Decode(const float* scales, const int8_t* q, int64_t n, int64_t chunk, float* out, bool accumulate,
                       unsigned long long* bad, cudaStream_t stream);
cudaError_t oneBitEncode(const float* values, float* residual, int64_t n, int64_t chunk, float* scales,
                         uint8_t* bits, unsigned long long* bad, cudaStream_t stream);
cudaError_t oneBitDecode(const float* scales, const uint8_t* bits, int64_t n, int64_t chunk, float* out,
                         bool accumulate, cudaStream_t stream);
// The indices (ascending) of the k largest |values + residual|, ties to the
// lower index; n < 2^31.
cudaError_t topKIndices(const float* values, const float* residual, int64_t n, int64_t k, uint32_t* idx,
                        unsigned long long* bad, cudaStream_t stream);
// dst[j] = values[idx[j]] + residual[idx[j]]; the residual then holds every
// value but those sent (0 there).
cudaError_t sparseGather(const float* values, float* residual, int64_t n, const uint32_t* idx, int64_t k,
                         float* dst, unsigned long long* bad, cudaStream_t stream);
// out[idx[j]] (+)= vals[j], the rest 0 unless accumulating; idx distinct.
cudaError_t sparseScatter(const uint32_t* idx, const float* vals, int64_t k, int64_t n, float* out, bool accumulate,
                          cudaStream_t stream);
cudaError_t plainEncode(const float* values, float* residual, int64_t n, float* dst, unsigned long long* bad,
                        cudaStream_t stream);
cudaError_t plainDecode(const float* src, int64_t n, float* out, bool accumulate, unsigned long long* bad,
                        cudaStream_t stream);

}  // namespace troupe::kernels::cuda::internal
