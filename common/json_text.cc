#include "common/json_text.h"

#include <cmath>

#include <fmt/format.h>

namespace troupe {

std::string jsonNumber(double v) { return std::isfinite(v) ? fmt::format("{:.17g}", v) : "null"; }

std::string jsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", int(c));
      continue;
    }
    out += c;
  }
  return out + "\"";
}

}  // namespace troupe
