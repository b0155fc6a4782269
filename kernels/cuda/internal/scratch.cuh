// Stream-ordered scratch memory for the launchers: allocated with
// cudaMallocAsync on the launch stream and freed on it when the object dies, so
// kernels enqueued before the free still see valid memory.
#pragma once

#include <cstddef>

#include <cuda_runtime_api.h>

namespace troupe::kernels::cuda::internal {

class Scratch {
 public:
  explicit Scratch(cudaStream_t stream) : stream_(stream) {}
  ~Scratch() {
    for (int i = 0; i < count_; ++i) cudaFreeAsync(ptrs_[i], stream_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  // Allocates n objects of T (at least one byte); records the first error.
  template <typename T>
  T* get(size_t n) {
    void* p = nullptr;
    if (count_ == kMax) {
      error_ = cudaErrorMemoryAllocation;
      return nullptr;
    }
    cudaError_t e = cudaMallocAsync(&p, n * sizeof(T) + 1, stream_);
    if (e != cudaSuccess) {
      if (error_ == cudaSuccess) error_ = e;
      return nullptr;
    }
    ptrs_[count_++] = p;
    return static_cast<T*>(p);
  }
  cudaError_t error() const { return error_; }

 private:
  static constexpr int kMax = 24;
  cudaStream_t stream_;
  void* ptrs_[kMax] = {};
  int count_ = 0;
  cudaError_t error_ = cudaSuccess;
};

#define TROUPE_CUDA_TRY(expr)                 \
  do {                                        \
    cudaError_t troupe_e_ = (expr);           \
    if (troupe_e_ != cudaSuccess) return troupe_e_; \
  } while (0)

inline int gridFor(long long n, int threads) {
  long long b = (n + threads - 1) / threads;
  return int(b < 1 ? 1 : (b > 65535 ? 65535 : b));
}

}  // namespace troupe::kernels::cuda::internal
