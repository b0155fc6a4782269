// Status and Expected<T>: how runtime failures travel as values (STYLE.md,
// Errors). A Status is OK or carries a code and a message naming what went
// wrong; Expected<T> holds either a T or a non-OK Status.
#pragma once

#include <string>
#include <utility>
#include <variant>

#include "common/check.h"

namespace troupe {

class [[nodiscard]] Status {
 public:
  enum class Code {
    kOk = 0,
    kInvalidArgument,  // bad input: a file, a config, a message
    kNotFound,
    kIoError,
    kCorruption,       // data that fails a check (format, checksum)
    kTimeout,
    kUnavailable,      // a peer or resource is gone
    kInternal,
  };

  Status() = default;
  static Status ok() { return Status(); }
  static Status invalidArgument(std::string msg) { return {Code::kInvalidArgument, std::move(msg)}; }
  static Status notFound(std::string msg) { return {Code::kNotFound, std::move(msg)}; }
  static Status ioError(std::string msg) { return {Code::kIoError, std::move(msg)}; }
  static Status corruption(std::string msg) { return {Code::kCorruption, std::move(msg)}; }
  static Status timeout(std::string msg) { return {Code::kTimeout, std::move(msg)}; }
  static Status unavailable(std::string msg) { return {Code::kUnavailable, std::move(msg)}; }
  static Status internal(std::string msg) { return {Code::kInternal, std::move(msg)}; }

  bool isOk() const { return code_ == Code::kOk; }
  explicit operator bool() const { return isOk(); }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  // "invalid argument: <message>", or "OK".
  std::string toString() const;

 private:
  Status(Code code, std::string msg) : code_(code), message_(std::move(msg)) {}
  Code code_ = Code::kOk;
  std::string message_;
};

// Either a value or a non-OK Status. Accessing the value of an error (or the
// error of a value) is a broken invariant and aborts.
template <typename T>
class [[nodiscard]] Expected {
 public:
  Expected(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Expected(Status status) : v_(std::move(status)) {  // NOLINT
    TROUPE_CHECK(!std::get<Status>(v_).isOk(), "Expected built from an OK status");
  }

  bool hasValue() const { return v_.index() == 0; }
  explicit operator bool() const { return hasValue(); }

  T& value() & {
    TROUPE_CHECK(hasValue(), "value() of an error: {}", std::get<Status>(v_).toString());
    return std::get<T>(v_);
  }
  const T& value() const& {
    TROUPE_CHECK(hasValue(), "value() of an error: {}", std::get<Status>(v_).toString());
    return std::get<T>(v_);
  }
  T&& value() && {
    TROUPE_CHECK(hasValue(), "value() of an error: {}", std::get<Status>(v_).toString());
    return std::get<T>(std::move(v_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

  const Status& status() const {
    TROUPE_CHECK(!hasValue(), "status() of a value");
    return std::get<Status>(v_);
  }

 private:
  std::variant<T, Status> v_;
};

}  // namespace troupe
