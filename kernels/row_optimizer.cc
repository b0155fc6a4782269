#include "kernels/row_optimizer.h"

#include <algorithm>

namespace troupe::kernels {

int optimizerStateSlots(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd: return 0;
    case OptimizerKind::kAdagrad: return 1;
    case OptimizerKind::kAdam: return 2;
    case OptimizerKind::kFtrl: return 2;
  }
  return 0;
}

void initRowState(const OptimizerConfig& config, float* row, int64_t dim) {
  float* state = row + dim;
  const int64_t n = optimizerStateSlots(config.kind) * dim;
  const float value = config.kind == OptimizerKind::kAdagrad ? config.initialAccumulator : 0.0f;
  std::fill(state, state + n, value);
}

}  // namespace troupe::kernels
