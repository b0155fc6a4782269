// CPU activations and losses (contract in kernels/kernels.h): ReLU, fused
// sigmoid + binary cross-entropy, softmax cross-entropy. Elementwise work is
// split over the pool; the loss sums are taken over fixed blocks of samples and
// added in block order, so the mean loss does not depend on the thread count.
#pragma once

#include <cstdint>

#include "common/compute_pool.h"
#include "common/status.h"

namespace troupe::kernels::cpu {

void reluForward(ComputePool& pool, const float* x, int64_t n, float* y);
void reluBackward(ComputePool& pool, const float* x, const float* dy, int64_t n, float* dx);

Expected<double> sigmoidCrossEntropy(ComputePool& pool, const float* logits, const float* labels,
                                     int64_t n, float* dLogits);

Expected<double> softmaxCrossEntropy(ComputePool& pool, const float* logits, const int32_t* labels,
                                     int64_t batch, int64_t classes, float* dLogits);

}  // namespace troupe::kernels::cpu
