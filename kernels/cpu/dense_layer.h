// CPU fully connected layer on OpenBLAS cblas_sgemm (contract in
// kernels/kernels.h). OpenBLAS runs the GEMMs on its own threads, whose count
// cpu::Kernels sets to the kernel thread count; bias and its gradient are
// plain loops on the calling thread.
#pragma once

#include <cstdint>

#include "common/status.h"

namespace troupe::kernels::cpu {

Status denseForward(const float* x, const float* w, const float* bias, int64_t batch, int64_t in,
                    int64_t out, float* y);

Status denseBackward(const float* x, const float* w, const float* dy, int64_t batch, int64_t in,
                     int64_t out, float* dx, float* dw, float* dbias, bool accumulate);

}  // namespace troupe::kernels::cpu
