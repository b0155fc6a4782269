// Invariant checks and set-up errors (STYLE.md, Errors).
//
// TROUPE_CHECK(cond, fmt, args...): a broken invariant; logs the condition,
// file:line and the formatted message, then aborts. Always on.
//
// SetupError: bad configuration or API misuse found while setting up. Thrown
// with the values involved; the CLI turns it into one line and exit status 2.
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace troupe {

class SetupError : public std::runtime_error {
 public:
  SetupError(std::string message, const char* file, int line)
      : std::runtime_error(std::move(message)), file_(file), line_(line) {}
  // Where in troupe's source the error was raised (for debug logs).
  const char* file() const { return file_; }
  int line() const { return line_; }

 private:
  const char* file_;
  int line_;
};

namespace detail {
[[noreturn]] void checkFailed(const char* cond, const char* file, int line, const std::string& msg);
}  // namespace detail

}  // namespace troupe

#define TROUPE_CHECK(cond, ...)                                                       \
  do {                                                                                \
    if (!(cond)) [[unlikely]] {                                                       \
      ::troupe::detail::checkFailed(#cond, __FILE__, __LINE__, ::fmt::format(__VA_ARGS__)); \
    }                                                                                 \
  } while (0)

// Throws SetupError with a formatted message.
#define TROUPE_SETUP_ERROR(...) \
  throw ::troupe::SetupError(::fmt::format(__VA_ARGS__), __FILE__, __LINE__)
