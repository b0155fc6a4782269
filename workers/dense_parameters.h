// DenseParameters: every dense weight of a model in one flat buffer, with its
// optimizer state and gradient, so one optimizer call (and later one
// all-reduce per bucket) covers them all.
//
// Layout: block_ = [weights (P) | optimizer state (slots x P)], the row layout
// of kernels/row_optimizer.h with the whole model as one row; grads_ holds P
// floats. Layers take slices by offset (see Mlp).
//
// Threading: one owner.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "kernels/row_optimizer.h"

namespace troupe::kernels {
class Kernels;
}

namespace troupe::workers {

class DenseParameters final {
 public:
  // size: P, the number of weights. Optimizer state starts as initRowState writes it.
  DenseParameters(int64_t size, const kernels::OptimizerConfig& optimizer);

  int64_t size() const { return size_; }
  float* weights() { return block_.data(); }
  const float* weights() const { return block_.data(); }
  float* grads() { return grads_.data(); }
  const float* grads() const { return grads_.data(); }
  // [weights | optimizer state]: the whole state a step changes.
  float* block() { return block_.data(); }
  const float* block() const { return block_.data(); }
  int64_t blockFloats() const { return int64_t(block_.size()); }
  const kernels::OptimizerConfig& optimizer() const { return optimizer_; }
  // Learning rate of later updates (a schedule sets it, e.g. per epoch).
  void setLearningRate(float lr) { optimizer_.learningRate = lr; }

  // One optimizer update with the current grads at global step `step` (>= 1).
  Status apply(kernels::Kernels& kernels, int64_t step);

 private:
  int64_t size_;
  kernels::OptimizerConfig optimizer_;
  std::vector<float> block_;
  std::vector<float> grads_;
};

}  // namespace troupe::workers
