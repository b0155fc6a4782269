// CPU fully connected layer on OpenBLAS cblas_sgemm (contract in
// kernels/kernels.h). The GEMMs are split into row blocks over the kernels'
// compute pool, each block one single-threaded sgemm (cpu::Kernels keeps
// OpenBLAS at one thread): idle threads then sleep in the pool instead of
// spinning in OpenBLAS's thread server, which on a small machine steals the
// cores the rest of a training step needs. Splits never cut the reduction
// dimension, so every output element is one sgemm's sum.
#pragma once

#include <cstdint>

#include "common/compute_pool.h"
#include "common/status.h"

namespace troupe::kernels::cpu {

Status denseForward(ComputePool& pool, const float* x, const float* w, const float* bias, int64_t batch, int64_t in,
                    int64_t out, float* y);

Status denseBackward(ComputePool& pool, const float* x, const float* w, const float* dy, int64_t batch, int64_t in,
                     int64_t out, float* dx, float* dw, float* dbias, bool accumulate);

}  // namespace troupe::kernels::cpu
