#include "kernels/cpu/row_optimizer.h"

#include <cmath>

#include "common/check.h"
#include "kernels/cpu/prefetch.h"

namespace troupe::kernels::cpu {
namespace {

// Hyperparameters folded into the constants the inner loops use.
struct Coeffs {
  float lr, weightDecay, eps;
  float beta1, beta2, oneMinusBeta1, oneMinusBeta2, adamStep, adamDecay;
  float ftrlBeta, l1, l2;
};

Coeffs coeffsOf(const OptimizerConfig& c) {
  Coeffs k{};
  k.lr = c.learningRate;
  k.weightDecay = c.weightDecay;
  k.eps = c.eps;
  k.beta1 = c.beta1;
  k.beta2 = c.beta2;
  k.oneMinusBeta1 = 1.0f - c.beta1;
  k.oneMinusBeta2 = 1.0f - c.beta2;
  const double t = double(c.step);
  const double correction1 = 1.0 - std::pow(double(c.beta1), t);
  const double correction2 = 1.0 - std::pow(double(c.beta2), t);
  k.adamStep = float(double(c.learningRate) * std::sqrt(correction2) / correction1);
  k.adamDecay = 1.0f - c.learningRate * c.weightDecay;
  k.ftrlBeta = c.ftrlBeta;
  k.l1 = c.l1;
  k.l2 = c.l2;
  return k;
}

// Updates coordinates [0, n) of one row: w weights, s0/s1 state slots.
template <OptimizerKind kKind>
void updateSpan(const Coeffs& k, float* __restrict w, float* __restrict s0, float* __restrict s1,
                const float* __restrict g, int64_t n) {
  if constexpr (kKind == OptimizerKind::kSgd) {
    for (int64_t i = 0; i < n; ++i) w[i] -= k.lr * (g[i] + k.weightDecay * w[i]);
  } else if constexpr (kKind == OptimizerKind::kAdagrad) {
    for (int64_t i = 0; i < n; ++i) {
      const float a = s0[i] + g[i] * g[i];
      s0[i] = a;
      w[i] -= k.lr * g[i] / (std::sqrt(a) + k.eps);
    }
  } else if constexpr (kKind == OptimizerKind::kAdam) {
    for (int64_t i = 0; i < n; ++i) {
      const float m = k.beta1 * s0[i] + k.oneMinusBeta1 * g[i];
      const float v = k.beta2 * s1[i] + k.oneMinusBeta2 * g[i] * g[i];
      s0[i] = m;
      s1[i] = v;
      w[i] = w[i] * k.adamDecay - k.adamStep * m / (std::sqrt(v) + k.eps);
    }
  } else {  // FTRL-Proximal: s0 = z, s1 = n; alpha = lr
    const float invAlpha = 1.0f / k.lr;
    for (int64_t i = 0; i < n; ++i) {
      const float nOld = s1[i];
      const float nNew = nOld + g[i] * g[i];
      const float sqrtNew = std::sqrt(nNew);
      const float sigma = (sqrtNew - std::sqrt(nOld)) * invAlpha;
      const float z = s0[i] + g[i] - sigma * w[i];
      s0[i] = z;
      s1[i] = nNew;
      const float shrunk = z > k.l1 ? z - k.l1 : (z < -k.l1 ? z + k.l1 : 0.0f);
      w[i] = -shrunk / ((k.ftrlBeta + sqrtNew) * invAlpha + k.l2);
    }
  }
}

template <OptimizerKind kKind>
void applyAll(ComputePool& pool, const Coeffs& k, float* const* rows, int64_t numRows, int64_t dim,
              const float* grads) {
  const int64_t slots = optimizerStateSlots(kKind);
  const int64_t blockBytes = (1 + slots) * dim * int64_t(sizeof(float));
  if (numRows < 4 * int64_t(pool.threads()) && dim >= 4096) {
    // A dense buffer: split each row by coordinate.
    pool.parallelFor(dim, 2048, [&](int64_t c0, int64_t c1) {
      for (int64_t r = 0; r < numRows; ++r) {
        float* w = rows[r];
        float* s0 = slots >= 1 ? w + dim + c0 : nullptr;
        float* s1 = slots >= 2 ? w + 2 * dim + c0 : nullptr;
        updateSpan<kKind>(k, w + c0, s0, s1, grads + r * dim + c0, c1 - c0);
      }
    });
    return;
  }
  const int64_t distance = prefetchDistance(blockBytes);
  pool.parallelFor(numRows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      if (r + distance < r1) prefetchBytes<true>(rows[r + distance], blockBytes);
      float* w = rows[r];
      updateSpan<kKind>(k, w, slots >= 1 ? w + dim : nullptr, slots >= 2 ? w + 2 * dim : nullptr,
                        grads + r * dim, dim);
    }
  });
}

}  // namespace

Status applyRowOptimizer(ComputePool& pool, const OptimizerConfig& config, float* const* rows,
                         int64_t numRows, int64_t dim, const float* grads) {
  if (numRows < 0 || dim < 0) {
    return Status::invalidArgument(fmt::format("row optimizer: negative size ({} rows, dim {})", numRows, dim));
  }
  if (numRows == 0 || dim == 0) return Status::ok();
  if (config.kind == OptimizerKind::kAdam && config.step < 1) {
    return Status::invalidArgument(fmt::format("row optimizer: Adam step {} < 1", config.step));
  }
  if (config.kind == OptimizerKind::kFtrl && !(config.learningRate > 0.0f)) {
    return Status::invalidArgument(fmt::format("row optimizer: FTRL alpha {} <= 0", config.learningRate));
  }
  TROUPE_CHECK(rows != nullptr && grads != nullptr, "row optimizer: null rows or grads");
  const Coeffs k = coeffsOf(config);
  switch (config.kind) {
    case OptimizerKind::kSgd: applyAll<OptimizerKind::kSgd>(pool, k, rows, numRows, dim, grads); break;
    case OptimizerKind::kAdagrad: applyAll<OptimizerKind::kAdagrad>(pool, k, rows, numRows, dim, grads); break;
    case OptimizerKind::kAdam: applyAll<OptimizerKind::kAdam>(pool, k, rows, numRows, dim, grads); break;
    case OptimizerKind::kFtrl: applyAll<OptimizerKind::kFtrl>(pool, k, rows, numRows, dim, grads); break;
  }
  return Status::ok();
}

}  // namespace troupe::kernels::cpu
