#include "kernels/cpu/interaction.h"

#include <vector>

#include "common/check.h"

namespace troupe::kernels::cpu {
namespace {

Status checkShape(int64_t numInputs, int64_t batch, int64_t dim, int64_t stride, const char* what) {
  if (numInputs < 0 || batch < 0 || dim < 0) {
    return Status::invalidArgument(
        fmt::format("dot interaction: negative size ({} inputs, batch {}, dim {})", numInputs, batch, dim));
  }
  const int64_t pairs = numInputs * (numInputs - 1) / 2;
  if (batch > 0 && stride < pairs) {
    return Status::invalidArgument(fmt::format("dot interaction: {} stride {} < {} pairs", what, stride, pairs));
  }
  return Status::ok();
}

}  // namespace

Status dotInteractionForward(ComputePool& pool, const float* const* inputs, int64_t numInputs, int64_t batch,
                             int64_t dim, float* out, int64_t outStride) {
  Status s = checkShape(numInputs, batch, dim, outStride, "output");
  if (!s.isOk() || batch == 0 || numInputs < 2) return s;
  TROUPE_CHECK(inputs != nullptr && out != nullptr, "dot interaction: null pointer");
  pool.parallelFor(batch, 16, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      float* o = out + b * outStride;
      for (int64_t i = 1; i < numInputs; ++i) {
        const float* __restrict zi = inputs[i] + b * dim;
        for (int64_t j = 0; j < i; ++j) {
          const float* __restrict zj = inputs[j] + b * dim;
          float acc = 0.0f;
          for (int64_t d = 0; d < dim; ++d) acc += zi[d] * zj[d];
          *o++ = acc;
        }
      }
    }
  });
  return Status::ok();
}

Status dotInteractionBackward(ComputePool& pool, const float* const* inputs, int64_t numInputs, int64_t batch,
                              int64_t dim, const float* dOut, int64_t dOutStride, float* const* dInputs) {
  Status s = checkShape(numInputs, batch, dim, dOutStride, "gradient");
  if (!s.isOk() || batch == 0) return s;
  TROUPE_CHECK(inputs != nullptr && dInputs != nullptr, "dot interaction: null pointer");
  pool.parallelFor(batch, 16, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      for (int64_t i = 0; i < numInputs; ++i) {
        float* g = dInputs[i] + b * dim;
        for (int64_t d = 0; d < dim; ++d) g[d] = 0.0f;
      }
      const float* go = dOut + b * dOutStride;
      for (int64_t i = 1; i < numInputs; ++i) {
        const float* __restrict zi = inputs[i] + b * dim;
        float* __restrict gi = dInputs[i] + b * dim;
        for (int64_t j = 0; j < i; ++j) {
          const float* __restrict zj = inputs[j] + b * dim;
          float* __restrict gj = dInputs[j] + b * dim;
          const float g = *go++;
          for (int64_t d = 0; d < dim; ++d) {
            gi[d] += g * zj[d];
            gj[d] += g * zi[d];
          }
        }
      }
    }
  });
  return Status::ok();
}

}  // namespace troupe::kernels::cpu
