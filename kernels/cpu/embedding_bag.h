// CPU embedding-bag forward and backward (interface and contract in
// kernels/kernels.h). Both validate offsets and indices first.
//
// Forward is parallel over bags with rows prefetched a few indices ahead.
// Backward groups the (row, bag) pairs by row (counting sort when the table is
// small, hashing otherwise), then sums each row's contributions in index order,
// parallel over rows: no atomics, no per-thread copies of the table, and the
// result does not depend on the thread count.
#pragma once

#include <cstdint>
#include <vector>

#include "common/compute_pool.h"
#include "common/status.h"
#include "kernels/cpu/key_dedup.h"
#include "kernels/embedding_bag.h"

namespace troupe::kernels::cpu {

Status embeddingBagForward(ComputePool& pool, const float* rows, int64_t numRows, int64_t dim,
                           const EmbeddingBags& bags, float* out);

// One contribution to a row's gradient: gradRows[row] += scale * gradOut[bag].
struct BagContribution {
  int32_t row;
  int32_t bag;
  float scale;
};

// Reusable scratch of the backward pass (cpu::Kernels lends one to each call in flight).
struct EmbeddingBagScratch {
  std::vector<BagContribution> contributions;
  std::vector<int32_t> groupStart;
  KeyDedup rowIndex;  // groups rows by hashing when the table is large
  std::vector<uint64_t> keys, unique;
  std::vector<int64_t> inverse;
};

Status embeddingBagBackward(ComputePool& pool, const float* gradOut, int64_t dim,
                            const EmbeddingBags& bags, float* gradRows, int64_t numRows,
                            EmbeddingBagScratch& scratch);

// Checks offsets and that every index lies in [0, numRows); names the first
// bad position. Exposed for the CUDA path and tests.
Status validateBags(ComputePool& pool, const EmbeddingBags& bags, int64_t numRows);

}  // namespace troupe::kernels::cpu
