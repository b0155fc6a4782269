// LineSource: reads a text file line by line through one large buffer
// (read(2) in big chunks, memchr for '\n'), the shared front end of the text
// readers. A line handed out is a view into the buffer, valid until the next
// call. "\r\n" endings lose their '\r'; a last line without '\n' is a line.
//
// Lines longer than maxLineBytes are reported as kTooLong (and skipped whole,
// through their '\n'), so a file without newlines cannot grow memory.
//
// Not thread-safe; one owner.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace troupe::data::internal {

class LineSource final {
 public:
  enum class Kind { kLine, kTooLong, kEnd };

  // Opens path; the error names the file and strerror.
  static Expected<LineSource> open(const std::string& path, size_t bufferBytes,
                                   size_t maxLineBytes);
  LineSource(LineSource&& other) noexcept;
  LineSource& operator=(LineSource&& other) noexcept;
  LineSource(const LineSource&) = delete;
  LineSource& operator=(const LineSource&) = delete;
  ~LineSource();

  // The next line into *line (kLine), a skipped over-long line (kTooLong; the
  // line number counts it), or the end of the file (kEnd). An I/O error is an
  // ioError naming the file and the line number.
  Expected<Kind> next(std::string_view* line);

  // Back to the start of the file (line number 0).
  Status rewind();

  // 1-based number of the line last returned (0 before the first).
  int64_t lineNumber() const { return lineNumber_; }
  const std::string& path() const { return path_; }
  size_t maxLineBytes() const { return maxLineBytes_; }

 private:
  LineSource(int fd, std::string path, size_t bufferBytes, size_t maxLineBytes);
  // Appends to buf_[end_, ...); sets eof_ at the end of the file.
  Status fill();
  // Consumes input through the next '\n' (or the end of the file).
  Status skipRestOfLine();

  int fd_ = -1;
  std::string path_;
  size_t maxLineBytes_ = 0;
  std::vector<char> buf_;
  size_t pos_ = 0;
  size_t end_ = 0;
  bool eof_ = false;
  int64_t lineNumber_ = 0;
};

// "path:line: what" — the one shape of every parse error in data/.
std::string lineError(const std::string& path, int64_t line, std::string_view what);

// A short printable excerpt of a token for error messages (at most 40 bytes,
// control bytes escaped).
std::string quoteToken(std::string_view token);

}  // namespace troupe::data::internal
