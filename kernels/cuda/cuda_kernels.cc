#include "kernels/cuda/cuda_kernels.h"

#include <cmath>
#include <mutex>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "common/check.h"
#include "kernels/cuda/internal/launchers.h"

namespace troupe::kernels::cuda {
namespace {

namespace in = internal;
constexpr unsigned long long kNone = ~0ull;

Status cudaStatus(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::ok();
  return Status::internal(fmt::format("CUDA {}: {}", what, cudaGetErrorString(e)));
}

Status cublasStatus(cublasStatus_t e, const char* what) {
  if (e == CUBLAS_STATUS_SUCCESS) return Status::ok();
  return Status::internal(fmt::format("cuBLAS {}: status {}", what, static_cast<int>(e)));
}

#define TROUPE_RETURN_IF_ERROR(expr)  \
  do {                                \
    Status troupe_s_ = (expr);        \
    if (!troupe_s_.isOk()) return troupe_s_; \
  } while (0)

class CudaKernels final : public Kernels {
 public:
  CudaKernels(int threads, cudaStream_t stream, cublasHandle_t blas, unsigned long long* bad)
      : threads_(threads), stream_(stream), blas_(blas), bad_(bad) {}

  ~CudaKernels() override {
    cudaFree(bad_);
    cublasDestroy(blas_);
    cudaStreamDestroy(stream_);
  }

  Device device() const override { return Device::kCuda; }
  int threads() const override { return threads_; }

  Status embeddingBagForward(const float* rows, int64_t numRows, int64_t dim, const EmbeddingBags& bags,
                             float* out) override {
    std::lock_guard lock(mu_);
    TROUPE_RETURN_IF_ERROR(validateBags(bags, numRows));
    const bool i64 = bags.indices.type == BagIndices::Type::kInt64;
    TROUPE_RETURN_IF_ERROR(cudaStatus(in::embeddingBagForward(rows, dim, bags.indices.data, i64, bags.offsets,
                                                              bags.batch, bags.weights,
                                                              bags.pooling == Pooling::kMean, out, stream_),
                                      "embedding-bag forward"));
    return sync("embedding-bag forward");
  }

  Status embeddingBagBackward(const float* gradOut, int64_t dim, const EmbeddingBags& bags, float* gradRows,
                              int64_t numRows) override {
    std::lock_guard lock(mu_);
    TROUPE_RETURN_IF_ERROR(validateBags(bags, numRows));
    const bool i64 = bags.indices.type == BagIndices::Type::kInt64;
    TROUPE_RETURN_IF_ERROR(cudaStatus(
        in::embeddingBagBackward(gradOut, dim, bags.indices.data, i64, bags.indices.size, bags.offsets,
                                 bags.batch, bags.weights, bags.pooling == Pooling::kMean, gradRows, stream_),
        "embedding-bag backward"));
    return sync("embedding-bag backward");
  }

  Expected<int64_t> uniqueKeys(const uint64_t* keys, int64_t n, uint64_t* unique, int64_t* inverse) override {
    return dedup(keys, nullptr, n, 0, unique, nullptr, inverse);
  }

  Expected<int64_t> dedupGradients(const uint64_t* keys, const float* grads, int64_t n, int64_t dim,
                                   uint64_t* unique, float* summedGrads, int64_t* inverse) override {
    return dedup(keys, grads, n, dim, unique, summedGrads, inverse);
  }

  Status applyRowOptimizer(const OptimizerConfig& c, float* const* rows, int64_t numRows, int64_t dim,
                           const float* grads) override {
    if (numRows < 0 || dim < 0) {
      return Status::invalidArgument(fmt::format("row optimizer: negative size ({} rows, dim {})", numRows, dim));
    }
    if (c.kind == OptimizerKind::kAdam && c.step < 1) {
      return Status::invalidArgument(fmt::format("row optimizer: Adam step {} < 1", c.step));
    }
    if (c.kind == OptimizerKind::kFtrl && !(c.learningRate > 0.0f)) {
      return Status::invalidArgument(fmt::format("row optimizer: FTRL alpha {} <= 0", c.learningRate));
    }
    in::OptimizerParams p{};
    p.kind = static_cast<int>(c.kind);
    p.lr = c.learningRate;
    p.weightDecay = c.weightDecay;
    p.eps = c.eps;
    p.beta1 = c.beta1;
    p.beta2 = c.beta2;
    p.ftrlBeta = c.ftrlBeta;
    p.l1 = c.l1;
    p.l2 = c.l2;
    const double t = double(c.step);
    p.beta1Power = float(std::pow(double(c.beta1), t));
    p.beta2Power = float(std::pow(double(c.beta2), t));
    p.adamStepScale = float(double(c.learningRate) * std::sqrt(1.0 - std::pow(double(c.beta2), t)) /
                            (1.0 - std::pow(double(c.beta1), t)));
    std::lock_guard lock(mu_);
    TROUPE_RETURN_IF_ERROR(
        cudaStatus(in::applyRowOptimizer(p, rows, numRows, dim, grads, stream_), "row optimizer"));
    return sync("row optimizer");
  }

  Status denseForward(const float* x, const float* w, const float* bias, int64_t batch, int64_t inDim,
                      int64_t outDim, float* y) override {
    std::lock_guard lock(mu_);
    if (batch == 0 || outDim == 0) return Status::ok();
    const float one = 1.0f, zero = 0.0f;
    // Row-major y = x w^T is column-major y^T = w x^T.
    TROUPE_RETURN_IF_ERROR(cublasStatus(cublasSgemm(blas_, CUBLAS_OP_T, CUBLAS_OP_N, int(outDim), int(batch),
                                                    int(inDim), &one, w, int(inDim), x, int(inDim), &zero, y,
                                                    int(outDim)),
                                        "sgemm (dense forward)"));
    if (bias != nullptr) {
      TROUPE_RETURN_IF_ERROR(cudaStatus(in::addBias(y, bias, batch, outDim, stream_), "bias"));
    }
    return sync("dense forward");
  }

  Status denseBackward(const float* x, const float* w, const float* dy, int64_t batch, int64_t inDim,
                       int64_t outDim, float* dx, float* dw, float* dbias, bool accumulate) override {
    std::lock_guard lock(mu_);
    const float one = 1.0f, zero = 0.0f, beta = accumulate ? 1.0f : 0.0f;
    if (dx != nullptr && batch > 0 && inDim > 0) {
      if (outDim == 0) {
        TROUPE_RETURN_IF_ERROR(cudaStatus(cudaMemsetAsync(dx, 0, batch * inDim * sizeof(float), stream_), "memset"));
      } else {
        TROUPE_RETURN_IF_ERROR(cublasStatus(cublasSgemm(blas_, CUBLAS_OP_N, CUBLAS_OP_N, int(inDim), int(batch),
                                                        int(outDim), &one, w, int(inDim), dy, int(outDim), &zero,
                                                        dx, int(inDim)),
                                            "sgemm (dense dx)"));
      }
    }
    if (dw != nullptr && outDim > 0 && inDim > 0) {
      if (batch == 0) {
        if (!accumulate) {
          TROUPE_RETURN_IF_ERROR(
              cudaStatus(cudaMemsetAsync(dw, 0, outDim * inDim * sizeof(float), stream_), "memset"));
        }
      } else {
        TROUPE_RETURN_IF_ERROR(cublasStatus(cublasSgemm(blas_, CUBLAS_OP_N, CUBLAS_OP_T, int(inDim), int(outDim),
                                                        int(batch), &one, x, int(inDim), dy, int(outDim), &beta,
                                                        dw, int(inDim)),
                                            "sgemm (dense dw)"));
      }
    }
    if (dbias != nullptr) {
      TROUPE_RETURN_IF_ERROR(
          cudaStatus(in::columnSums(dy, batch, outDim, dbias, accumulate, stream_), "bias gradient"));
    }
    return sync("dense backward");
  }

  Status dotInteractionForward(const float* const* inputs, int64_t numInputs, int64_t batch, int64_t dim,
                               float* out, int64_t outStride) override {
    if (numInputs < 0 || batch < 0 || dim < 0 || (batch > 0 && outStride < numInputs * (numInputs - 1) / 2)) {
      return Status::invalidArgument(fmt::format("dot interaction: bad shape ({} inputs, batch {}, dim {}, stride {})",
                                                 numInputs, batch, dim, outStride));
    }
    std::lock_guard lock(mu_);
    TROUPE_RETURN_IF_ERROR(cudaStatus(
        in::dotInteractionForward(inputs, numInputs, batch, dim, out, outStride, stream_), "dot interaction"));
    return sync("dot interaction");
  }

  Status dotInteractionBackward(const float* const* inputs, int64_t numInputs, int64_t batch, int64_t dim,
                                const float* dOut, int64_t dOutStride, float* const* dInputs) override {
    if (numInputs < 0 || batch < 0 || dim < 0 || (batch > 0 && dOutStride < numInputs * (numInputs - 1) / 2)) {
      return Status::invalidArgument(fmt::format("dot interaction: bad shape ({} inputs, batch {}, dim {}, stride {})",
                                                 numInputs, batch, dim, dOutStride));
    }
    std::lock_guard lock(mu_);
    TROUPE_RETURN_IF_ERROR(cudaStatus(in::dotInteractionBackward(inputs, numInputs, batch, dim, dOut, dOutStride,
                                                                 dInputs, stream_),
                                      "dot interaction backward"));
    return sync("dot interaction backward");
  }

  void reluForward(const float* x, int64_t n, float* y) override {
    std::lock_guard lock(mu_);
    TROUPE_CHECK(in::reluForward(x, n, y, stream_) == cudaSuccess && cudaStreamSynchronize(stream_) == cudaSuccess,
                 "CUDA relu forward failed: {}", cudaGetErrorString(cudaGetLastError()));
  }

  void reluBackward(const float* x, const float* dy, int64_t n, float* dx) override {
    std::lock_guard lock(mu_);
    TROUPE_CHECK(in::reluBackward(x, dy, n, dx, stream_) == cudaSuccess &&
                     cudaStreamSynchronize(stream_) == cudaSuccess,
                 "CUDA relu backward failed: {}", cudaGetErrorString(cudaGetLastError()));
  }

  Expected<double> sigmoidCrossEntropy(const float* logits, const float* labels, int64_t n,
                                       float* dLogits) override {
    std::lock_guard lock(mu_);
    TROUPE_RETURN_IF_ERROR(cudaStatus(in::findBadLabel(labels, n, bad_, stream_), "label check"));
    auto bad = firstBad();
    if (!bad.hasValue()) return bad.status();
    if (*bad >= 0) {
      float value = 0;
      cudaMemcpy(&value, labels + *bad, sizeof value, cudaMemcpyDeviceToHost);
      return Status::invalidArgument(
          fmt::format("sigmoid cross-entropy: label {} at position {} is outside [0, 1]", value, *bad));
    }
    double loss = 0;
    TROUPE_RETURN_IF_ERROR(cudaStatus(in::sigmoidCrossEntropy(logits, labels, n, dLogits, &loss, stream_),
                                      "sigmoid cross-entropy"));
    return loss;
  }

  Expected<double> softmaxCrossEntropy(const float* logits, const int32_t* labels, int64_t batch,
                                       int64_t classes, float* dLogits) override {
    std::lock_guard lock(mu_);
    TROUPE_RETURN_IF_ERROR(cudaStatus(in::findBadClass(labels, batch, classes, bad_, stream_), "label check"));
    auto bad = firstBad();
    if (!bad.hasValue()) return bad.status();
    if (*bad >= 0) {
      int32_t value = 0;
      cudaMemcpy(&value, labels + *bad, sizeof value, cudaMemcpyDeviceToHost);
      return Status::invalidArgument(fmt::format(
          "softmax cross-entropy: label {} at position {} is outside [0, {})", value, *bad, classes));
    }
    double loss = 0;
    TROUPE_RETURN_IF_ERROR(cudaStatus(
        in::softmaxCrossEntropy(logits, labels, batch, classes, dLogits, &loss, stream_), "softmax cross-entropy"));
    return loss;
  }

 private:
  Status sync(const char* what) { return cudaStatus(cudaStreamSynchronize(stream_), what); }

  // The position the last validation kernel flagged, or -1.
  Expected<int64_t> firstBad() {
    unsigned long long host = kNone;
    Status s = cudaStatus(cudaMemcpyAsync(&host, bad_, sizeof host, cudaMemcpyDeviceToHost, stream_), "copy");
    if (s.isOk()) s = sync("validation");
    if (!s.isOk()) return s;
    return host == kNone ? int64_t{-1} : int64_t(host);
  }

  Status validateBags(const EmbeddingBags& bags, int64_t numRows) {
    if (bags.batch < 0 || bags.indices.size < 0) {
      return Status::invalidArgument(
          fmt::format("embedding bags: negative size (batch {}, nnz {})", bags.batch, bags.indices.size));
    }
    if (bags.batch == 0) return Status::ok();
    TROUPE_CHECK(bags.offsets != nullptr, "embedding bags: null offsets with batch {}", bags.batch);
    TROUPE_RETURN_IF_ERROR(cudaStatus(in::findBadOffset(bags.offsets, bags.batch, bags.indices.size, bad_, stream_),
                                      "offset check"));
    auto bad = firstBad();
    if (!bad.hasValue()) return bad.status();
    if (*bad >= 0) {
      int64_t value = 0;
      cudaMemcpy(&value, bags.offsets + *bad, sizeof value, cudaMemcpyDeviceToHost);
      return Status::invalidArgument(fmt::format(
          "embedding bags: offsets[{}] = {} breaks 0 <= offsets[b] <= offsets[b+1] <= nnz {}", *bad, value,
          bags.indices.size));
    }
    const bool i64 = bags.indices.type == BagIndices::Type::kInt64;
    TROUPE_RETURN_IF_ERROR(cudaStatus(
        in::findBadIndex(bags.indices.data, i64, bags.indices.size, numRows, bad_, stream_), "index check"));
    bad = firstBad();
    if (!bad.hasValue()) return bad.status();
    if (*bad >= 0) {
      int64_t value = 0;
      if (i64) {
        cudaMemcpy(&value, static_cast<const int64_t*>(bags.indices.data) + *bad, sizeof value,
                   cudaMemcpyDeviceToHost);
      } else {
        int32_t v32 = 0;
        cudaMemcpy(&v32, static_cast<const int32_t*>(bags.indices.data) + *bad, sizeof v32, cudaMemcpyDeviceToHost);
        value = v32;
      }
      return Status::invalidArgument(
          fmt::format("embedding bags: index {} at position {} is outside [0, {})", value, *bad, numRows));
    }
    return Status::ok();
  }

  Expected<int64_t> dedup(const uint64_t* keys, const float* grads, int64_t n, int64_t dim, uint64_t* unique,
                          float* summed, int64_t* inverse) {
    if (n < 0 || dim < 0) {
      return Status::invalidArgument(fmt::format("key dedup: negative size (n {}, dim {})", n, dim));
    }
    std::lock_guard lock(mu_);
    int64_t count = 0;
    Status s = cudaStatus(in::uniqueKeys(keys, n, grads, dim, unique, summed, inverse, &count, stream_), "dedup");
    if (s.isOk()) s = sync("dedup");
    if (!s.isOk()) return s;
    return count;
  }

  const int threads_;
  std::mutex mu_;
  cudaStream_t stream_;
  cublasHandle_t blas_;
  unsigned long long* bad_;
};

}  // namespace

int cudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

std::unique_ptr<Kernels> createCudaKernels(const KernelOptions& options) {
  int devices = 0;
  cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0) {
    TROUPE_SETUP_ERROR("createKernels: no usable CUDA device ({})",
                       e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
  }
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  unsigned long long* bad = nullptr;
  if ((e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)) != cudaSuccess) {
    TROUPE_SETUP_ERROR("createKernels: cudaStreamCreate failed: {}", cudaGetErrorString(e));
  }
  if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) {
    cudaStreamDestroy(stream);
    TROUPE_SETUP_ERROR("createKernels: cublasCreate failed");
  }
  cublasSetStream(blas, stream);
  cublasSetMathMode(blas, CUBLAS_DEFAULT_MATH);  // full fp32, no TF32
  if ((e = cudaMalloc(reinterpret_cast<void**>(&bad), sizeof *bad)) != cudaSuccess) {
    cublasDestroy(blas);
    cudaStreamDestroy(stream);
    TROUPE_SETUP_ERROR("createKernels: cudaMalloc failed: {}", cudaGetErrorString(e));
  }
  return std::make_unique<CudaKernels>(options.threads, stream, blas, bad);
}

}  // namespace troupe::kernels::cuda
