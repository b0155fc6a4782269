// A TCP port on loopback for a process a test starts with a fixed address
// (a job's coordinator, a metrics server).
#pragma once

#include <cstdint>

namespace troupe::testing {

// A port that nothing listens on now, that no earlier call in this process
// returned, and that the kernel will not hand out by itself: it lies
// outside the ephemeral range (/proc/sys/net/ipv4/ip_local_port_range),
// below it where there is room, which every bind to port 0 and every
// outgoing connection draws from. A port taken from that range (bind
// to 0, close, hand it on) can be given to another process's listener
// before the intended one binds it: it was, once, in CI. Aborts the test
// binary when no port can be found in 200 tries.
uint16_t unusedPort();

}  // namespace troupe::testing
