// KeyDedup: maps a batch of uint64 keys to dense ids in first-seen order with
// an open-addressing hash table (linear probing, troupe::mix64, load <= 1/2),
// and sums the gradients of equal keys (interface in kernels/kernels.h).
//
// Hashing runs on the calling thread with the slot of a key a few positions
// ahead prefetched; the gradient sums run in parallel over unique keys, each
// summed in increasing position, so results do not depend on the thread count.
// The object keeps its table and buffers between calls; one call at a time
// (cpu::Kernels lends one to each call in flight).
#pragma once

#include <cstdint>
#include <vector>

#include "common/compute_pool.h"
#include "common/status.h"

namespace troupe::kernels::cpu {

class KeyDedup final {
 public:
  KeyDedup() = default;
  KeyDedup(const KeyDedup&) = delete;
  KeyDedup& operator=(const KeyDedup&) = delete;

  Expected<int64_t> uniqueKeys(const uint64_t* keys, int64_t n, uint64_t* unique, int64_t* inverse);

  Expected<int64_t> dedupGradients(ComputePool& pool, const uint64_t* keys, const float* grads,
                                   int64_t n, int64_t dim, uint64_t* unique, float* summed,
                                   int64_t* inverse);

 private:
  struct Slot {
    uint64_t key;
    int64_t id;  // -1: empty
  };

  std::vector<Slot> table_;
  std::vector<int32_t> groupStart_;  // positions grouped by unique id (CSR)
  std::vector<int32_t> groupPos_;
};

}  // namespace troupe::kernels::cpu
