// CPU fused row optimizers (update rules in kernels/row_optimizer.h, contract
// in kernels/kernels.h). One pass over each row block: weights and state are
// read and written once, the gradient read once. Parallel over rows with the
// blocks of upcoming rows prefetched; a single row or a handful of rows (a
// dense buffer) is split over threads by coordinate instead.
#pragma once

#include <cstdint>

#include "common/compute_pool.h"
#include "common/status.h"
#include "kernels/row_optimizer.h"

namespace troupe::kernels::cpu {

Status applyRowOptimizer(ComputePool& pool, const OptimizerConfig& config, float* const* rows,
                         int64_t numRows, int64_t dim, const float* grads);

}  // namespace troupe::kernels::cpu
