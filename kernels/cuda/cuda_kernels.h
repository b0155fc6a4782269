// CudaKernels: the Kernels interface on an NVIDIA GPU (CUDA C++ and cuBLAS).
// Built only when the CUDA toolkit is found (TROUPE_HAVE_CUDA).
//
// Memory: every pointer passed to a method is device memory (cudaMalloc),
// borrowed for the call; the pointer arrays of applyRowOptimizer and of the
// dot interaction are device arrays of device pointers. Results are complete
// when a method returns (each call synchronises its stream), so callers may
// read them at once.
//
// Determinism: no atomics in any sum; reductions run in a fixed order, so the
// same inputs give the same bits on the same GPU. Results may differ from the
// CPU kernels in the last bits (different summation order, fused multiply-add).
//
// Errors: bad indices, offsets and labels are found on the device before any
// out-of-bounds read and reported like the CPU kernels (kInvalidArgument with
// position and value); a CUDA or cuBLAS failure is kInternal naming the call.
#pragma once

#include <memory>

#include "kernels/kernels.h"

namespace troupe::kernels::cuda {

// Throws SetupError when no CUDA device is usable, naming the CUDA error.
std::unique_ptr<Kernels> createCudaKernels(const KernelOptions& options);

// Number of CUDA devices visible, 0 when none or no driver.
int cudaDeviceCount();

}  // namespace troupe::kernels::cuda
