#include "workers/batch_source.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "common/check.h"
#include "common/hash.h"
#include "data/criteo_reader.h"
#include "data/idx_reader.h"

namespace troupe::workers {
namespace {

class CriteoSource final : public BatchSource {
 public:
  CriteoSource(const CriteoSourceOptions& options, std::unique_ptr<data::CriteoReader> reader, int64_t rows)
      : options_(options), reader_(std::move(reader)), rowsPerEpoch_(rows) {}

  Status startEpoch(int64_t) override {
    index_ = 0;
    firstRow_ = 0;
    fromFile_ = !cacheComplete_;
    if (cacheComplete_) return Status::ok();
    cache_.clear();
    batchRows_.clear();
    return reader_->rewind();
  }

  Expected<BatchPtr> next() override {
    if (!fromFile_) {
      if (index_ >= int64_t(cache_.size())) return BatchPtr();
      if (BatchPtr b = cache_[size_t(index_)]) {
        ++index_;
        return b;  // shared, not copied
      }
      // Skipped on the first pass (another share's then): read it now.
      if (Status s = seekToBatch(index_); !s) return s;
    } else if (cacheComplete_ && index_ < int64_t(cache_.size()) && cache_[size_t(index_)]) {
      // Reading the file after a hole, a cached batch is passed over.
      auto got = passOver();
      if (!got.hasValue()) return got.status();
      return cache_[size_t(index_++)];
    }
    auto got = reader_->next(size_t(options_.batchSize), &scratch_);
    if (!got.hasValue()) return got.status();
    if (Status s = sameAsFirstPass(int64_t(*got)); !s) return s;
    if (*got == 0) return endOfFile();
    auto b = std::make_shared<Batch>();
    b->index = index_;
    b->firstRow = firstRow_;
    b->rows = int64_t(*got);
    firstRow_ += b->rows;
    b->labels = std::move(scratch_.labels);
    b->denseWidth = data::kCriteoIntFeatures;
    b->dense = std::move(scratch_.dense);
    b->numTables = options_.numCategorical;
    b->keys = std::move(scratch_.keys);
    scratch_ = data::CriteoBatch{};
    scratch_.numCategorical = options_.numCategorical;
    BatchPtr ptr(std::move(b));
    remember(ptr, ptr->rows);
    ++index_;
    return ptr;
  }

  Expected<bool> skip() override {
    if (!fromFile_) {
      if (index_ >= int64_t(cache_.size())) return false;
      ++index_;
      return true;
    }
    auto got = passOver();
    if (!got.hasValue()) return got.status();
    if (*got == 0) {
      auto end = endOfFile();
      if (!end.hasValue()) return end.status();
      return false;
    }
    remember(nullptr, *got);
    ++index_;
    return true;
  }

  int64_t rowsPerEpoch() const override { return rowsPerEpoch_; }
  // (Reading holes later rewinds the reader, which counts again from 0.)
  int64_t badLines() const override { return std::max(reader_->badLines(), firstPassBadLines_); }

 private:
  // After the first pass, batch index_ must read as it did then (0 rows:
  // past the end); else the file changed under the cache.
  Status sameAsFirstPass(int64_t rows) const {
    if (!cacheComplete_) return Status::ok();
    const int64_t then = index_ < int64_t(batchRows_.size()) ? batchRows_[size_t(index_)] : 0;
    if (rows == then) return Status::ok();
    return Status::corruption(fmt::format(
        "{}: batch {} now reads {} rows where the first pass read {}: the file changed while training",
        options_.path, index_, rows, then));
  }

  // The reader's end of the data: the epoch's row count is known now, and
  // the cache (every batch, the skipped ones as holes) is complete.
  Expected<BatchPtr> endOfFile() {
    if (options_.inMemory && !cacheComplete_) {
      cacheComplete_ = true;
      firstPassBadLines_ = reader_->badLines();
    }
    rowsPerEpoch_ = firstRow_;
    fromFile_ = !cacheComplete_;
    return BatchPtr();
  }

  // Keeps batch index_ (nullptr: skipped) and its row count while the
  // cache is filled, and fills a hole read later (a cached batch is never
  // read again).
  void remember(BatchPtr b, int64_t rows) {
    if (!options_.inMemory) return;
    if (!cacheComplete_) {
      TROUPE_CHECK(int64_t(cache_.size()) == index_, "cache of {} batches at batch {}", cache_.size(), index_);
      cache_.push_back(std::move(b));
      batchRows_.push_back(rows);
    } else if (b && index_ < int64_t(cache_.size())) {
      cache_[size_t(index_)] = std::move(b);
    }
  }

  // Replaying the cache, batch `batch` was never parsed: read the rest of
  // the epoch from the file from there (skipping, unparsed, up to it).
  Status seekToBatch(int64_t batch) {
    if (Status s = reader_->rewind(); !s) return s;
    fromFile_ = true;
    index_ = 0;
    firstRow_ = 0;
    while (index_ < batch) {
      auto got = passOver();
      if (!got.hasValue()) return got.status();
      ++index_;
    }
    return Status::ok();
  }

  // Passes over batch index_ in the file, unparsed, checked against the
  // first pass: its rows (0 at the end of the data).
  Expected<int64_t> passOver() {
    auto got = reader_->skip(size_t(options_.batchSize));
    if (!got.hasValue()) return got.status();
    if (Status s = sameAsFirstPass(int64_t(*got)); !s) return s;
    firstRow_ += int64_t(*got);
    return int64_t(*got);
  }

  CriteoSourceOptions options_;
  std::unique_ptr<data::CriteoReader> reader_;
  int64_t rowsPerEpoch_;
  data::CriteoBatch scratch_;
  // With inMemory: batch i of the epoch, or nullptr where it was skipped,
  // and the rows of each as the first pass read them.
  std::vector<BatchPtr> cache_;
  std::vector<int64_t> batchRows_;
  bool cacheComplete_ = false;
  bool fromFile_ = true;  // this epoch's batches come from the reader (not the cache)
  int64_t firstPassBadLines_ = 0;
  int64_t index_ = 0, firstRow_ = 0;
};

class MnistSource final : public BatchSource {
 public:
  MnistSource(const MnistSourceOptions& options, data::IdxDataset dataset)
      : options_(options), data_(std::move(dataset)), order_(size_t(data_.count)) {
    std::iota(order_.begin(), order_.end(), 0);
  }

  Status startEpoch(int64_t epoch) override {
    index_ = 0;
    std::iota(order_.begin(), order_.end(), 0);
    if (options_.shuffle) {
      Rng rng(hashCombine(options_.seed, 0x73687566ULL, uint64_t(epoch)));
      for (size_t i = order_.size(); i > 1; --i) std::swap(order_[i - 1], order_[rng.below(i)]);
    }
    return Status::ok();
  }

  Expected<BatchPtr> next() override {
    const int64_t first = index_ * options_.batchSize;
    if (first >= data_.count) return BatchPtr();
    const int64_t rows = std::min(options_.batchSize, data_.count - first);
    const int64_t width = int64_t(data_.rows) * data_.cols;
    auto b = std::make_shared<Batch>();
    b->index = index_++;
    b->firstRow = first;
    b->rows = rows;
    b->denseWidth = width;
    b->dense.resize(size_t(rows * width));
    b->classes.resize(size_t(rows));
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t src = order_[size_t(first + r)];
      std::memcpy(b->dense.data() + r * width, data_.images.data() + src * width, size_t(width) * sizeof(float));
      b->classes[size_t(r)] = data_.labels[size_t(src)];
    }
    return BatchPtr(std::move(b));
  }

  int64_t rowsPerEpoch() const override { return data_.count; }

 private:
  MnistSourceOptions options_;
  data::IdxDataset data_;
  std::vector<int64_t> order_;
  int64_t index_ = 0;
};

}  // namespace

Expected<std::unique_ptr<BatchSource>> openCriteoSource(const CriteoSourceOptions& options) {
  if (options.batchSize < 1) TROUPE_SETUP_ERROR("batch size must be >= 1, got {}", options.batchSize);
  data::CriteoReaderOptions ro;
  ro.path = options.path;
  ro.numCategorical = options.numCategorical;
  ro.skipBadLines = options.skipBadLines;
  ro.maxRows = options.maxRows;
  auto reader = data::CriteoReader::open(ro);
  if (!reader.hasValue()) return reader.status();
  auto rows = data::countTextRows(options.path);
  if (!rows.hasValue()) return rows.status();
  int64_t n = *rows;
  if (options.maxRows >= 0) n = std::min(n, options.maxRows);
  return std::unique_ptr<BatchSource>(new CriteoSource(options, std::move(*reader), n));
}

Expected<std::unique_ptr<BatchSource>> openMnistSource(const MnistSourceOptions& options) {
  if (options.batchSize < 1) TROUPE_SETUP_ERROR("batch size must be >= 1, got {}", options.batchSize);
  auto dataset = data::readIdxDataset(options.imagesPath, options.labelsPath);
  if (!dataset.hasValue()) return dataset.status();
  if (options.maxRows >= 0 && options.maxRows < dataset->count) {
    dataset->count = options.maxRows;
    dataset->images.resize(size_t(options.maxRows) * size_t(dataset->rows) * size_t(dataset->cols));
    dataset->labels.resize(size_t(options.maxRows));
  }
  return std::unique_ptr<BatchSource>(new MnistSource(options, std::move(*dataset)));
}

namespace {

class EveryNth final : public BatchSource {
 public:
  EveryNth(std::shared_ptr<BatchSource> inner, int64_t part, int64_t parts)
      : inner_(std::move(inner)), part_(part), parts_(parts) {}
  Status startEpoch(int64_t epoch) override {
    index_ = 0;
    epoch_ = epoch;
    return inner_->startEpoch(epoch);
  }
  Expected<BatchPtr> next() override {
    // In the epoch of the division, batches before its first are others'.
    const int64_t from = epoch_ == fromEpoch_ ? fromBatch_ : 0;
    for (;;) {
      const int64_t i = index_;
      if (i >= from && (i - from) % parts_ == part_) {
        auto b = inner_->next();
        if (b.hasValue()) ++index_;
        return b;
      }
      auto skipped = inner_->skip();  // another share's: not parsed
      if (!skipped.hasValue()) return skipped.status();
      if (!*skipped) return BatchPtr();
      ++index_;
    }
  }
  int64_t rowsPerEpoch() const override {
    return inner_->rowsPerEpoch() / parts_;  // about: the last batches may fall to fewer parts
  }
  int64_t badLines() const override { return inner_->badLines(); }
  Status reshare(int64_t epoch, int64_t fromBatch, int64_t part, int64_t parts) override {
    if (epoch < 0 || fromBatch < 0 || parts < 1 || part < 0 || part >= parts) {
      return Status::invalidArgument(fmt::format("a share of the data: part {} of {} from batch {} of epoch {}", part,
                                                 parts, fromBatch, epoch));
    }
    fromEpoch_ = epoch;
    fromBatch_ = fromBatch;
    part_ = part;
    parts_ = parts;
    return Status::ok();
  }

 private:
  std::shared_ptr<BatchSource> inner_;
  int64_t part_, parts_;
  int64_t fromEpoch_ = 0, fromBatch_ = 0;
  int64_t index_ = 0, epoch_ = 0;
};

}  // namespace

Expected<bool> BatchSource::skip() {
  auto b = next();
  if (!b.hasValue()) return b.status();
  return bool(*b);
}

Status BatchSource::reshare(int64_t, int64_t, int64_t, int64_t) {
  return Status::invalidArgument("this data source is not a share of the data (everyNthBatch)");
}

std::unique_ptr<BatchSource> everyNthBatch(std::shared_ptr<BatchSource> inner, int64_t part, int64_t parts) {
  return std::make_unique<EveryNth>(std::move(inner), part, std::max<int64_t>(parts, 1));
}

}  // namespace troupe::workers
