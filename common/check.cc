#include "common/check.h"

#include <cstdio>
#include <cstdlib>

#include <spdlog/spdlog.h>

namespace troupe::detail {

void checkFailed(const char* cond, const char* file, int line, const std::string& msg) {
  spdlog::critical("check failed: {} at {}:{}: {}", cond, file, line, msg);
  spdlog::shutdown();
  std::fprintf(stderr, "troupe: check failed: %s at %s:%d: %s\n", cond, file, line, msg.c_str());
  std::abort();
}

}  // namespace troupe::detail
