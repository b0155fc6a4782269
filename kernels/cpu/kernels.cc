#include "kernels/cpu/kernels.h"

#include <cblas.h>

#include "kernels/cpu/dense_layer.h"
#include "kernels/cpu/interaction.h"
#include "kernels/cpu/losses.h"
#include "kernels/cpu/row_optimizer.h"

namespace troupe::kernels::cpu {

// OpenBLAS stays single-threaded: the dense layer splits its GEMMs over pool_
// (see cpu/dense_layer.h).
Kernels::Kernels(int threads) : pool_(threads) { openblas_set_num_threads(1); }

Status Kernels::embeddingBagForward(const float* rows, int64_t numRows, int64_t dim,
                                    const EmbeddingBags& bags, float* out) {
  std::lock_guard lock(mu_);
  return cpu::embeddingBagForward(pool_, rows, numRows, dim, bags, out);
}

Status Kernels::embeddingBagBackward(const float* gradOut, int64_t dim, const EmbeddingBags& bags,
                                     float* gradRows, int64_t numRows) {
  std::lock_guard lock(mu_);
  return cpu::embeddingBagBackward(pool_, gradOut, dim, bags, gradRows, numRows, bagScratch_);
}

Expected<int64_t> Kernels::uniqueKeys(const uint64_t* keys, int64_t n, uint64_t* uniqueKeys,
                                      int64_t* inverse) {
  std::lock_guard lock(mu_);
  return dedup_.uniqueKeys(keys, n, uniqueKeys, inverse);
}

Expected<int64_t> Kernels::dedupGradients(const uint64_t* keys, const float* grads, int64_t n,
                                          int64_t dim, uint64_t* uniqueKeys, float* summedGrads,
                                          int64_t* inverse) {
  std::lock_guard lock(mu_);
  return dedup_.dedupGradients(pool_, keys, grads, n, dim, uniqueKeys, summedGrads, inverse);
}

Status Kernels::applyRowOptimizer(const OptimizerConfig& config, float* const* rows,
                                  int64_t numRows, int64_t dim, const float* grads) {
  std::lock_guard lock(mu_);
  return cpu::applyRowOptimizer(pool_, config, rows, numRows, dim, grads);
}

Status Kernels::denseForward(const float* x, const float* w, const float* bias, int64_t batch,
                             int64_t in, int64_t out, float* y) {
  std::lock_guard lock(mu_);
  return cpu::denseForward(pool_, x, w, bias, batch, in, out, y);
}

Status Kernels::denseBackward(const float* x, const float* w, const float* dy, int64_t batch,
                              int64_t in, int64_t out, float* dx, float* dw, float* dbias,
                              bool accumulate) {
  std::lock_guard lock(mu_);
  return cpu::denseBackward(pool_, x, w, dy, batch, in, out, dx, dw, dbias, accumulate);
}

void Kernels::reluForward(const float* x, int64_t n, float* y) {
  std::lock_guard lock(mu_);
  cpu::reluForward(pool_, x, n, y);
}

void Kernels::reluBackward(const float* x, const float* dy, int64_t n, float* dx) {
  std::lock_guard lock(mu_);
  cpu::reluBackward(pool_, x, dy, n, dx);
}

Expected<double> Kernels::sigmoidCrossEntropy(const float* logits, const float* labels, int64_t n,
                                              float* dLogits) {
  std::lock_guard lock(mu_);
  return cpu::sigmoidCrossEntropy(pool_, logits, labels, n, dLogits);
}

Expected<double> Kernels::softmaxCrossEntropy(const float* logits, const int32_t* labels,
                                              int64_t batch, int64_t classes, float* dLogits) {
  std::lock_guard lock(mu_);
  return cpu::softmaxCrossEntropy(pool_, logits, labels, batch, classes, dLogits);
}

Status Kernels::dotInteractionForward(const float* const* inputs, int64_t numInputs, int64_t batch,
                                      int64_t dim, float* out, int64_t outStride) {
  std::lock_guard lock(mu_);
  return cpu::dotInteractionForward(pool_, inputs, numInputs, batch, dim, out, outStride);
}

Status Kernels::dotInteractionBackward(const float* const* inputs, int64_t numInputs, int64_t batch,
                                       int64_t dim, const float* dOut, int64_t dOutStride,
                                       float* const* dInputs) {
  std::lock_guard lock(mu_);
  return cpu::dotInteractionBackward(pool_, inputs, numInputs, batch, dim, dOut, dOutStride, dInputs);
}

}  // namespace troupe::kernels::cpu
