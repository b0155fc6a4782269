// CPU fully connected layer on OpenBLAS cblas_sgemm (contract in
// kernels/kernels.h). Each GEMM is split into tiles (blocks of output rows by
// blocks of output columns) over the kernels' compute pool, each tile one
// single-threaded sgemm (cpu::Kernels keeps OpenBLAS at one thread): idle
// threads then sleep in the pool instead of spinning in OpenBLAS's thread
// server, which on a small machine steals the cores the rest of a training
// step needs. Splits never cut the reduction dimension, so every output
// element is one sgemm's sum, and a given thread count always gives the same
// tiles, so the same bits.
#pragma once

#include <cstdint>

#include "common/compute_pool.h"
#include "common/status.h"

namespace troupe::kernels::cpu {

// How a product C[m x n] = A[m x k] B[k x n] is cut for `threads` threads:
// `rows` blocks of C's rows by `cols` blocks of its columns (column blocks
// start on multiples of 16 floats: where a row starts on a cache line, no two
// tiles write one of its lines). Each tile's sgemm packs its rows of A and its
// columns of B, so the tiles cost k (m cols + n rows) floats of packing
// between them: among the cuts with the most tiles (at most one a thread,
// each at least 16 x 16 and on average 2^19 flops), the one that packs least;
// but where blocks of whole rows, each at least 64 tall, give that many tiles,
// those are kept (their packing is a small part of their work, and on 2
// threads they ran faster than the cut that packs least on Zen 3;
// bench/RESULTS.md). A layer of 16 rows a thread packs the
// whole weight matrix once a thread; a squarer cut packs a fraction of it.
struct DenseTiles {
  int64_t rows = 1;
  int64_t cols = 1;
  int64_t count() const { return rows * cols; }
};
DenseTiles denseTiles(int threads, int64_t m, int64_t n, int64_t k);

Status denseForward(ComputePool& pool, const float* x, const float* w, const float* bias, int64_t batch, int64_t in,
                    int64_t out, float* y);

Status denseBackward(ComputePool& pool, const float* x, const float* w, const float* dy, int64_t batch, int64_t in,
                     int64_t out, float* dx, float* dw, float* dbias, bool accumulate);

}  // namespace troupe::kernels::cpu
