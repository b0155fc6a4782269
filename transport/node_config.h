// NodeOptions from the job's typed config (the transport.* keys, see
// `troupe config keys` or common/config_schema.cc) and the job token from
// the TROUPE_JOB_TOKEN environment variable (a secret: never in a config
// file or on a command line).
#pragma once

#include <string>

#include "common/config.h"
#include "transport/node.h"

namespace troupe::transport {

inline constexpr const char* kJobTokenVariable = "TROUPE_JOB_TOKEN";

// Throws SetupError naming the key when a value is out of range.
NodeOptions nodeOptionsFromConfig(const Config& config);

// The token from TROUPE_JOB_TOKEN; throws SetupError when it is unset or
// shorter than 16 characters.
std::string jobTokenFromEnvironment();

// A fresh random token (64 hex digits) for a job this process starts.
std::string newJobToken();

}  // namespace troupe::transport
