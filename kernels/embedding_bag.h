// Argument types of the embedding-bag kernels (Kernels::embeddingBagForward and
// embeddingBagBackward). Every pointer is borrowed from the caller and must stay
// valid for the duration of the call; nothing is retained.
#pragma once

#include <cstdint>

namespace troupe::kernels {

// How the rows of one bag are reduced into one output row.
enum class Pooling {
  kSum,   // sum_i w_i * rows[indices[i]]
  kMean,  // the same sum divided by the bag length (the number of indices)
};

// Indices into the pulled rows, either 32- or 64-bit. Build with of().
struct BagIndices {
  enum class Type { kInt32, kInt64 };
  const void* data = nullptr;
  Type type = Type::kInt64;
  int64_t size = 0;  // nnz

  static BagIndices of(const int32_t* p, int64_t n) { return {p, Type::kInt32, n}; }
  static BagIndices of(const int64_t* p, int64_t n) { return {p, Type::kInt64, n}; }
};

// The bags of one batch, in the CSR layout of torch.nn.EmbeddingBag:
// bag b is indices[offsets[b] .. offsets[b + 1]). Offsets must satisfy
// 0 <= offsets[0] <= ... <= offsets[batch] <= indices.size. Empty bags are
// allowed; their output row is all zeros.
struct EmbeddingBags {
  BagIndices indices;
  const int64_t* offsets = nullptr;  // batch + 1 entries (may be null when batch == 0)
  int64_t batch = 0;
  const float* weights = nullptr;    // optional per-sample weights, indices.size entries
  Pooling pooling = Pooling::kSum;
};

}  // namespace troupe::kernels
