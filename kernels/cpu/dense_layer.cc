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

// Row blocks of at least kMinRows rows (and at most one per thread), unless the
// whole product is too small to be worth waking a thread for.
constexpr int64_t kMinRows = 16;
constexpr int64_t kMinFlops = 1 << 18;

int64_t blocksFor(const ComputePool& pool, int64_t rows, int64_t flops) {
  if (flops < kMinFlops) return 1;
  return std::max<int64_t>(1, std::min<int64_t>(pool.threads(), rows / kMinRows));
}

// Calls fn(begin, end) on `blocks` contiguous parts of [0, rows).
template <typename Fn>
void forBlocks(ComputePool& pool, int64_t rows, int64_t blocks, const Fn& fn) {
  if (blocks <= 1) {
    fn(int64_t{0}, rows);
    return;
  }
  pool.parallelFor(blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) fn(rows * b / blocks, rows * (b + 1) / blocks);
  });
}

}  // namespace

Status denseForward(ComputePool& pool, const float* x, const float* w, const float* bias, int64_t batch, int64_t in,
                    int64_t out, float* y) {
  if (Status s = checkShape("denseForward", batch, in, out); !s.isOk()) return s;
  if (batch == 0 || out == 0) return Status::ok();
  TROUPE_CHECK(y != nullptr && (in == 0 || (x != nullptr && w != nullptr)), "denseForward: null pointer");
  forBlocks(pool, batch, blocksFor(pool, batch, 2 * batch * in * out), [&](int64_t r0, int64_t r1) {
    for (int64_t b = r0; b < r1; ++b) {
      float* __restrict row = y + b * out;
      if (bias != nullptr) {
        std::copy(bias, bias + out, row);
      } else {
        std::fill(row, row + out, 0.0f);
      }
    }
    if (in == 0 || r1 == r0) return;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(r1 - r0), int(out), int(in), 1.0f, x + r0 * in,
                int(in), w, int(in), 1.0f, y + r0 * out, int(out));
  });
  return Status::ok();
}

Status denseBackward(ComputePool& pool, const float* x, const float* w, const float* dy, int64_t batch, int64_t in,
                     int64_t out, float* dx, float* dw, float* dbias, bool accumulate) {
  if (Status s = checkShape("denseBackward", batch, in, out); !s.isOk()) return s;
  TROUPE_CHECK(batch * out == 0 || dy != nullptr, "denseBackward: null dy");
  const float beta = accumulate ? 1.0f : 0.0f;
  if (dx != nullptr && batch > 0 && in > 0) {
    if (out == 0) {
      std::fill(dx, dx + batch * in, 0.0f);
    } else {
      TROUPE_CHECK(w != nullptr, "denseBackward: null w");
      forBlocks(pool, batch, blocksFor(pool, batch, 2 * batch * in * out), [&](int64_t r0, int64_t r1) {
        if (r1 == r0) return;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(r1 - r0), int(in), int(out), 1.0f,
                    dy + r0 * out, int(out), w, int(in), 0.0f, dx + r0 * in, int(in));
      });
    }
  }
  if (dw != nullptr && out > 0 && in > 0) {
    if (batch == 0) {
      if (!accumulate) std::fill(dw, dw + out * in, 0.0f);
    } else {
      TROUPE_CHECK(x != nullptr, "denseBackward: null x");
      // Blocks of output rows: dw[o0:o1, :] = dy[:, o0:o1]^T x.
      forBlocks(pool, out, blocksFor(pool, out, 2 * batch * in * out), [&](int64_t o0, int64_t o1) {
        if (o1 == o0) return;
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(o1 - o0), int(in), int(batch), 1.0f, dy + o0,
                    int(out), x, int(in), beta, dw + o0 * in, int(in));
      });
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
