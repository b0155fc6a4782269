// Kernels: the compute interface every model and the parameter server use
// (DESIGN.md, Kernels). One interface, one implementation per device: cpu/ now,
// cuda/ later; createKernels picks one from KernelOptions.
//
// Memory: every pointer argument is borrowed from the caller for the duration
// of the call and lives on the kernels' device (host memory for kDevice kCpu).
// Sizes are element counts. Outputs never alias inputs unless a method says so.
//
// Threading: a Kernels object runs each call on its own compute threads
// (options.threads, the caller included) and returns when the result is
// complete. Calls from several threads on one object are safe. The CPU
// implementation runs OpenBLAS single-threaded (a process-wide setting) and
// splits GEMMs over its own threads; its calls take turns only for those
// threads (a call that uses none, such as uniqueKeys, runs beside another
// thread's call, and forEachIndependent runs pieces of work side by side).
//
// Errors: inputs that can be wrong at run time (indices, offsets, labels,
// sizes) are validated before anything is read out of bounds and reported as
// Status kInvalidArgument naming the bad position and value; output contents are
// then unspecified. Null pointers with non-zero sizes are a broken invariant
// (TROUPE_CHECK aborts).
//
// Determinism: for the same inputs every method returns bit-identical results
// whatever the thread count, except the dense layer, whose GEMMs are split
// into row blocks by thread count (same inputs and thread count, same bits).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "common/status.h"
#include "kernels/embedding_bag.h"
#include "kernels/row_optimizer.h"

namespace troupe::kernels {

enum class Device { kCpu, kCuda };

struct KernelOptions {
  Device device = Device::kCpu;
  int threads = 0;  // 0: ComputePool::hardwareThreads()
};

class Kernels {
 public:
  virtual ~Kernels() = default;
  Kernels(const Kernels&) = delete;
  Kernels& operator=(const Kernels&) = delete;

  virtual Device device() const = 0;
  virtual int threads() const = 0;

  // Runs fn(i) once for every i in [0, count), in any order and on any of
  // this object's compute threads (the caller's included): independent
  // pieces of work, such as a model's tables, that make their own kernel
  // calls ON THIS OBJECT (they then run on the thread that runs the piece,
  // so a few large pieces use fewer threads than the same calls made one
  // after the other; a call on another Kernels object from a piece can
  // deadlock). The pieces must touch disjoint data; fn must not throw.
  // Returns when every piece is done. The default runs them in order on the
  // calling thread.
  virtual void forEachIndependent(int64_t count, const std::function<void(int64_t)>& fn);

  // ---- embedding bags -------------------------------------------------------
  // out[b, :] = pool(rows[indices[i], :] * weights[i] for i in bag b);
  // rows [numRows x dim], out [bags.batch x dim] (overwritten). Fails with
  // kInvalidArgument on a bad offset or an index outside [0, numRows).
  virtual Status embeddingBagForward(const float* rows, int64_t numRows, int64_t dim,
                                     const EmbeddingBags& bags, float* out) = 0;

  // The gradient of embeddingBagForward with respect to rows, ADDED to
  // gradRows [numRows x dim] (zero it first for a plain gradient). gradOut is
  // [bags.batch x dim]. Duplicate indices accumulate; the sum for each row runs
  // in index order, so the result does not depend on the thread count.
  virtual Status embeddingBagBackward(const float* gradOut, int64_t dim,
                                      const EmbeddingBags& bags, float* gradRows,
                                      int64_t numRows) = 0;

  // ---- sparse keys -----------------------------------------------------------
  // Unique keys of keys[0..n) in first-seen order into uniqueKeys (room for n)
  // and inverse[i] = position of keys[i] in uniqueKeys. Returns the number of
  // unique keys. Hashing is sequential; n must be < 2^31.
  virtual Expected<int64_t> uniqueKeys(const uint64_t* keys, int64_t n, uint64_t* uniqueKeys,
                                       int64_t* inverse) = 0;

  // uniqueKeys plus the gradients of equal keys summed: summedGrads (room for
  // n x dim) row u = sum of grads[i] over i with inverse[i] == u, added in
  // increasing i. Returns the number of unique keys.
  virtual Expected<int64_t> dedupGradients(const uint64_t* keys, const float* grads, int64_t n,
                                           int64_t dim, uint64_t* uniqueKeys,
                                           float* summedGrads, int64_t* inverse) = 0;

  // ---- optimizers ------------------------------------------------------------
  // Applies one update in place to each row block rows[r] (layout in
  // row_optimizer.h) with gradient grads[r * dim .. (r + 1) * dim). Row
  // pointers must be distinct. A single row (a dense buffer) is split over
  // threads by coordinate.
  virtual Status applyRowOptimizer(const OptimizerConfig& config, float* const* rows,
                                   int64_t numRows, int64_t dim, const float* grads) = 0;

  // ---- dense layer (row-major) -------------------------------------------------
  // y [batch x out] = x [batch x in] * w[out x in]^T + bias[out] (bias may be null).
  virtual Status denseForward(const float* x, const float* w, const float* bias, int64_t batch,
                              int64_t in, int64_t out, float* y) = 0;

  // From dy [batch x out]: dx [batch x in] = dy * w (always overwritten; null
  // to skip), dw [out x in] = dy^T * x and dbias [out] = column sums of dy
  // (null to skip). dw and dbias are overwritten, or added to when accumulate
  // is true (gradient accumulation over micro-batches).
  virtual Status denseBackward(const float* x, const float* w, const float* dy, int64_t batch,
                               int64_t in, int64_t out, float* dx, float* dw, float* dbias,
                               bool accumulate) = 0;

  // ---- DLRM dot interaction --------------------------------------------------
  // For each sample b, the dot products of every pair of the numInputs vectors
  // inputs[i][b, :] (each input [batch x dim]): out[b * outStride + p] for the
  // pairs p = (1,0), (2,0), (2,1), (3,0), ... (i > j, i-major). outStride >=
  // numInputs * (numInputs - 1) / 2, so the pairs can land inside a wider row.
  virtual Status dotInteractionForward(const float* const* inputs, int64_t numInputs, int64_t batch,
                                       int64_t dim, float* out, int64_t outStride) = 0;
  // The gradient of dotInteractionForward: dInputs[i] [batch x dim] (numInputs
  // pointers, overwritten) from dOut laid out like out.
  virtual Status dotInteractionBackward(const float* const* inputs, int64_t numInputs, int64_t batch,
                                        int64_t dim, const float* dOut, int64_t dOutStride,
                                        float* const* dInputs) = 0;

  // ---- activations and losses --------------------------------------------------
  // y = max(x, 0). y may equal x (in place).
  virtual void reluForward(const float* x, int64_t n, float* y) = 0;
  // dx = x > 0 ? dy : 0, with x the forward input (or output). dx may equal dy.
  virtual void reluBackward(const float* x, const float* dy, int64_t n, float* dx) = 0;

  // Sigmoid + binary cross-entropy on logits, stable for any |logit|:
  // loss_i = max(z,0) - z*y + log1p(exp(-|z|)). Labels in [0, 1]. Writes
  // dLogits[i] = (sigmoid(z_i) - y_i) / n (may be null) and returns the mean
  // loss (0 for n == 0). Fails on a label outside [0, 1].
  virtual Expected<double> sigmoidCrossEntropy(const float* logits, const float* labels,
                                               int64_t n, float* dLogits) = 0;

  // Softmax cross-entropy, logits [batch x classes], labels in [0, classes).
  // Writes dLogits = (softmax - onehot) / batch (may be null) and returns the
  // mean loss (0 for batch == 0). Fails, before writing, on a bad label.
  virtual Expected<double> softmaxCrossEntropy(const float* logits, const int32_t* labels,
                                               int64_t batch, int64_t classes,
                                               float* dLogits) = 0;

 protected:
  Kernels() = default;
};

// Builds the kernels for options.device. Throws SetupError for a device this
// build lacks (kCuda without CUDA) or a negative thread count.
std::unique_ptr<Kernels> createKernels(const KernelOptions& options = {});

}  // namespace troupe::kernels
