// CPU dot interaction of DLRM (Kernels::dotInteractionForward / Backward).
#pragma once

#include <cstdint>

#include "common/compute_pool.h"
#include "common/status.h"

namespace troupe::kernels::cpu {

Status dotInteractionForward(ComputePool& pool, const float* const* inputs, int64_t numInputs, int64_t batch,
                             int64_t dim, float* out, int64_t outStride);

Status dotInteractionBackward(ComputePool& pool, const float* const* inputs, int64_t numInputs, int64_t batch,
                              int64_t dim, const float* dOut, int64_t dOutStride, float* const* dInputs);

}  // namespace troupe::kernels::cpu
