#include "data/libsvm_reader.h"

#include <charconv>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "common/logging.h"
#include "data/internal/line_source.h"

namespace troupe::data {
namespace {

bool isSpace(char c) { return c == ' ' || c == '\t'; }

// Parses a whole token as a float ("+1" allowed, unlike from_chars alone).
bool parseFloat(std::string_view s, float* out) {
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  if (s.empty()) return false;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && ptr == s.data() + s.size() && std::isfinite(*out);
}

struct ParseError {
  std::string what;
  std::string_view token;
};

// Appends one row to *batch; on failure leaves *batch as it was.
bool parseLibsvmLine(std::string_view line, LibsvmLabels labels, LibsvmBatch* batch,
                     ParseError* err) {
  const size_t entriesBefore = batch->indices.size();
  size_t i = 0;
  auto nextToken = [&]() {
    while (i < line.size() && isSpace(line[i])) ++i;
    const size_t start = i;
    while (i < line.size() && !isSpace(line[i])) ++i;
    return line.substr(start, i - start);
  };
  const std::string_view labelText = nextToken();
  float label = 0.0f;
  if (!parseFloat(labelText, &label)) {
    *err = {"label is not a number", labelText};
    return false;
  }
  if (labels == LibsvmLabels::kBinary) {
    if (label == 1.0f) {
      label = 1.0f;
    } else if (label == 0.0f || label == -1.0f) {
      label = 0.0f;
    } else {
      *err = {"binary label must be 0, 1, -1 or +1", labelText};
      return false;
    }
  }
  for (;;) {
    const std::string_view tok = nextToken();
    if (tok.empty() || tok.front() == '#') break;
    const size_t colon = tok.find(':');
    if (colon == std::string_view::npos) {
      batch->indices.resize(entriesBefore);
      batch->values.resize(entriesBefore);
      *err = {"feature is not idx:value", tok};
      return false;
    }
    uint64_t index = 0;
    const std::string_view idxText = tok.substr(0, colon);
    const auto [ptr, ec] = std::from_chars(idxText.data(), idxText.data() + idxText.size(), index);
    float value = 0.0f;
    const bool indexOk = !idxText.empty() && ec == std::errc() && ptr == idxText.data() + idxText.size();
    if (!indexOk || !parseFloat(tok.substr(colon + 1), &value)) {
      batch->indices.resize(entriesBefore);
      batch->values.resize(entriesBefore);
      *err = {indexOk ? "feature value is not a finite number"
                      : "feature index is not a non-negative integer",
              tok};
      return false;
    }
    batch->indices.push_back(index);
    batch->values.push_back(value);
  }
  batch->labels.push_back(label);
  batch->rowOffsets.push_back(int64_t(batch->indices.size()));
  return true;
}

bool blankOrComment(std::string_view line) {
  for (char c : line) {
    if (c == '#') return true;
    if (!isSpace(c)) return false;
  }
  return true;
}

}  // namespace

struct LibsvmReader::Impl {
  internal::LineSource source;
  std::shared_ptr<spdlog::logger> log;
};

Expected<std::unique_ptr<LibsvmReader>> LibsvmReader::open(const LibsvmReaderOptions& options) {
  auto source = internal::LineSource::open(options.path, options.bufferBytes, options.maxLineBytes);
  if (!source) return source.status();
  auto impl = std::make_unique<Impl>(Impl{std::move(source).value(), logger("data")});
  return std::unique_ptr<LibsvmReader>(new LibsvmReader(std::move(impl), options));
}

LibsvmReader::LibsvmReader(std::unique_ptr<Impl> impl, const LibsvmReaderOptions& options)
    : impl_(std::move(impl)), options_(options) {}

LibsvmReader::~LibsvmReader() = default;

int64_t LibsvmReader::lineNumber() const { return impl_->source.lineNumber(); }

Status LibsvmReader::rewind() {
  rowsRead_ = 0;
  badLines_ = 0;
  return impl_->source.rewind();
}

Expected<size_t> LibsvmReader::next(size_t batchRows, LibsvmBatch* batch) {
  batch->clear();
  size_t maxRows = batchRows;
  if (options_.maxRows >= 0) {
    maxRows = std::min<size_t>(maxRows, size_t(std::max<int64_t>(options_.maxRows - rowsRead_, 0)));
  }
  auto& source = impl_->source;
  std::string_view line;
  while (batch->rows() < maxRows) {
    auto kind = source.next(&line);
    if (!kind) return kind.status();
    if (*kind == internal::LineSource::Kind::kEnd) break;
    std::string why;
    if (*kind == internal::LineSource::Kind::kTooLong) {
      why = fmt::format("line longer than {} bytes", source.maxLineBytes());
    } else {
      if (blankOrComment(line)) continue;
      ParseError err;
      if (parseLibsvmLine(line, options_.labels, batch, &err)) {
        ++rowsRead_;
        continue;
      }
      why = fmt::format("{}, token {}", err.what, internal::quoteToken(err.token));
    }
    std::string message = internal::lineError(source.path(), source.lineNumber(), why);
    if (!options_.skipBadLines) return Status::corruption(std::move(message));
    ++badLines_;
    if (badLines_ <= options_.logBadLines) {
      impl_->log->warn("skipping bad line: {}", message);
    }
  }
  return batch->rows();
}

}  // namespace troupe::data
