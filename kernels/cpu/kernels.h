// cpu::Kernels: the CPU implementation of troupe::kernels::Kernels. Owns a
// ComputePool of `threads` threads (the caller counts as one); sets OpenBLAS's
// process-wide thread count to 1 on construction (the dense layer splits GEMMs
// over the pool). One object may be shared by several threads: calls that
// split their work over the pool take turns for it (ComputePool::parallelFor
// runs one call at a time), the others run side by side; each call in flight
// borrows its own scratch (bag backward, dedup) from the object, which keeps
// as many as were ever in use at once. A call made from inside the pool's
// work (forEachIndependent's pieces) runs on that thread alone.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "common/compute_pool.h"
#include "kernels/cpu/embedding_bag.h"
#include "kernels/cpu/key_dedup.h"
#include "kernels/kernels.h"

namespace troupe::kernels::cpu {

class Kernels final : public troupe::kernels::Kernels {
 public:
  explicit Kernels(int threads);

  Device device() const override { return Device::kCpu; }
  int threads() const override { return pool_.threads(); }
  void forEachIndependent(int64_t count, const std::function<void(int64_t)>& fn) override;

  Status embeddingBagForward(const float* rows, int64_t numRows, int64_t dim,
                             const EmbeddingBags& bags, float* out) override;
  Status embeddingBagBackward(const float* gradOut, int64_t dim, const EmbeddingBags& bags,
                              float* gradRows, int64_t numRows) override;
  Expected<int64_t> uniqueKeys(const uint64_t* keys, int64_t n, uint64_t* uniqueKeys,
                               int64_t* inverse) override;
  Expected<int64_t> dedupGradients(const uint64_t* keys, const float* grads, int64_t n, int64_t dim,
                                   uint64_t* uniqueKeys, float* summedGrads,
                                   int64_t* inverse) override;
  Status applyRowOptimizer(const OptimizerConfig& config, float* const* rows, int64_t numRows,
                           int64_t dim, const float* grads) override;
  Status denseForward(const float* x, const float* w, const float* bias, int64_t batch, int64_t in,
                      int64_t out, float* y) override;
  Status denseBackward(const float* x, const float* w, const float* dy, int64_t batch, int64_t in,
                       int64_t out, float* dx, float* dw, float* dbias, bool accumulate) override;
  void reluForward(const float* x, int64_t n, float* y) override;
  void reluBackward(const float* x, const float* dy, int64_t n, float* dx) override;
  Status dotInteractionForward(const float* const* inputs, int64_t numInputs, int64_t batch, int64_t dim,
                               float* out, int64_t outStride) override;
  Status dotInteractionBackward(const float* const* inputs, int64_t numInputs, int64_t batch, int64_t dim,
                                const float* dOut, int64_t dOutStride, float* const* dInputs) override;
  Expected<double> sigmoidCrossEntropy(const float* logits, const float* labels, int64_t n,
                                       float* dLogits) override;
  Expected<double> softmaxCrossEntropy(const float* logits, const int32_t* labels, int64_t batch,
                                       int64_t classes, float* dLogits) override;

 private:
  struct Scratch {
    EmbeddingBagScratch bags;
    KeyDedup dedup;
  };
  // A scratch for the duration of one call, back to the object after it.
  class ScratchLease {
   public:
    explicit ScratchLease(Kernels* owner);
    ~ScratchLease();
    ScratchLease(const ScratchLease&) = delete;
    ScratchLease& operator=(const ScratchLease&) = delete;
    Scratch* operator->() const { return scratch_.get(); }

   private:
    Kernels* owner_;
    std::unique_ptr<Scratch> scratch_;
  };

  ComputePool pool_;
  std::mutex scratchMu_;
  std::vector<std::unique_ptr<Scratch>> idleScratch_;  // guarded by scratchMu_
};

}  // namespace troupe::kernels::cpu
