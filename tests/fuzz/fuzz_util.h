// What several fuzz targets in tests/fuzz share: writing a seed input, and
// cutting an input into lines.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <string_view>

namespace troupe::fuzz {

// DIR/seed-N: the byte `which` (the target's choice of what the rest is),
// then `body`.
inline void writeSeed(const std::string& dir, int n, uint8_t which, const std::string& body) {
  std::ofstream out(dir + "/seed-" + std::to_string(n), std::ios::binary);
  out.put(char(which));
  out.write(body.data(), std::streamsize(body.size()));
}

// Calls fn(line) for every non-empty line of `text` ('\n'-separated).
template <class Fn>
void forEachLine(std::string_view text, Fn&& fn) {
  size_t at = 0;
  while (at <= text.size()) {
    const size_t nl = text.find('\n', at);
    const std::string_view line = text.substr(at, nl == std::string_view::npos ? std::string_view::npos : nl - at);
    if (!line.empty()) fn(line);
    if (nl == std::string_view::npos) break;
    at = nl + 1;
  }
}

}  // namespace troupe::fuzz
