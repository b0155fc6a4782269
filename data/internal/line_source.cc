#include "data/internal/line_source.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include <fmt/format.h>

namespace troupe::data::internal {

Expected<LineSource> LineSource::open(const std::string& path, size_t bufferBytes,
                                      size_t maxLineBytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    std::string msg = fmt::format("cannot open '{}': {}", path, std::strerror(err));
    return err == ENOENT ? Status::notFound(std::move(msg)) : Status::ioError(std::move(msg));
  }
  return LineSource(fd, path, bufferBytes, maxLineBytes);
}

LineSource::LineSource(int fd, std::string path, size_t bufferBytes, size_t maxLineBytes)
    : fd_(fd), path_(std::move(path)), maxLineBytes_(std::max<size_t>(maxLineBytes, 1)) {
  // Room for a whole line of the maximum length plus its "\r\n".
  buf_.resize(std::max(bufferBytes, 2 * maxLineBytes_ + 2));
}

LineSource::LineSource(LineSource&& other) noexcept { *this = std::move(other); }

LineSource& LineSource::operator=(LineSource&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
    maxLineBytes_ = other.maxLineBytes_;
    buf_ = std::move(other.buf_);
    pos_ = other.pos_;
    end_ = other.end_;
    eof_ = other.eof_;
    lineNumber_ = other.lineNumber_;
  }
  return *this;
}

LineSource::~LineSource() {
  if (fd_ >= 0) ::close(fd_);
}

Status LineSource::fill() {
  while (end_ < buf_.size()) {
    const ssize_t n = ::read(fd_, buf_.data() + end_, buf_.size() - end_);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::ioError(fmt::format("{}: read failed after line {}: {}", path_, lineNumber_,
                                         std::strerror(errno)));
    }
    if (n == 0) {
      eof_ = true;
      break;
    }
    end_ += size_t(n);
    // One successful read is enough; the caller asks again if it needs more.
    break;
  }
  return Status::ok();
}

Status LineSource::skipRestOfLine() {
  for (;;) {
    const char* nl = static_cast<const char*>(std::memchr(buf_.data() + pos_, '\n', end_ - pos_));
    if (nl) {
      pos_ = size_t(nl - buf_.data()) + 1;
      return Status::ok();
    }
    pos_ = end_ = 0;
    if (eof_) return Status::ok();
    if (Status s = fill(); !s) return s;
  }
}

Expected<LineSource::Kind> LineSource::next(std::string_view* line) {
  for (;;) {
    const char* begin = buf_.data() + pos_;
    const char* nl = static_cast<const char*>(std::memchr(begin, '\n', end_ - pos_));
    if (nl || (eof_ && pos_ < end_)) {
      const char* stop = nl ? nl : buf_.data() + end_;
      pos_ = nl ? size_t(nl - buf_.data()) + 1 : end_;
      ++lineNumber_;
      size_t len = size_t(stop - begin);
      if (len > 0 && begin[len - 1] == '\r') --len;
      if (len > maxLineBytes_) return Kind::kTooLong;
      *line = std::string_view(begin, len);
      return Kind::kLine;
    }
    if (eof_) return Kind::kEnd;
    // Keep the partial line, make room, read more.
    const size_t partial = end_ - pos_;
    if (partial > maxLineBytes_ + 1) {
      ++lineNumber_;
      pos_ = end_;
      if (Status s = skipRestOfLine(); !s) return s;
      return Kind::kTooLong;
    }
    if (pos_ > 0) {
      std::memmove(buf_.data(), buf_.data() + pos_, partial);
      pos_ = 0;
      end_ = partial;
    }
    if (Status s = fill(); !s) return s;
  }
}

Status LineSource::rewind() {
  if (::lseek(fd_, 0, SEEK_SET) < 0) {
    return Status::ioError(fmt::format("{}: cannot rewind: {}", path_, std::strerror(errno)));
  }
  pos_ = end_ = 0;
  eof_ = false;
  lineNumber_ = 0;
  return Status::ok();
}

std::string lineError(const std::string& path, int64_t line, std::string_view what) {
  return fmt::format("{}:{}: {}", path, line, what);
}

std::string quoteToken(std::string_view token) {
  std::string out = "'";
  const size_t n = std::min<size_t>(token.size(), 40);
  for (size_t i = 0; i < n; ++i) {
    const unsigned char c = static_cast<unsigned char>(token[i]);
    if (c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += char(c);
    }
  }
  if (token.size() > n) out += "...";
  out += "'";
  return out;
}

}  // namespace troupe::data::internal
