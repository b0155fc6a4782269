#include "workers/dense_parameters.h"

#include "common/check.h"
#include "kernels/kernels.h"

namespace troupe::workers {

DenseParameters::DenseParameters(int64_t size, const kernels::OptimizerConfig& optimizer)
    : size_(size),
      optimizer_(optimizer),
      block_(size_t(kernels::optimizerRowFloats(optimizer.kind, size))),
      grads_(size_t(size)) {
  TROUPE_CHECK(size >= 0, "negative parameter count {}", size);
  kernels::initRowState(optimizer_, block_.data(), size_);
}

Status DenseParameters::apply(kernels::Kernels& kernels, int64_t step) {
  if (size_ == 0) return Status::ok();
  kernels::OptimizerConfig c = optimizer_;
  c.step = step;
  float* row = block_.data();
  return kernels.applyRowOptimizer(c, &row, 1, size_, grads_.data());
}

}  // namespace troupe::workers
