#include "ps/embedding_table.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "common/check.h"
#include "common/logging.h"
#include "common/hash.h"
#include "kernels/kernels.h"

namespace troupe::ps {

void EmbeddingTable::FreeDeleter::operator()(float* p) const { std::free(p); }

EmbeddingTable::EmbeddingTable(const EmbeddingTableOptions& options)
    : options_(options),
      rowFloats_(kernels::optimizerRowFloats(options.optimizer.kind, options.dim)),
      chunkRows_(std::clamp<int64_t>((int64_t{1} << 20) / std::max<int64_t>(rowFloats_, 1), 1, 4096)),
      initScale_(options.initScale > 0 ? options.initScale : float(1.0 / std::sqrt(double(options.dim)))) {
  if (options.dim < 1) TROUPE_SETUP_ERROR("embedding table {}: dim must be >= 1, got {}", options.tableId, options.dim);
  int64_t capacity = 16;
  while (capacity * 7 / 10 < options.initialCapacity) capacity *= 2;
  slots_.assign(size_t(capacity), Slot{0, -1});
  mask_ = uint64_t(capacity - 1);
}

EmbeddingTable::~EmbeddingTable() = default;

size_t EmbeddingTable::memoryBytes() const {
  return slots_.size() * sizeof(Slot) + chunks_.size() * size_t(chunkRows_ * rowFloats_) * sizeof(float);
}

void EmbeddingTable::initialWeights(uint64_t seed, int tableId, uint64_t key, float scale, float* out,
                                    int64_t dim) {
  Rng rng(hashCombine(seed, uint64_t(tableId) + 0x7461626c65ULL, key));
  for (int64_t i = 0; i < dim; ++i) out[i] = float((2.0 * rng.uniform() - 1.0) * scale);
}

int64_t EmbeddingTable::newRow(uint64_t key) {
  const int64_t row = rows_++;
  if (row / chunkRows_ >= int64_t(chunks_.size())) {
    const size_t bytes = size_t(chunkRows_ * rowFloats_) * sizeof(float);
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    TROUPE_CHECK(p != nullptr, "embedding table {}: out of memory allocating {} bytes", options_.tableId, bytes);
    chunks_.emplace_back(static_cast<float*>(p));
  }
  float* block = rowAt(row);
  initialWeights(options_.seed, options_.tableId, key, initScale_, block, options_.dim);
  kernels::initRowState(options_.optimizer, block, options_.dim);
  return row;
}

void EmbeddingTable::grow() {
  std::vector<Slot> old;
  old.swap(slots_);
  slots_.assign(old.size() * 2, Slot{0, -1});
  mask_ = slots_.size() - 1;
  for (const Slot& s : old) {
    if (s.row < 0) continue;
    uint64_t i = mix64(s.key) & mask_;
    while (slots_[i].row >= 0) i = (i + 1) & mask_;
    slots_[i] = s;
  }
}

float* EmbeddingTable::findOrCreate(uint64_t key) {
  if ((rows_ + 1) * 10 > int64_t(slots_.size()) * 7) grow();
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
  for (const Slot& s : slots_) {
    if (s.row >= 0) img.keys[size_t(s.row)] = s.key;
  }
  // One pass over fresh memory (no zero fill first): a checkpoint's pause
  // is mostly this copy.
  img.rows.reserve(size_t(rows_ * rowFloats_));
  for (int64_t r = 0; r < rows_; r += chunkRows_) {
    const int64_t n = std::min(chunkRows_, rows_ - r);
    const float* from = rowAt(r);
    img.rows.insert(img.rows.end(), from, from + n * rowFloats_);
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
      std::fill(slots_.begin(), slots_.end(), Slot{0, -1});
      rows_ = 0;
      chunks_.clear();
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

void EmbeddingTable::pull(const uint64_t* keys, int64_t n, float* out) {
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
                                              kernels::Kernels& kernels) {
  const int64_t dim = options_.dim;
  uniqueKeys_.resize(size_t(n));
  summed_.resize(size_t(n * dim));
  inverse_.resize(size_t(n));
  rowPtrs_.clear();
  if (n == 0) return int64_t{0};
  auto unique = kernels.dedupGradients(keys, grads, n, dim, uniqueKeys_.data(), summed_.data(), inverse_.data());
  if (!unique.hasValue()) return unique.status();
  rowPtrs_.resize(size_t(*unique));
  for (int64_t u = 0; u < *unique; ++u) {
    prefetchSlot(uniqueKeys_.data(), u, *unique);
    rowPtrs_[u] = findOrCreate(uniqueKeys_[u]);
  }
  return *unique;
}

Status EmbeddingTable::push(const uint64_t* keys, const float* grads, int64_t n, int64_t step,
                            kernels::Kernels& kernels, float lrScale) {
  auto unique = preparePush(keys, grads, n, kernels);
  if (!unique.hasValue()) return unique.status();
  if (*unique == 0) return Status::ok();
  kernels::OptimizerConfig config = options_.optimizer;
  config.step = step;
  config.learningRate *= lrScale;
  return kernels.applyRowOptimizer(config, rowPtrs_.data(), *unique, options_.dim, summed_.data());
}

}  // namespace troupe::ps
