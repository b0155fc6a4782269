#include "ps/embedding_table.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "common/check.h"
#include "common/logging.h"
#include "common/hash.h"
#include "kernels/kernels.h"

namespace troupe::ps {

EmbeddingTable::EmbeddingTable(const EmbeddingTableOptions& options)
    : options_(options),
      rowFloats_(kernels::optimizerRowFloats(options.optimizer.kind, options.dim)),
      smallRows_(std::clamp<int64_t>((int64_t{1} << 20) / std::max<int64_t>(rowFloats_, 1), 1, 4096)),
      hugeRows_(std::max<int64_t>((int64_t{1} << 20) / std::max<int64_t>(rowFloats_, 1), 1)),
      initScale_(options.initScale > 0 ? options.initScale : float(1.0 / std::sqrt(double(options.dim)))) {
  if (options.dim < 1) TROUPE_SETUP_ERROR("embedding table {}: dim must be >= 1, got {}", options.tableId, options.dim);
  int64_t capacity = 16;
  while (capacity * 7 / 10 < options.initialCapacity) capacity *= 2;
  const size_t bytes = size_t(capacity) * sizeof(Slot);
  slotMemory_ = take(bytes, hugeAt(bytes));
  slots_ = emptySlots(slotMemory_, uint64_t(capacity));
  mask_ = uint64_t(capacity - 1);
}

TableMemory EmbeddingTable::take(size_t bytes, bool huge) const {
  try {
    return TableMemory(bytes, huge);
  } catch (const std::bad_alloc&) {
    TROUPE_CHECK(false, "embedding table {}: out of memory allocating {} bytes", options_.tableId, bytes);
  }
  return {};  // (not reached)
}

EmbeddingTable::Slot* EmbeddingTable::emptySlots(const TableMemory& memory, uint64_t capacity) {
  auto* slots = static_cast<Slot*>(memory.data());
  std::fill(slots, slots + capacity, Slot{0, -1});
  return slots;
}

EmbeddingTable::~EmbeddingTable() = default;

size_t EmbeddingTable::memoryBytes() const {
  return slotMemory_.bytes() + chunkBytes_;
}

size_t EmbeddingTable::hugePageBytes() const {
  size_t bytes = slotMemory_.huge() ? slotMemory_.bytes() : 0;
  for (const TableMemory& c : chunks_) bytes += c.huge() ? c.bytes() : 0;
  return bytes;
}

void EmbeddingTable::initialWeights(uint64_t seed, int tableId, uint64_t key, float scale, float* out,
                                    int64_t dim) {
  Rng rng(hashCombine(seed, uint64_t(tableId) + 0x7461626c65ULL, key));
  for (int64_t i = 0; i < dim; ++i) out[i] = float((2.0 * rng.uniform() - 1.0) * scale);
}

int64_t EmbeddingTable::newRow(uint64_t key) {
  const int64_t row = rows_++;
  // Rows come in order: a row at the start of a chunk is the first in a new one.
  const bool huge = row >= hugeFromRow_;
  if (huge ? (row - hugeFromRow_) % hugeRows_ == 0 : row % smallRows_ == 0) {
    const size_t hugeBytes = size_t(hugeRows_ * rowFloats_) * sizeof(float);
    if (!huge && hugeAt(memoryBytes() + hugeBytes)) {  // the table is large now: huge pages from here on
      hugeFromRow_ = row;
      smallChunks_ = chunks_.size();
    }
    const bool next = row >= hugeFromRow_;
    const size_t bytes = next ? hugeBytes : size_t(smallRows_ * rowFloats_) * sizeof(float);
    chunks_.push_back(take(bytes, next));
    chunkBytes_ += bytes;
  }
  float* block = rowAt(row);
  initialWeights(options_.seed, options_.tableId, key, initScale_, block, options_.dim);
  kernels::initRowState(options_.optimizer, block, options_.dim);
  return row;
}

void EmbeddingTable::grow() {
  // The new index is made whole before the old one goes (the table stays
  // as it was if there is no memory for it).
  const uint64_t capacity = (mask_ + 1) * 2, mask = capacity - 1;
  const size_t bytes = size_t(capacity) * sizeof(Slot);
  TableMemory memory = take(bytes, hugeAt(chunkBytes_ + bytes));  // (the rows and this index, once the old one goes)
  Slot* fresh = emptySlots(memory, capacity);
  for (uint64_t o = 0; o <= mask_; ++o) {
    const Slot& s = slots_[o];
    if (s.row < 0) continue;
    uint64_t i = mix64(s.key) & mask;
    while (fresh[i].row >= 0) i = (i + 1) & mask;
    fresh[i] = s;
  }
  slotMemory_ = std::move(memory);
  slots_ = fresh;
  mask_ = mask;
}

float* EmbeddingTable::findOrCreate(uint64_t key) {
  if ((rows_ + 1) * 10 > int64_t(mask_ + 1) * 7) grow();
  uint64_t i = mix64(key) & mask_;
  for (;;) {
    Slot& s = slots_[i];
    if (s.row < 0) {
      s.key = key;
      s.row = newRow(key);
      return rowAt(s.row);
    }
    if (s.key == key) return rowAt(s.row);
    i = (i + 1) & mask_;
  }
}

TableImage EmbeddingTable::image() const {
  TableImage img;
  img.tableId = options_.tableId;
  img.dim = options_.dim;
  img.rowFloats = rowFloats_;
  img.optimizerKind = int64_t(options_.optimizer.kind);
  img.keys.resize(size_t(rows_));
  for (uint64_t i = 0; i <= mask_; ++i) {
    if (slots_[i].row >= 0) img.keys[size_t(slots_[i].row)] = slots_[i].key;
  }
  // One pass over fresh memory (no zero fill first): a checkpoint's pause
  // is mostly this copy.
  img.rows.reserve(size_t(rows_ * rowFloats_));
  int64_t r = 0;
  for (size_t c = 0; r < rows_; ++c) {
    const int64_t n = std::min(chunks_[c].huge() ? hugeRows_ : smallRows_, rows_ - r);
    const float* from = static_cast<const float*>(chunks_[c].data());
    img.rows.insert(img.rows.end(), from, from + n * rowFloats_);
    r += n;
  }
  return img;
}

Status EmbeddingTable::load(const TableImage& img) {
  if (rows_ != 0) return Status::invalidArgument(fmt::format("table {}: holds rows already", options_.tableId));
  if (img.tableId != options_.tableId || img.dim != options_.dim || img.rowFloats != rowFloats_ ||
      img.optimizerKind != int64_t(options_.optimizer.kind)) {
    return Status::invalidArgument(fmt::format(
        "table {} (dim {}, optimizer {}, {} floats a row) does not match the checkpoint's table {} (dim {}, "
        "optimizer {}, {} floats a row)",
        options_.tableId, options_.dim, int(options_.optimizer.kind), rowFloats_, img.tableId, img.dim,
        img.optimizerKind, img.rowFloats));
  }
  if (img.rows.size() != img.keys.size() * size_t(rowFloats_)) {
    return Status::corruption(fmt::format("table {}: {} keys but {} floats of rows", img.tableId, img.keys.size(),
                                          img.rows.size()));
  }
  for (size_t i = 0; i < img.keys.size(); ++i) {
    if (find(img.keys[i]) != nullptr) {
      // A table is whole or empty.
      std::fill(slots_, slots_ + mask_ + 1, Slot{0, -1});
      rows_ = 0;
      chunks_.clear();
      hugeFromRow_ = std::numeric_limits<int64_t>::max();
      smallChunks_ = 0;
      chunkBytes_ = 0;
      return Status::corruption(fmt::format("table {}: key {} twice", img.tableId, img.keys[i]));
    }
    std::memcpy(findOrCreate(img.keys[i]), img.rows.data() + i * size_t(rowFloats_), size_t(rowFloats_) * sizeof(float));
  }
  return Status::ok();
}

const float* EmbeddingTable::find(uint64_t key) const {
  uint64_t i = mix64(key) & mask_;
  for (;;) {
    const Slot& s = slots_[i];
    if (s.row < 0) return nullptr;
    if (s.key == key) return rowAt(s.row);
    i = (i + 1) & mask_;
  }
}

namespace {

// The first 256 bytes of a row (the hardware prefetcher follows a longer one).
inline void prefetchRow(const float* row, size_t bytes) {
  const char* p = reinterpret_cast<const char*>(row);
  for (size_t b = 0; b < std::min<size_t>(bytes, 256); b += 64) __builtin_prefetch(p + b);
}

}  // namespace

void EmbeddingTable::prefetchSlot(const uint64_t* keys, int64_t i, int64_t n) const {
  if (i + kSlotAhead < n) __builtin_prefetch(&slots_[mix64(keys[i + kSlotAhead]) & mask_]);
}

void EmbeddingTable::pull(const uint64_t* keys, int64_t n, float* out, bool remember) {
  pulledKeys_.clear();  // (first: pullRows_ changes below)
  const size_t rowBytes = size_t(options_.dim) * sizeof(float);
  pullRows_.resize(size_t(n));
  for (int64_t i = 0; i < n; ++i) {
    prefetchSlot(keys, i, n);
    pullRows_[size_t(i)] = findOrCreate(keys[i]);
  }
  for (int64_t i = 0; i < n; ++i) {
    if (i + kRowAhead < n) prefetchRow(pullRows_[size_t(i + kRowAhead)], rowBytes);
    std::memcpy(out + i * options_.dim, pullRows_[size_t(i)], rowBytes);
  }
  if (remember) pulledKeys_.assign(keys, keys + n);
}

void EmbeddingTable::peek(const uint64_t* keys, int64_t n, float* out) const {
  const int64_t dim = options_.dim;
  std::vector<const float*> rows(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    prefetchSlot(keys, i, n);
    rows[size_t(i)] = find(keys[i]);
  }
  for (int64_t i = 0; i < n; ++i) {
    if (i + kRowAhead < n && rows[size_t(i + kRowAhead)]) prefetchRow(rows[size_t(i + kRowAhead)], size_t(dim) * sizeof(float));
    if (const float* row = rows[size_t(i)]) {
      std::memcpy(out + i * dim, row, size_t(dim) * sizeof(float));
    } else {
      initialWeights(options_.seed, options_.tableId, keys[i], initScale_, out + i * dim, dim);
    }
  }
}

Expected<int64_t> EmbeddingTable::preparePush(const uint64_t* keys, const float* grads, int64_t n,
                                              kernels::Kernels& kernels, bool keysUnique) {
  const int64_t dim = options_.dim;
  rowPtrs_.clear();
  preparedGrads_ = nullptr;
  if (n < 0) return Status::invalidArgument(fmt::format("push of {} keys", n));
  if (n == 0) return int64_t{0};
  const uint64_t* rowKeys = keys;
  int64_t unique = n;
  if (keysUnique) {
    preparedGrads_ = grads;  // dedupGradients would copy each (first and only) row as it is
    if (pulledLast(keys, n)) {
      rowPtrs_.assign(pullRows_.begin(), pullRows_.end());  // the rows the pull of these keys found
      return n;
    }
  } else {
    uniqueKeys_.resize(size_t(n));
    summed_.resize(size_t(n * dim));
    inverse_.resize(size_t(n));
    auto counted = kernels.dedupGradients(keys, grads, n, dim, uniqueKeys_.data(), summed_.data(), inverse_.data());
    if (!counted.hasValue()) return counted.status();
    rowKeys = uniqueKeys_.data();
    unique = *counted;
    preparedGrads_ = summed_.data();
  }
  rowPtrs_.resize(size_t(unique));
  for (int64_t u = 0; u < unique; ++u) {
    prefetchSlot(rowKeys, u, unique);
    rowPtrs_[u] = findOrCreate(rowKeys[u]);
  }
  return unique;
}

Status EmbeddingTable::push(const uint64_t* keys, const float* grads, int64_t n, int64_t step,
                            kernels::Kernels& kernels, float lrScale, bool keysUnique) {
  auto unique = preparePush(keys, grads, n, kernels, keysUnique);
  if (!unique.hasValue()) return unique.status();
  if (*unique == 0) return Status::ok();
  kernels::OptimizerConfig config = options_.optimizer;
  config.step = step;
  config.learningRate *= lrScale;
  Status applied = kernels.applyRowOptimizer(config, rowPtrs_.data(), *unique, options_.dim, preparedGrads_);
  preparedGrads_ = nullptr;  // (it may point into the caller's gradients)
  return applied;
}

}  // namespace troupe::ps
