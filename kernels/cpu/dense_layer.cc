#include "kernels/cpu/dense_layer.h"

#include <algorithm>
#include <limits>

#include <cblas.h>

#include "common/check.h"

namespace troupe::kernels::cpu {
namespace {

Status checkShape(const char* what, int64_t batch, int64_t in, int64_t out) {
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  if (batch < 0 || in < 0 || out < 0 || batch > kMax || in > kMax || out > kMax) {
    return Status::invalidArgument(
        fmt::format("{}: shape batch {} x in {} x out {} is outside [0, 2^31)", what, batch, in, out));
  }
  return Status::ok();
}

}  // namespace

Status denseForward(const float* x, const float* w, const float* bias, int64_t batch, int64_t in,
                    int64_t out, float* y) {
  if (Status s = checkShape("denseForward", batch, in, out); !s.isOk()) return s;
  if (batch == 0 || out == 0) return Status::ok();
  TROUPE_CHECK(y != nullptr && (in == 0 || (x != nullptr && w != nullptr)), "denseForward: null pointer");
  for (int64_t b = 0; b < batch; ++b) {
    float* __restrict row = y + b * out;
    if (bias != nullptr) {
      std::copy(bias, bias + out, row);
    } else {
      std::fill(row, row + out, 0.0f);
    }
  }
  if (in == 0) return Status::ok();
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(batch), int(out), int(in), 1.0f, x,
              int(in), w, int(in), 1.0f, y, int(out));
  return Status::ok();
}

Status denseBackward(const float* x, const float* w, const float* dy, int64_t batch, int64_t in,
                     int64_t out, float* dx, float* dw, float* dbias, bool accumulate) {
  if (Status s = checkShape("denseBackward", batch, in, out); !s.isOk()) return s;
  TROUPE_CHECK(batch * out == 0 || dy != nullptr, "denseBackward: null dy");
  const float beta = accumulate ? 1.0f : 0.0f;
  if (dx != nullptr && batch > 0 && in > 0) {
    if (out == 0) {
      std::fill(dx, dx + batch * in, 0.0f);
    } else {
      TROUPE_CHECK(w != nullptr, "denseBackward: null w");
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(batch), int(in), int(out), 1.0f,
                  dy, int(out), w, int(in), 0.0f, dx, int(in));
    }
  }
  if (dw != nullptr && out > 0 && in > 0) {
    if (batch == 0) {
      if (!accumulate) std::fill(dw, dw + out * in, 0.0f);
    } else {
      TROUPE_CHECK(x != nullptr, "denseBackward: null x");
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(out), int(in), int(batch), 1.0f, dy,
                  int(out), x, int(in), beta, dw, int(in));
    }
  }
  if (dbias != nullptr && out > 0) {
    if (!accumulate) std::fill(dbias, dbias + out, 0.0f);
    for (int64_t b = 0; b < batch; ++b) {
      const float* __restrict g = dy + b * out;
      float* __restrict db = dbias;
      for (int64_t j = 0; j < out; ++j) db[j] += g[j];
    }
  }
  return Status::ok();
}

}  // namespace troupe::kernels::cpu
