#include "common/status.h"

namespace troupe {

std::string Status::toString() const {
  const char* name = "OK";
  switch (code_) {
    case Code::kOk: return "OK";
    case Code::kInvalidArgument: name = "invalid argument"; break;
    case Code::kNotFound: name = "not found"; break;
    case Code::kIoError: name = "I/O error"; break;
    case Code::kCorruption: name = "corruption"; break;
    case Code::kTimeout: name = "timeout"; break;
    case Code::kUnavailable: name = "unavailable"; break;
    case Code::kInternal: name = "internal error"; break;
  }
  return std::string(name) + ": " + message_;
}

}  // namespace troupe
