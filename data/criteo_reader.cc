#include "data/criteo_reader.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "common/check.h"
#include "common/hash.h"
#include "common/logging.h"
#include "data/internal/line_source.h"

namespace troupe::data {
namespace {

constexpr uint64_t kKeySalt = 0x637269746f6b6579ULL;      // "critokey"
constexpr uint64_t kMissingSalt = 0x6d697373696e6721ULL;  // "missing!"

uint64_t tableSeed(int table) { return hashCombine(kKeySalt, uint64_t(table)); }

// Parses one line into the row slots; on failure returns false and says why.
// Without kStore it only checks the line (no hashing, no transform) and
// writes nothing: how a reader skips a line whose row is another's.
template <bool kStore>
bool parseCriteoLine(std::string_view line, int numCategorical, const uint64_t* seeds,
                     float* label, float* dense, uint64_t* keys, std::string* why) {
  const size_t expected = size_t(1 + kCriteoIntFeatures + numCategorical);
  const size_t found = size_t(std::count(line.begin(), line.end(), '\t')) + 1;
  if (found != expected) {
    *why = fmt::format("expected {} tab-separated fields, found {}", expected, found);
    return false;
  }
  const char* p = line.data();
  const char* const end = p + line.size();
  auto nextField = [&]() {
    const char* tab = static_cast<const char*>(std::memchr(p, '\t', size_t(end - p)));
    const char* stop = tab ? tab : end;
    std::string_view field(p, size_t(stop - p));
    p = tab ? tab + 1 : end;
    return field;
  };

  const std::string_view labelText = nextField();
  if (labelText == "0" || labelText == "1") {
    if constexpr (kStore) *label = labelText[0] == '1' ? 1.0f : 0.0f;
  } else {
    *why = fmt::format("label must be 0 or 1, found {}", internal::quoteToken(labelText));
    return false;
  }
  for (int j = 0; j < kCriteoIntFeatures; ++j) {
    const std::string_view f = nextField();
    if (f.empty()) {
      if constexpr (kStore) dense[j] = 0.0f;
      continue;
    }
    int64_t x = 0;
    const auto [ptr, ec] = std::from_chars(f.data(), f.data() + f.size(), x);
    if (ec == std::errc::result_out_of_range) {
      *why = fmt::format("integer column I{} (field {}): {} is out of the 64-bit range", j + 1,
                         j + 2, internal::quoteToken(f));
      return false;
    }
    if (ec != std::errc() || ptr != f.data() + f.size()) {
      *why = fmt::format("integer column I{} (field {}): {} is not an integer", j + 1, j + 2,
                         internal::quoteToken(f));
      return false;
    }
    if constexpr (kStore) dense[j] = criteoDenseTransform(x);
  }
  if constexpr (kStore) {
    for (int t = 0; t < numCategorical; ++t) {
      const std::string_view f = nextField();
      keys[t] = f.empty() ? mix64(seeds[t] ^ kMissingSalt) : hashBytes(f, seeds[t]);
    }
  }
  return true;
}

}  // namespace

uint64_t criteoKey(int table, std::string_view token) { return hashBytes(token, tableSeed(table)); }

uint64_t criteoMissingKey(int table) { return mix64(tableSeed(table) ^ kMissingSalt); }

float criteoDenseTransform(int64_t x) { return float(std::log1p(double(std::max<int64_t>(x, 0)))); }

struct CriteoReader::Impl {
  internal::LineSource source;
  std::vector<uint64_t> seeds;
  std::shared_ptr<spdlog::logger> log;
};

Expected<std::unique_ptr<CriteoReader>> CriteoReader::open(const CriteoReaderOptions& options) {
  if (options.numCategorical < 1) {
    TROUPE_SETUP_ERROR("CriteoReader: numCategorical must be >= 1, got {}", options.numCategorical);
  }
  auto source = internal::LineSource::open(options.path, options.bufferBytes, options.maxLineBytes);
  if (!source) return source.status();
  auto impl = std::make_unique<Impl>(Impl{std::move(source).value(), {}, logger("data")});
  impl->seeds.resize(size_t(options.numCategorical));
  for (int t = 0; t < options.numCategorical; ++t) impl->seeds[size_t(t)] = tableSeed(t);
  return std::unique_ptr<CriteoReader>(new CriteoReader(std::move(impl), options));
}

CriteoReader::CriteoReader(std::unique_ptr<Impl> impl, const CriteoReaderOptions& options)
    : impl_(std::move(impl)), options_(options) {}

CriteoReader::~CriteoReader() = default;

int64_t CriteoReader::lineNumber() const { return impl_->source.lineNumber(); }

Status CriteoReader::rewind() {
  rowsRead_ = 0;
  badLines_ = 0;
  return impl_->source.rewind();
}

Expected<size_t> CriteoReader::next(size_t batchRows, CriteoBatch* batch) {
  const size_t c = size_t(options_.numCategorical);
  batch->clear();
  batch->numCategorical = options_.numCategorical;
  const size_t maxRows = rowsAllowed(batchRows);
  // Reserve for the common case; a huge maxRows grows as rows arrive.
  const size_t reserveRows = std::min<size_t>(maxRows, 1 << 16);
  batch->labels.reserve(reserveRows);
  batch->dense.reserve(reserveRows * kCriteoIntFeatures);
  batch->keys.reserve(reserveRows * c);

  auto& source = impl_->source;
  std::string why;
  std::string_view line;
  while (batch->rows() < maxRows) {
    auto kind = source.next(&line);
    if (!kind) return kind.status();
    if (*kind == internal::LineSource::Kind::kEnd) break;
    bool good = false;
    if (*kind == internal::LineSource::Kind::kTooLong) {
      why = fmt::format("line longer than {} bytes", source.maxLineBytes());
    } else {
      const size_t row = batch->rows();
      batch->labels.resize(row + 1);
      batch->dense.resize((row + 1) * kCriteoIntFeatures);
      batch->keys.resize((row + 1) * c);
      good = parseCriteoLine<true>(line, options_.numCategorical, impl_->seeds.data(),
                             &batch->labels[row], &batch->dense[row * kCriteoIntFeatures],
                             &batch->keys[row * c], &why);
      if (!good) {
        batch->labels.resize(row);
        batch->dense.resize(row * kCriteoIntFeatures);
        batch->keys.resize(row * c);
      }
    }
    if (good) {
      ++rowsRead_;
      continue;
    }
    if (Status s = badLine(why); !s) return s;
  }
  return batch->rows();
}

size_t CriteoReader::rowsAllowed(size_t batchRows) const {
  if (options_.maxRows < 0) return batchRows;
  return std::min<size_t>(batchRows, size_t(std::max<int64_t>(options_.maxRows - rowsRead_, 0)));
}

Status CriteoReader::badLine(const std::string& why) {
  auto& source = impl_->source;
  std::string message = internal::lineError(source.path(), source.lineNumber(), why);
  if (!options_.skipBadLines) return Status::corruption(std::move(message));
  ++badLines_;
  // (Each of the first few is logged once, however often the file is read.)
  if (badLines_ <= options_.logBadLines && badLines_ > loggedBadLines_) {
    loggedBadLines_ = badLines_;
    impl_->log->warn("skipping bad line: {}{}", message,
                     badLines_ == options_.logBadLines ? " (further bad lines are counted, not logged)" : "");
  }
  return Status::ok();
}

Expected<size_t> CriteoReader::skip(size_t batchRows) {
  const size_t maxRows = rowsAllowed(batchRows);
  auto& source = impl_->source;
  std::string why;
  std::string_view line;
  size_t rows = 0;
  while (rows < maxRows) {
    auto kind = source.next(&line);
    if (!kind) return kind.status();
    if (*kind == internal::LineSource::Kind::kEnd) break;
    // Failing on bad lines, every line is a row (the reader that parses it
    // fails on it); skipping them, only a good line is, so check it.
    bool good = !options_.skipBadLines;
    if (!good) {
      if (*kind == internal::LineSource::Kind::kTooLong) {
        why = fmt::format("line longer than {} bytes", source.maxLineBytes());
      } else {
        good = parseCriteoLine<false>(line, options_.numCategorical, nullptr, nullptr, nullptr, nullptr, &why);
      }
    }
    if (good) {
      ++rows;
      ++rowsRead_;
      continue;
    }
    if (Status s = badLine(why); !s) return s;
  }
  return rows;
}

Expected<int64_t> countBadCriteoLines(const std::string& path, int numCategorical, int64_t maxRows) {
  CriteoReaderOptions o;
  o.path = path;
  o.maxRows = maxRows;
  o.numCategorical = numCategorical;
  o.skipBadLines = true;
  o.logBadLines = 0;
  auto reader = CriteoReader::open(o);
  if (!reader.hasValue()) return reader.status();
  CriteoBatch batch;
  for (;;) {
    auto n = (*reader)->next(4096, &batch);
    if (!n.hasValue()) return n.status();
    if (*n == 0) break;
  }
  return (*reader)->badLines();
}

Expected<int64_t> countTextRows(const std::string& path) {
  auto source = internal::LineSource::open(path, 4 * 1024 * 1024, 1024 * 1024);
  if (!source) return source.status();
  int64_t rows = 0;
  std::string_view line;
  for (;;) {
    auto kind = source->next(&line);
    if (!kind) return kind.status();
    if (*kind == internal::LineSource::Kind::kEnd) return rows;
    if (*kind == internal::LineSource::Kind::kTooLong || !line.empty()) ++rows;
  }
}

}  // namespace troupe::data
