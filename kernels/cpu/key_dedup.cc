#include "kernels/cpu/key_dedup.h"

#include <bit>
#include <limits>

#include "common/check.h"
#include "common/hash.h"

namespace troupe::kernels::cpu {
namespace {
constexpr int64_t kPrefetchAhead = 16;
}  // namespace

Expected<int64_t> KeyDedup::uniqueKeys(const uint64_t* keys, int64_t n, uint64_t* unique,
                                       int64_t* inverse) {
  if (n < 0 || n > std::numeric_limits<int32_t>::max()) {
    return Status::invalidArgument(fmt::format("uniqueKeys: n = {} is outside [0, 2^31)", n));
  }
  if (n == 0) return int64_t{0};
  TROUPE_CHECK(keys != nullptr && unique != nullptr && inverse != nullptr, "uniqueKeys: null pointer, n {}", n);
  const uint64_t capacity = std::bit_ceil(uint64_t(2 * n));
  const uint64_t mask = capacity - 1;
  table_.assign(capacity, Slot{0, -1});
  Slot* table = table_.data();
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (i + kPrefetchAhead < n) __builtin_prefetch(&table[mix64(keys[i + kPrefetchAhead]) & mask], 1, 3);
    const uint64_t key = keys[i];
    uint64_t slot = mix64(key) & mask;
    while (table[slot].id >= 0 && table[slot].key != key) slot = (slot + 1) & mask;
    if (table[slot].id < 0) {
      table[slot] = Slot{key, count};
      unique[count++] = key;
    }
    inverse[i] = table[slot].id;
  }
  return count;
}

Expected<int64_t> KeyDedup::dedupGradients(ComputePool& pool, const uint64_t* keys,
                                           const float* grads, int64_t n, int64_t dim,
                                           uint64_t* unique, float* summed, int64_t* inverse) {
  if (dim < 0) return Status::invalidArgument(fmt::format("dedupGradients: dim {} < 0", dim));
  Expected<int64_t> counted = uniqueKeys(keys, n, unique, inverse);
  if (!counted.hasValue() || *counted == 0 || dim == 0) return counted;
  const int64_t count = *counted;
  TROUPE_CHECK(grads != nullptr && summed != nullptr, "dedupGradients: null grads or summed");
  // Group positions by unique id, each group in increasing position.
  groupStart_.assign(count + 1, 0);
  for (int64_t i = 0; i < n; ++i) ++groupStart_[inverse[i] + 1];
  for (int64_t u = 0; u < count; ++u) groupStart_[u + 1] += groupStart_[u];
  groupPos_.resize(n);
  {
    std::vector<int32_t> cursor(groupStart_.begin(), groupStart_.end() - 1);
    for (int64_t i = 0; i < n; ++i) groupPos_[cursor[inverse[i]]++] = int32_t(i);
  }
  const int32_t* start = groupStart_.data();
  const int32_t* pos = groupPos_.data();
  pool.parallelFor(count, 64, [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
      float* __restrict dst = summed + u * dim;
      const float* __restrict src = grads + int64_t(pos[start[u]]) * dim;
      for (int64_t d = 0; d < dim; ++d) dst[d] = src[d];
      for (int64_t k = start[u] + 1; k < start[u + 1]; ++k) {
        const float* __restrict g = grads + int64_t(pos[k]) * dim;
        for (int64_t d = 0; d < dim; ++d) dst[d] += g[d];
      }
    }
  });
  return count;
}

}  // namespace troupe::kernels::cpu
