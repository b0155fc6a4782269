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

// Keeps UCX off its shared-memory FIFO transports (sysv, posix) in this
// process and in the processes it starts from now on (UCX_TLS=^sysv,posix,
// unless UCX_TLS is set already): on one host messages then go over TCP,
// and large ones still by cross-memory copy (cma). A process killed while it
// writes into a peer's FIFO leaves that slot unfinished, and the peer
// receives nothing from anyone again (UCX 1.13 has no way out); jobs whose
// fault plans kill or stop processes take this, at the cost of the FIFO's
// speed for small messages (the main job ran 27% slower). Call it before
// any node starts. True when it set the variable.
bool avoidSharedMemoryFifo();

}  // namespace troupe::transport
