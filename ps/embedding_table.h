// EmbeddingTable: one embedding table (or one shard's partition of it) with its
// optimizer state, keyed by uint64 feature hashes (DESIGN.md, Parameter server).
//
// Rows are created on first touch. A new row's weights are drawn uniformly from
// [-initScale, initScale] by an Rng seeded with hash(seed, tableId, key), so any
// shard, restart or replica makes the same row for the same key. Each row is a
// block of kernels::optimizerRowFloats(kind, dim) floats, [weights | state], as
// the row-optimizer kernels expect; row blocks never move once created (they
// live in chunks that are never reallocated), so a row pointer stays valid
// for the table's life.
//
// The index is an open-addressing hash table (linear probing, power-of-two
// capacity, at most 70% full) from key to row number: every key has its own
// row, there are no collisions between keys.
//
// Threading: not thread-safe; one owner (the table-holder or shard actor).
// push runs the optimizer on the given kernels (and their compute threads).
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "common/huge_pages.h"
#include "common/status.h"
#include "kernels/row_optimizer.h"

namespace troupe::kernels {
class Kernels;
}

namespace troupe::ps {

// Every row of a table, as a checkpoint holds it: the keys in row order and
// the row blocks ([weights | optimizer state]) back to back.
struct TableImage {
  int64_t tableId = 0;
  int64_t dim = 0;
  int64_t rowFloats = 0;
  int64_t optimizerKind = 0;  // kernels::OptimizerKind
  std::vector<uint64_t> keys;
  std::vector<float> rows;  // keys.size() x rowFloats
};

struct EmbeddingTableOptions {
  int tableId = 0;
  int64_t dim = 16;
  kernels::OptimizerConfig optimizer;
  uint64_t seed = 1;
  // New weights are uniform in [-initScale, initScale]; <= 0 means 1 / sqrt(dim).
  float initScale = 0.0f;
  // Keys the index can hold before it first grows.
  int64_t initialCapacity = 1024;
  // Memory the table takes once it is this large (row chunks, a grown
  // index) asks for transparent huge pages (common/huge_pages.h); what it
  // took before stays on ordinary pages. Measured (bench/RESULTS.md,
  // troupe_kernels_bench TablePull, 1 thread): a batch's lookups on a
  // 512 MiB or 1 GiB table 1.4x faster on huge pages, while tables of
  // 16-256 MiB, within reach of the caches, were no faster or slower.
  size_t hugePagesFromBytes = size_t{512} << 20;
};

class EmbeddingTable final {
 public:
  // Throws SetupError on dim < 1.
  explicit EmbeddingTable(const EmbeddingTableOptions& options);
  ~EmbeddingTable();
  EmbeddingTable(const EmbeddingTable&) = delete;
  EmbeddingTable& operator=(const EmbeddingTable&) = delete;

  const EmbeddingTableOptions& options() const { return options_; }
  int64_t dim() const { return options_.dim; }
  // Floats per row block (weights and optimizer state).
  int64_t rowFloats() const { return rowFloats_; }
  // Rows created so far.
  int64_t size() const { return rows_; }
  // Bytes held by rows and index.
  size_t memoryBytes() const;
  // Of those, the bytes asked to be on huge pages (hugePagesFromBytes).
  size_t hugePageBytes() const;

  // The row block of key, created (and initialised) if absent.
  float* findOrCreate(uint64_t key);
  // The row block of key, or nullptr when the key was never touched.
  const float* find(uint64_t key) const;

  // Copies the weights of keys[0..n) into out [n x dim], creating missing rows.
  // Keys may repeat. remember: the keys and their rows are kept for the
  // push of the same keys that follows (pulledLast; the in-process table
  // holder's pulls), at the cost of a copy of the keys.
  void pull(const uint64_t* keys, int64_t n, float* out, bool remember = false);
  // Like pull, but a key never touched gets its initial weights without
  // being inserted (evaluation must not grow the table).
  void peek(const uint64_t* keys, int64_t n, float* out) const;

  // Applies one optimizer step to the rows of keys[0..n) with grads [n x dim],
  // creating missing rows first. Repeated keys are summed first, so each row
  // gets one update. step is the optimizer's global step (Adam's bias
  // correction). Fails only on a kernel error.
  Status push(const uint64_t* keys, const float* grads, int64_t n, int64_t step, kernels::Kernels& kernels,
              float lrScale = 1.0f, bool keysUnique = false);

  // The first half of push, for callers that update several tables with one
  // optimizer call: sums repeated keys and finds (or creates) their rows.
  // Afterwards preparedRows() holds the unique rows' blocks and
  // preparedGrads() their summed gradients [count x dim], valid until the
  // next call (and, with keysUnique, while `grads` lives). Returns the count.
  //
  // keysUnique: the caller vouches that no key repeats (a worker's push of
  // the keys it made unique for its pull), so nothing is summed and the
  // gradients are used where they are: the same rows and bits as the sum of
  // one gradient. Only for callers in this process; a push from the network
  // is never taken on its word (a repeated key would get two updates at once).
  Expected<int64_t> preparePush(const uint64_t* keys, const float* grads, int64_t n, kernels::Kernels& kernels,
                                bool keysUnique = false);
  // Whether the last pull (with create, remembered) was of these n keys, in
  // this order: a push of them (keysUnique) then finds its rows without a
  // lookup. (n == 0: true whenever nothing is remembered; nothing to find.)
  bool pulledLast(const uint64_t* keys, int64_t n) const {
    return n >= 0 && size_t(n) == pulledKeys_.size() &&
           (n == 0 || std::memcmp(keys, pulledKeys_.data(), size_t(n) * sizeof(uint64_t)) == 0);
  }
  float* const* preparedRows() const { return rowPtrs_.data(); }
  const float* preparedGrads() const { return preparedGrads_; }

  // Calls fn(key, rowBlock) for every row, in no particular order.
  template <typename Fn>
  void forEach(Fn&& fn) const {
    for (uint64_t i = 0; i <= mask_; ++i) {
      if (slots_[i].row >= 0) fn(slots_[i].key, rowAt(slots_[i].row));
    }
  }

  // A copy of every row (for a checkpoint).
  TableImage image() const;
  // Fills an empty table from an image of a table like it (same id, dim
  // and optimizer); fails naming what differs, changing nothing.
  Status load(const TableImage& image);

  // The initial weights of (seed, tableId, key), as findOrCreate writes them.
  static void initialWeights(uint64_t seed, int tableId, uint64_t key, float scale, float* out, int64_t dim);

 private:
  struct Slot {
    uint64_t key;
    int64_t row;  // -1: empty
  };
  // Rows live in chunks that never move: chunks of smallRows_ rows (4096,
  // fewer for rows of more than 256 floats) until the table is
  // hugePagesFromBytes large; from row hugeFromRow_ on, chunks of hugeRows_
  // rows (about 4 MiB, or one row where a row is larger) on huge pages.
  float* rowAt(int64_t row) const {
    if (row < hugeFromRow_) return static_cast<float*>(chunks_[size_t(row / smallRows_)].data()) + (row % smallRows_) * rowFloats_;
    const int64_t r = row - hugeFromRow_;
    return static_cast<float*>(chunks_[smallChunks_ + size_t(r / hugeRows_)].data()) + (r % hugeRows_) * rowFloats_;
  }
  // Whether memory that makes the table `tableBytes` large goes on huge pages.
  bool hugeAt(size_t tableBytes) const { return tableBytes >= options_.hugePagesFromBytes; }
  // `bytes` of memory; out of memory is fatal (TROUPE_CHECK), as it was for
  // every allocation of the table.
  TableMemory take(size_t bytes, bool huge) const;
  // An index of `capacity` empty slots (a power of two) in `memory`.
  static Slot* emptySlots(const TableMemory& memory, uint64_t capacity);
  int64_t newRow(uint64_t key);
  void grow();
  // pull and peek run in two passes: every key's slot, then every row, each
  // pass fetching from memory ahead of itself (key i + kSlotAhead's slot,
  // row i + kRowAhead), so a table larger than the caches waits for many
  // misses at once instead of two after another per key; preparePush
  // fetches slots ahead the same way. Measured (troupe_kernels_bench
  // TablePull, bench/RESULTS.md): 2.2-2.9x for a DLRM batch's keys on a
  // 1 GiB table of 16-float rows.
  static constexpr int64_t kSlotAhead = 16, kRowAhead = 8;
  void prefetchSlot(const uint64_t* keys, int64_t i, int64_t n) const;

  EmbeddingTableOptions options_;
  int64_t rowFloats_;
  int64_t smallRows_;
  int64_t hugeRows_;
  int64_t hugeFromRow_ = std::numeric_limits<int64_t>::max();  // the first row in a huge-page chunk (none yet: the largest)
  size_t smallChunks_ = 0;           // chunks before that row's
  size_t chunkBytes_ = 0;            // of all chunks
  float initScale_;
  TableMemory slotMemory_;
  Slot* slots_ = nullptr;  // mask_ + 1 of them, in slotMemory_
  uint64_t mask_ = 0;
  int64_t rows_ = 0;
  std::vector<TableMemory> chunks_;
  // Scratch for push (reused between calls).
  std::vector<uint64_t> uniqueKeys_;
  std::vector<float> summed_;
  std::vector<int64_t> inverse_;
  std::vector<float*> rowPtrs_;
  const float* preparedGrads_ = nullptr;  // summed_, or a push's own gradients (keysUnique)
  // The rows of the last pull, and its keys when it was to be remembered
  // (empty otherwise): a push of the same keys in the same order (a
  // worker's, on its word that they are unique) updates these rows without
  // looking them up again. (Rows never move or go while the table holds
  // them: chunks are only added, and load() fills an empty table only.)
  std::vector<float*> pullRows_;
  std::vector<uint64_t> pulledKeys_;
};

}  // namespace troupe::ps
