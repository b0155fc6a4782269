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

Kernels::ScratchLease::ScratchLease(Kernels* owner) : owner_(owner) {
  {
    std::lock_guard lock(owner_->scratchMu_);
    if (!owner_->idleScratch_.empty()) {
      scratch_ = std::move(owner_->idleScratch_.back());
      owner_->idleScratch_.pop_back();
    }
  }
  if (!scratch_) scratch_ = std::make_unique<Scratch>();
}

Kernels::ScratchLease::~ScratchLease() {
  std::lock_guard lock(owner_->scratchMu_);
  owner_->idleScratch_.push_back(std::move(scratch_));
}

void Kernels::forEachIndependent(int64_t count, const std::function<void(int64_t)>& fn) {
  pool_.parallelFor(count, 1, [&fn](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) fn(i);
  });
}

Status Kernels::embeddingBagForward(const float* rows, int64_t numRows, int64_t dim,
                                    const EmbeddingBags& bags, float* out) {
  return cpu::embeddingBagForward(pool_, rows, numRows, dim, bags, out);
}

Status Kernels::embeddingBagBackward(const float* gradOut, int64_t dim, const EmbeddingBags& bags,
                                     float* gradRows, int64_t numRows) {
  ScratchLease scratch(this);
  return cpu::embeddingBagBackward(pool_, gradOut, dim, bags, gradRows, numRows, scratch->bags);
}

Expected<int64_t> Kernels::uniqueKeys(const uint64_t* keys, int64_t n, uint64_t* uniqueKeys,
                                      int64_t* inverse) {
  ScratchLease scratch(this);
  return scratch->dedup.uniqueKeys(keys, n, uniqueKeys, inverse);
}

Expected<int64_t> Kernels::dedupGradients(const uint64_t* keys, const float* grads, int64_t n,
                                          int64_t dim, uint64_t* uniqueKeys, float* summedGrads,
                                          int64_t* inverse) {
  ScratchLease scratch(this);
  return scratch->dedup.dedupGradients(pool_, keys, grads, n, dim, uniqueKeys, summedGrads, inverse);
}

Status Kernels::applyRowOptimizer(const OptimizerConfig& config, float* const* rows,
                                  int64_t numRows, int64_t dim, const float* grads) {
  return cpu::applyRowOptimizer(pool_, config, rows, numRows, dim, grads);
}

Status Kernels::denseForward(const float* x, const float* w, const float* bias, int64_t batch,
                             int64_t in, int64_t out, float* y) {
  return cpu::denseForward(pool_, x, w, bias, batch, in, out, y);
}

Status Kernels::denseBackward(const float* x, const float* w, const float* dy, int64_t batch,
                              int64_t in, int64_t out, float* dx, float* dw, float* dbias,
                              bool accumulate) {
  return cpu::denseBackward(pool_, x, w, dy, batch, in, out, dx, dw, dbias, accumulate);
}

void Kernels::reluForward(const float* x, int64_t n, float* y) {
  cpu::reluForward(pool_, x, n, y);
}

void Kernels::reluBackward(const float* x, const float* dy, int64_t n, float* dx) {
  cpu::reluBackward(pool_, x, dy, n, dx);
}

Expected<double> Kernels::sigmoidCrossEntropy(const float* logits, const float* labels, int64_t n,
                                              float* dLogits) {
  return cpu::sigmoidCrossEntropy(pool_, logits, labels, n, dLogits);
}

Expected<double> Kernels::softmaxCrossEntropy(const float* logits, const int32_t* labels,
                                              int64_t batch, int64_t classes, float* dLogits) {
  return cpu::softmaxCrossEntropy(pool_, logits, labels, batch, classes, dLogits);
}

Status Kernels::dotInteractionForward(const float* const* inputs, int64_t numInputs, int64_t batch,
                                      int64_t dim, float* out, int64_t outStride) {
  return cpu::dotInteractionForward(pool_, inputs, numInputs, batch, dim, out, outStride);
}

Status Kernels::dotInteractionBackward(const float* const* inputs, int64_t numInputs, int64_t batch,
                                       int64_t dim, const float* dOut, int64_t dOutStride,
                                       float* const* dInputs) {
  return cpu::dotInteractionBackward(pool_, inputs, numInputs, batch, dim, dOut, dOutStride, dInputs);
}

}  // namespace troupe::kernels::cpu
