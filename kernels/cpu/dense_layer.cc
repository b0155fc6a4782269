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

constexpr int64_t kMinSide = 16;         // rows or columns of a tile, at least
constexpr int64_t kWideRows = 64;        // row blocks this tall keep whole rows
constexpr int64_t kMinTileFlops = 1 << 19;  // about 5 us of one core: less is not worth a hand-off
constexpr int64_t kLine = 16;            // floats in a cache line: column cuts fall on these

// Tile t of `tiles` over C[m x n]: its rows [r0, r1) and columns [c0, c1),
// never empty for m, n >= 1 (rows <= m / 16 or 1, cols <= the cache lines of n).
struct Tile {
  int64_t r0, r1, c0, c1;
};

Tile tileAt(const DenseTiles& tiles, int64_t m, int64_t n, int64_t t) {
  const int64_t r = t / tiles.cols, c = t % tiles.cols;
  const int64_t lines = (n + kLine - 1) / kLine;
  return {m * r / tiles.rows, m * (r + 1) / tiles.rows, std::min(n, kLine * (lines * c / tiles.cols)),
          std::min(n, kLine * (lines * (c + 1) / tiles.cols))};
}

}  // namespace

DenseTiles denseTiles(int threads, int64_t m, int64_t n, int64_t k) {
  DenseTiles best;
  if (threads <= 1 || m <= 0 || n <= 0 || k <= 0) return best;
  const int64_t flops = 2 * m * n * k;
  const int64_t most = std::min<int64_t>(threads, flops / kMinTileFlops);
  if (most <= 1) return best;
  // Row blocks of kWideRows rows or more, when they give the most tiles,
  // stay whole rows: each sgemm then packs the other operand once for at
  // least 64 rows of work. (Measured on 2 threads: cutting such a product by
  // columns to pack less ran slower on Zen 3 and no faster on the lent Xeon.)
  if (m / most >= kWideRows) return DenseTiles{most, 1};
  const int64_t maxRows = std::max<int64_t>(1, m / kMinSide);
  const int64_t maxCols = std::max<int64_t>(1, std::min(n / kMinSide, (n + kLine - 1) / kLine));
  int64_t bestPacking = 0;
  for (int64_t rows = 1; rows <= std::min(most, maxRows); ++rows) {
    const int64_t cols = std::min(most / rows, maxCols);
    const DenseTiles cut{rows, cols};
    const int64_t packing = m * cols + n * rows;  // (times k)
    if (cut.count() > best.count() || (cut.count() == best.count() && packing < bestPacking)) {
      best = cut;
      bestPacking = packing;
    }
  }
  return best;
}

namespace {

// Runs fn(tile) for every tile of `tiles` on the pool (inline for one).
template <typename Fn>
void forTiles(ComputePool& pool, const DenseTiles& tiles, int64_t m, int64_t n, const Fn& fn) {
  if (tiles.count() <= 1) {
    fn(Tile{0, m, 0, n});
    return;
  }
  pool.parallelFor(tiles.count(), 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) fn(tileAt(tiles, m, n, t));
  });
}

}  // namespace

Status denseForward(ComputePool& pool, const float* x, const float* w, const float* bias, int64_t batch, int64_t in,
                    int64_t out, float* y) {
  if (Status s = checkShape("denseForward", batch, in, out); !s.isOk()) return s;
  if (batch == 0 || out == 0) return Status::ok();
  TROUPE_CHECK(y != nullptr && (in == 0 || (x != nullptr && w != nullptr)), "denseForward: null pointer");
  // y[batch x out] = x w^T + bias, tiled over y.
  forTiles(pool, denseTiles(pool.threads(), batch, out, in), batch, out, [&](const Tile& t) {
    for (int64_t b = t.r0; b < t.r1; ++b) {
      float* __restrict row = y + b * out;
      if (bias != nullptr) {
        std::copy(bias + t.c0, bias + t.c1, row + t.c0);
      } else {
        std::fill(row + t.c0, row + t.c1, 0.0f);
      }
    }
    if (in == 0) return;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(t.r1 - t.r0), int(t.c1 - t.c0), int(in), 1.0f,
                x + t.r0 * in, int(in), w + t.c0 * in, int(in), 1.0f, y + t.r0 * out + t.c0, int(out));
  });
  return Status::ok();
}

Status denseBackward(ComputePool& pool, const float* x, const float* w, const float* dy, int64_t batch, int64_t in,
                     int64_t out, float* dx, float* dw, float* dbias, bool accumulate) {
  if (Status s = checkShape("denseBackward", batch, in, out); !s.isOk()) return s;
  TROUPE_CHECK(batch * out == 0 || dy != nullptr, "denseBackward: null dy");
  const float beta = accumulate ? 1.0f : 0.0f;
  // dx[batch x in] = dy w and dw[out x in] = dy^T x, each tiled over its
  // output; the bias gradient (the column sums of dy) goes with dw's tiles of
  // the first column block, each summing the bias of its rows. Both products'
  // tiles go to the pool in one call: one hand-off per layer, and the two
  // products balance each other's tiles.
  const bool gemmDx = dx != nullptr && batch > 0 && in > 0 && out > 0;
  const bool gemmDw = dw != nullptr && out > 0 && in > 0 && batch > 0;
  if (dx != nullptr && batch > 0 && in > 0 && out == 0) std::fill(dx, dx + batch * in, 0.0f);
  if (dw != nullptr && out > 0 && in > 0 && batch == 0 && !accumulate) std::fill(dw, dw + out * in, 0.0f);
  if (gemmDx) TROUPE_CHECK(w != nullptr, "denseBackward: null w");
  if (gemmDw) TROUPE_CHECK(x != nullptr, "denseBackward: null x");
  // Each bias element is summed over the batch in increasing order, as one
  // thread would: the result does not depend on the tiles.
  auto biasColumns = [&](int64_t o0, int64_t o1) {
    if (!accumulate) std::fill(dbias + o0, dbias + o1, 0.0f);
    for (int64_t b = 0; b < batch; ++b) {
      const float* __restrict g = dy + b * out;
      float* __restrict db = dbias;
      for (int64_t j = o0; j < o1; ++j) db[j] += g[j];
    }
  };
  const bool biasInDw = dbias != nullptr && out > 0 && gemmDw;
  const DenseTiles dxTiles = gemmDx ? denseTiles(pool.threads(), batch, in, out) : DenseTiles{0, 0};
  const DenseTiles dwTiles = gemmDw ? denseTiles(pool.threads(), out, in, batch) : DenseTiles{0, 0};
  auto dxTile = [&](const Tile& t) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(t.r1 - t.r0), int(t.c1 - t.c0), int(out), 1.0f,
                dy + t.r0 * out, int(out), w + t.c0, int(in), 0.0f, dx + t.r0 * in + t.c0, int(in));
  };
  auto dwTile = [&](const Tile& t) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(t.r1 - t.r0), int(t.c1 - t.c0), int(batch), 1.0f,
                dy + t.r0, int(out), x + t.c0, int(in), beta, dw + t.r0 * in + t.c0, int(in));
    if (biasInDw && t.c0 == 0) biasColumns(t.r0, t.r1);
  };
  const int64_t dxCount = dxTiles.count(), dwCount = dwTiles.count();
  auto tile = [&](int64_t i) {
    if (i < dxCount) {
      dxTile(tileAt(dxTiles, batch, in, i));
    } else {
      dwTile(tileAt(dwTiles, out, in, i - dxCount));
    }
  };
  const int64_t tiles = dxCount + dwCount;
  if (dxCount <= 1 && dwCount <= 1) {
    for (int64_t i = 0; i < tiles; ++i) tile(i);
  } else {
    pool.parallelFor(tiles, 1, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) tile(i);
    });
  }
  if (dbias != nullptr && out > 0 && !biasInDw) biasColumns(0, out);
  return Status::ok();
}

}  // namespace troupe::kernels::cpu
