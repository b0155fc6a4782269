// NodeOptions from the job's typed config (the transport.* keys, see
// `troupe config keys` or common/config_schema.cc) and the job token: from
// the file transport.token_file names (mode 0600, like an ssh key) or from
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
// too weak (tokenWeakness).
std::string jobTokenFromEnvironment();

// The token from the file transport.token_file names when it is set, else
// from TROUPE_JOB_TOKEN. The file must be a regular file of this user that
// no one else may read or write (mode 0600 or 0400), of at most 4 KiB; its
// trailing white space is not part of the token. Throws SetupError naming
// the file and what is wrong with it.
std::string jobToken(const Config& config);

// Why `token` is too weak to guard a job, or "" when it is strong enough:
// at least 128 bits by its length and the classes of characters it uses
// (hex digits 16; else digits 10, lower-case 26, upper-case 26, symbols 32:
// 32 hex digits, 22 of letters and digits, 20 of all four) and at least 8
// distinct characters. An estimate from above: a word or a pattern is
// weaker than it says.
// Anyone who reads one handshake can test guesses offline; only a token
// nobody can enumerate is safe.
std::string tokenWeakness(const std::string& token);

// A fresh random token (64 hex digits, 256 bits) for a job this process
// starts, or for `troupe token`.
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
