// EmbeddingTable: one embedding table (or one shard's partition of it) with its
// optimizer state, keyed by uint64 feature hashes (DESIGN.md, Parameter server).
//
// Rows are created on first touch. A new row's weights are drawn uniformly from
// [-initScale, initScale] by an Rng seeded with hash(seed, tableId, key), so any
// shard, restart or replica makes the same row for the same key. Each row is a
// block of kernels::optimizerRowFloats(kind, dim) floats, [weights | state], as
// the row-optimizer kernels expect; row blocks never move once created (they
// live in fixed-size chunks), so a row pointer stays valid for the table's life.
//
// The index is an open-addressing hash table (linear probing, power-of-two
// capacity, at most 70% full) from key to row number: every key has its own
// row, there are no collisions between keys.
//
// Threading: not thread-safe; one owner (the table-holder or shard actor).
// push runs the optimizer on the given kernels (and their compute threads).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

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

  // The row block of key, created (and initialised) if absent.
  float* findOrCreate(uint64_t key);
  // The row block of key, or nullptr when the key was never touched.
  const float* find(uint64_t key) const;

  // Copies the weights of keys[0..n) into out [n x dim], creating missing rows.
  // Keys may repeat.
  void pull(const uint64_t* keys, int64_t n, float* out);
  // Like pull, but a key never touched gets its initial weights without
  // being inserted (evaluation must not grow the table).
  void peek(const uint64_t* keys, int64_t n, float* out) const;

  // Applies one optimizer step to the rows of keys[0..n) with grads [n x dim],
  // creating missing rows first. Repeated keys are summed first, so each row
  // gets one update. step is the optimizer's global step (Adam's bias
  // correction). Fails only on a kernel error.
  Status push(const uint64_t* keys, const float* grads, int64_t n, int64_t step, kernels::Kernels& kernels,
              float lrScale = 1.0f);

  // The first half of push, for callers that update several tables with one
  // optimizer call: sums repeated keys and finds (or creates) their rows.
  // Afterwards preparedRows() holds the unique rows' blocks and
  // preparedGrads() their summed gradients [count x dim], valid until the
  // next call. Returns the count.
  Expected<int64_t> preparePush(const uint64_t* keys, const float* grads, int64_t n, kernels::Kernels& kernels);
  float* const* preparedRows() const { return rowPtrs_.data(); }
  const float* preparedGrads() const { return summed_.data(); }

  // Calls fn(key, rowBlock) for every row, in no particular order.
  template <typename Fn>
  void forEach(Fn&& fn) const {
    for (const Slot& s : slots_) {
      if (s.row >= 0) fn(s.key, rowAt(s.row));
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
  // Rows per chunk: up to 4096, fewer for wide rows (a chunk stays near 4 MiB
  // unless one row is larger).
  float* rowAt(int64_t row) const {
    return chunks_[size_t(row / chunkRows_)].get() + (row % chunkRows_) * rowFloats_;
  }
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
  int64_t chunkRows_;
  float initScale_;
  std::vector<Slot> slots_;
  uint64_t mask_ = 0;
  int64_t rows_ = 0;
  struct FreeDeleter {
    void operator()(float* p) const;
  };
  std::vector<std::unique_ptr<float[], FreeDeleter>> chunks_;
  // Scratch for push (reused between calls).
  std::vector<uint64_t> uniqueKeys_;
  std::vector<float> summed_;
  std::vector<int64_t> inverse_;
  std::vector<float*> rowPtrs_;
  std::vector<const float*> pullRows_;  // scratch of pull
};

}  // namespace troupe::ps
