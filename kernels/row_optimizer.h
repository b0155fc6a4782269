// Row optimizers: the update rules the parameter server applies to embedding
// rows and dense parameter slices (DESIGN.md, Parameter server).
//
// Memory layout of one row: a contiguous block of (1 + stateSlots) * dim
// floats, [weights(dim) | state slot 0 (dim) | state slot 1 (dim)]. Rows may be
// scattered (hash-table slots), so the kernel takes an array of row pointers. A
// dense parameter buffer of P floats is one row of dim P.
#pragma once

#include <cstdint>

namespace troupe::kernels {

enum class OptimizerKind {
  kSgd,      // w -= lr * (g + weightDecay * w)                                 state: none
  kAdagrad,  // a += g^2; w -= lr * g / (sqrt(a) + eps)                         state: a
  kAdam,     // lazy / sparse Adam (TF LazyAdam, torch SparseAdam)              state: m, v
  kFtrl,     // FTRL-Proximal, McMahan et al. 2013                              state: z, n
};

// Hyperparameters of one update. Plain data: the caller changes `step` between
// calls (Adam's bias correction uses this global step, not a per-row count).
struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::kSgd;
  float learningRate = 0.01f;  // SGD, Adagrad, Adam; FTRL's alpha
  // SGD: L2 term added to the gradient. Adam: decoupled (AdamW) decay,
  // w -= lr * weightDecay * w before the Adam step. Ignored by Adagrad and FTRL.
  float weightDecay = 0.0f;
  float eps = 1e-8f;                // Adagrad, Adam
  float initialAccumulator = 0.1f;  // Adagrad: value initRowState writes
  float beta1 = 0.9f;               // Adam
  float beta2 = 0.999f;             // Adam
  int64_t step = 1;                 // Adam: global step t >= 1 of this update
  float ftrlBeta = 1.0f;            // FTRL beta
  float l1 = 0.0f;                  // FTRL lambda1
  float l2 = 0.0f;                  // FTRL lambda2
};

// Floats of optimizer state per weight: 0 (SGD), 1 (Adagrad), 2 (Adam, FTRL).
int optimizerStateSlots(OptimizerKind kind);

// Floats per row block: (1 + optimizerStateSlots(kind)) * dim.
inline int64_t optimizerRowFloats(OptimizerKind kind, int64_t dim) {
  return (1 + optimizerStateSlots(kind)) * dim;
}

// Writes the initial optimizer state of one row block (weights untouched):
// Adagrad's accumulator = initialAccumulator, everything else 0.
void initRowState(const OptimizerConfig& config, float* row, int64_t dim);

}  // namespace troupe::kernels
