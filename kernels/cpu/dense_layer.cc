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
  const int64_t flops = 2 * batch * in * out;
  // dx = dy w in blocks of batch rows; dw[o0:o1, :] = dy[:, o0:o1]^T x (and
  // dbias[o0:o1] = the column sums of dy) in blocks of output rows. Both
  // kinds of block go to the pool in one call: one hand-off per layer, and
  // the two products balance each other's blocks.
  const bool gemmDx = dx != nullptr && batch > 0 && in > 0 && out > 0;
  const bool gemmDw = dw != nullptr && out > 0 && in > 0 && batch > 0;
  if (dx != nullptr && batch > 0 && in > 0 && out == 0) std::fill(dx, dx + batch * in, 0.0f);
  if (dw != nullptr && out > 0 && in > 0 && batch == 0 && !accumulate) std::fill(dw, dw + out * in, 0.0f);
  if (gemmDx) TROUPE_CHECK(w != nullptr, "denseBackward: null w");
  if (gemmDw) TROUPE_CHECK(x != nullptr, "denseBackward: null x");
  // Each bias element is summed over the batch in increasing order, as one
  // thread would: the result does not depend on the blocks.
  auto biasColumns = [&](int64_t o0, int64_t o1) {
    if (!accumulate) std::fill(dbias + o0, dbias + o1, 0.0f);
    for (int64_t b = 0; b < batch; ++b) {
      const float* __restrict g = dy + b * out;
      float* __restrict db = dbias;
      for (int64_t j = o0; j < o1; ++j) db[j] += g[j];
    }
  };
  const bool biasInDw = dbias != nullptr && out > 0 && gemmDw;
  const int64_t dxBlocks = gemmDx ? blocksFor(pool, batch, flops) : 0;
  const int64_t dwBlocks = gemmDw ? blocksFor(pool, out, flops) : 0;
  auto dxBlock = [&](int64_t b) {
    const int64_t r0 = batch * b / dxBlocks, r1 = batch * (b + 1) / dxBlocks;
    if (r1 == r0) return;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(r1 - r0), int(in), int(out), 1.0f, dy + r0 * out,
                int(out), w, int(in), 0.0f, dx + r0 * in, int(in));
  };
  auto dwBlock = [&](int64_t b) {
    const int64_t o0 = out * b / dwBlocks, o1 = out * (b + 1) / dwBlocks;
    if (o1 == o0) return;
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(o1 - o0), int(in), int(batch), 1.0f, dy + o0, int(out),
                x, int(in), beta, dw + o0 * in, int(in));
    if (biasInDw) biasColumns(o0, o1);
  };
  auto block = [&](int64_t i) {
    if (i < dxBlocks) {
      dxBlock(i);
    } else {
      dwBlock(i - dxBlocks);
    }
  };
  const int64_t blocks = dxBlocks + dwBlocks;
  if (dxBlocks <= 1 && dwBlocks <= 1) {
    for (int64_t i = 0; i < blocks; ++i) block(i);
  } else {
    pool.parallelFor(blocks, 1, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) block(i);
    });
  }
  if (dbias != nullptr && out > 0 && !biasInDw) biasColumns(0, out);
  return Status::ok();
}

}  // namespace troupe::kernels::cpu
