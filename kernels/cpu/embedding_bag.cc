#include "kernels/cpu/embedding_bag.h"

#include <algorithm>
#include <atomic>
#include <limits>

#include "common/check.h"
#include "kernels/cpu/prefetch.h"

namespace troupe::kernels::cpu {
namespace {

constexpr int64_t kBagGrain = 32;
constexpr int64_t kIndexGrain = 1 << 14;
constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

template <typename Index>
int64_t firstBadIndex(ComputePool& pool, const Index* indices, int64_t nnz, int64_t numRows) {
  std::atomic<int64_t> firstBad{nnz};
  pool.parallelFor(nnz, kIndexGrain, [&](int64_t begin, int64_t end) {
    bool bad = false;
    for (int64_t i = begin; i < end; ++i) bad |= uint64_t(int64_t(indices[i])) >= uint64_t(numRows);
    if (!bad) return;
    for (int64_t i = begin; i < end; ++i) {
      if (uint64_t(int64_t(indices[i])) >= uint64_t(numRows)) {
        int64_t seen = firstBad.load();
        while (i < seen && !firstBad.compare_exchange_weak(seen, i)) {
        }
        return;
      }
    }
  });
  return firstBad.load();
}

template <typename Index>
Status validateIndices(ComputePool& pool, const Index* indices, int64_t nnz, int64_t numRows) {
  const int64_t bad = firstBadIndex(pool, indices, nnz, numRows);
  if (bad == nnz) return Status::ok();
  return Status::invalidArgument(fmt::format("embedding bag: indices[{}] = {} is outside [0, {})",
                                             bad, int64_t(indices[bad]), numRows));
}

// Sums the bags [b0, b1) into out. kDim > 0 fixes the row length at compile
// time so the accumulator stays in registers.
template <typename Index, int kDim>
void forwardBags(const float* __restrict rows, int64_t dimArg, const Index* __restrict indices,
                 const EmbeddingBags& bags, int64_t b0, int64_t b1, float* __restrict out) {
  const int64_t dim = kDim > 0 ? kDim : dimArg;
  const int64_t* offsets = bags.offsets;
  const float* weights = bags.weights;
  const int64_t rowBytes = dim * int64_t(sizeof(float));
  const int64_t distance = prefetchDistance(rowBytes);
  const int64_t last = offsets[b1];
  for (int64_t p = offsets[b0]; p < std::min(last, offsets[b0] + distance); ++p) {
    prefetchBytes(rows + int64_t(indices[p]) * dim, rowBytes);
  }
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t begin = offsets[b], end = offsets[b + 1];
    float acc[kDim > 0 ? kDim : 1];
    float* __restrict o = kDim > 0 ? acc : out + b * dim;
    for (int64_t d = 0; d < dim; ++d) o[d] = 0.0f;
    for (int64_t p = begin; p < end; ++p) {
      if (p + distance < last) prefetchBytes(rows + int64_t(indices[p + distance]) * dim, rowBytes);
      const float* __restrict r = rows + int64_t(indices[p]) * dim;
      const float w = weights != nullptr ? weights[p] : 1.0f;
      for (int64_t d = 0; d < dim; ++d) o[d] += w * r[d];
    }
    const float scale =
        bags.pooling == Pooling::kMean && end > begin ? 1.0f / float(end - begin) : 1.0f;
    float* __restrict dst = out + b * dim;
    for (int64_t d = 0; d < dim; ++d) dst[d] = o[d] * scale;
  }
}

template <typename Index>
void forwardAll(ComputePool& pool, const float* rows, int64_t dim, const Index* indices,
                const EmbeddingBags& bags, float* out) {
  pool.parallelFor(bags.batch, kBagGrain, [&](int64_t b0, int64_t b1) {
    switch (dim) {
      case 16: return forwardBags<Index, 16>(rows, dim, indices, bags, b0, b1, out);
      case 32: return forwardBags<Index, 32>(rows, dim, indices, bags, b0, b1, out);
      case 64: return forwardBags<Index, 64>(rows, dim, indices, bags, b0, b1, out);
      case 128: return forwardBags<Index, 128>(rows, dim, indices, bags, b0, b1, out);
      default: return forwardBags<Index, 0>(rows, dim, indices, bags, b0, b1, out);
    }
  });
}

// Fills scratch.contributions with every (row, bag, scale), grouped by row and
// within a row ordered by index position. Groups are numbered by row when the
// table is small (counting sort over rows) and by first appearance otherwise
// (hashing), so the cost is O(nnz + min(numRows, 4 nnz)).
template <typename Index>
void groupByRow(const Index* indices, const EmbeddingBags& bags, int64_t numRows,
                EmbeddingBagScratch& s) {
  const int64_t* offsets = bags.offsets;
  const int64_t first = offsets[0], nnz = offsets[bags.batch] - first;
  int64_t groups = numRows;
  const int64_t* group = nullptr;  // group of position first + i; null: the row itself
  if (numRows > 4 * nnz) {
    s.keys.resize(nnz);
    s.unique.resize(nnz);
    s.inverse.resize(nnz);
    for (int64_t i = 0; i < nnz; ++i) s.keys[i] = uint64_t(indices[first + i]);
    groups = *s.rowIndex.uniqueKeys(s.keys.data(), nnz, s.unique.data(), s.inverse.data());
    group = s.inverse.data();
  }
  auto groupOf = [&](int64_t p) { return group != nullptr ? group[p - first] : int64_t(indices[p]); };
  s.groupStart.assign(groups + 1, 0);
  for (int64_t p = first; p < first + nnz; ++p) ++s.groupStart[groupOf(p) + 1];
  for (int64_t g = 0; g < groups; ++g) s.groupStart[g + 1] += s.groupStart[g];
  s.contributions.resize(nnz);
  for (int64_t b = 0; b < bags.batch; ++b) {
    const int64_t len = offsets[b + 1] - offsets[b];
    const float meanScale = bags.pooling == Pooling::kMean ? 1.0f / float(len) : 1.0f;
    for (int64_t p = offsets[b]; p < offsets[b + 1]; ++p) {
      const float w = bags.weights != nullptr ? bags.weights[p] : 1.0f;
      s.contributions[s.groupStart[groupOf(p)]++] = {int32_t(indices[p]), int32_t(b), w * meanScale};
    }
  }
}

// Adds the contributions [c0, c1) (whole rows only) into gradRows.
void scatterRows(const BagContribution* __restrict c, int64_t c0, int64_t c1,
                 const float* __restrict gradOut, int64_t dim, float* __restrict gradRows) {
  const int64_t rowBytes = dim * int64_t(sizeof(float));
  const int64_t distance = prefetchDistance(rowBytes);
  for (int64_t i = c0; i < c1; ++i) {
    if (i + distance < c1) prefetchBytes<true>(gradRows + int64_t(c[i + distance].row) * dim, rowBytes);
    float* __restrict g = gradRows + int64_t(c[i].row) * dim;
    const float* __restrict src = gradOut + int64_t(c[i].bag) * dim;
    const float scale = c[i].scale;
    for (int64_t d = 0; d < dim; ++d) g[d] += scale * src[d];
  }
}

template <typename Index>
void backwardAll(ComputePool& pool, const float* gradOut, int64_t dim, const Index* indices,
                 const EmbeddingBags& bags, float* gradRows, int64_t numRows,
                 EmbeddingBagScratch& s) {
  groupByRow(indices, bags, numRows, s);
  const BagContribution* c = s.contributions.data();
  const int64_t n = int64_t(s.contributions.size());
  pool.parallelFor(n, 256, [&](int64_t begin, int64_t end) {
    // Move both ends forward to row boundaries so each row has one owner.
    while (begin > 0 && begin < n && c[begin].row == c[begin - 1].row) ++begin;
    while (end < n && c[end].row == c[end - 1].row) ++end;
    if (begin < end) scatterRows(c, begin, end, gradOut, dim, gradRows);
  });
}

}  // namespace

Status validateBags(ComputePool& pool, const EmbeddingBags& bags, int64_t numRows) {
  const int64_t nnz = bags.indices.size;
  if (bags.batch < 0 || nnz < 0 || numRows < 0) {
    return Status::invalidArgument(fmt::format("embedding bag: negative size (batch {}, nnz {}, rows {})",
                                               bags.batch, nnz, numRows));
  }
  if (numRows > kMaxInt32 || bags.batch > kMaxInt32 || nnz > kMaxInt32) {
    return Status::invalidArgument(fmt::format(
        "embedding bag: sizes must be < 2^31 (batch {}, nnz {}, rows {})", bags.batch, nnz, numRows));
  }
  if (bags.batch == 0) return Status::ok();
  TROUPE_CHECK(bags.offsets != nullptr, "embedding bag: null offsets for batch {}", bags.batch);
  const int64_t* o = bags.offsets;
  if (o[0] < 0 || o[0] > nnz) {
    return Status::invalidArgument(fmt::format("embedding bag: offsets[0] = {} is outside [0, {}]", o[0], nnz));
  }
  for (int64_t b = 0; b < bags.batch; ++b) {
    if (o[b + 1] < o[b] || o[b + 1] > nnz) {
      return Status::invalidArgument(fmt::format(
          "embedding bag: offsets[{}] = {} after {} is not in [{}, {}]", b + 1, o[b + 1], o[b], o[b], nnz));
    }
  }
  TROUPE_CHECK(nnz == 0 || bags.indices.data != nullptr, "embedding bag: null indices, nnz {}", nnz);
  // Only the indices that some bag uses are read, and only those are checked.
  const int64_t first = o[0], used = o[bags.batch] - o[0];
  Status s = bags.indices.type == BagIndices::Type::kInt32
                 ? validateIndices(pool, static_cast<const int32_t*>(bags.indices.data) + first, used, numRows)
                 : validateIndices(pool, static_cast<const int64_t*>(bags.indices.data) + first, used, numRows);
  if (s.isOk()) return s;
  return Status::invalidArgument(s.message() + fmt::format(" (offset by offsets[0] = {})", first));
}

Status embeddingBagForward(ComputePool& pool, const float* rows, int64_t numRows, int64_t dim,
                           const EmbeddingBags& bags, float* out) {
  if (dim < 0) return Status::invalidArgument(fmt::format("embedding bag: dim {} < 0", dim));
  if (Status s = validateBags(pool, bags, numRows); !s.isOk()) return s;
  if (bags.batch == 0 || dim == 0) return Status::ok();
  TROUPE_CHECK(out != nullptr && (rows != nullptr || numRows == 0), "embedding bag: null rows or out");
  if (bags.indices.type == BagIndices::Type::kInt32) {
    forwardAll(pool, rows, dim, static_cast<const int32_t*>(bags.indices.data), bags, out);
  } else {
    forwardAll(pool, rows, dim, static_cast<const int64_t*>(bags.indices.data), bags, out);
  }
  return Status::ok();
}

Status embeddingBagBackward(ComputePool& pool, const float* gradOut, int64_t dim,
                            const EmbeddingBags& bags, float* gradRows, int64_t numRows,
                            EmbeddingBagScratch& scratch) {
  if (dim < 0) return Status::invalidArgument(fmt::format("embedding bag: dim {} < 0", dim));
  if (Status s = validateBags(pool, bags, numRows); !s.isOk()) return s;
  if (bags.batch == 0 || dim == 0 || bags.offsets[bags.batch] == bags.offsets[0]) return Status::ok();
  TROUPE_CHECK(gradOut != nullptr && gradRows != nullptr, "embedding bag: null gradOut or gradRows");
  if (bags.indices.type == BagIndices::Type::kInt32) {
    backwardAll(pool, gradOut, dim, static_cast<const int32_t*>(bags.indices.data), bags, gradRows,
                numRows, scratch);
  } else {
    backwardAll(pool, gradOut, dim, static_cast<const int64_t*>(bags.indices.data), bags, gradRows,
                numRows, scratch);
  }
  return Status::ok();
}

}  // namespace troupe::kernels::cpu
