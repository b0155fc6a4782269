// JSON text for the summaries troupe writes (summary.json, faults.json):
// a number (null when not finite) and a quoted, escaped string.
#pragma once

#include <string>

namespace troupe {

std::string jsonNumber(double v);
std::string jsonString(const std::string& s);

}  // namespace troupe
