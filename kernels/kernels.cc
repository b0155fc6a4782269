#include "kernels/kernels.h"

#include "common/check.h"
#include "common/compute_pool.h"
#include "kernels/cpu/kernels.h"
#include "troupe/config.h"
#if TROUPE_HAVE_CUDA
#include "kernels/cuda/cuda_kernels.h"
#endif

namespace troupe::kernels {

void Kernels::forEachIndependent(int64_t count, const std::function<void(int64_t)>& fn) {
  for (int64_t i = 0; i < count; ++i) fn(i);
}

std::unique_ptr<Kernels> createKernels(const KernelOptions& options) {
  if (options.threads < 0) TROUPE_SETUP_ERROR("KernelOptions.threads must be >= 0, got {}", options.threads);
  const int threads = options.threads == 0 ? ComputePool::hardwareThreads() : options.threads;
  switch (options.device) {
    case Device::kCpu: return std::make_unique<cpu::Kernels>(threads);
    case Device::kCuda:
#if TROUPE_HAVE_CUDA
      return cuda::createCudaKernels(options);
#else
      TROUPE_SETUP_ERROR("createKernels: Device::kCuda is not available in this build (configured without CUDA)");
#endif
  }
  TROUPE_SETUP_ERROR("createKernels: unknown device {}", static_cast<int>(options.device));
}

}  // namespace troupe::kernels
