#include "tests/common/ports.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <random>

#include "common/check.h"

namespace troupe::testing {

namespace {

// Can a listener bind 127.0.0.1:port now (no SO_REUSEADDR, as UCX's)?
bool bindable(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  sin.sin_port = htons(port);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&sin), sizeof sin) == 0;
  ::close(fd);
  return ok;
}

// The low end of the kernel's ephemeral port range (32768 when unreadable).
uint16_t ephemeralLow() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0;
  if (!(in >> low) || low <= 1024 || low > 65535) return 32768;
  return uint16_t(low);
}

}  // namespace

uint16_t unusedPort() {
  // Ports [first, ephemeralLow): 10000 and up, clear of the well-known and
  // registered services most hosts run; a range of at least 1000 ports.
  const int low = ephemeralLow();
  const int first = low > 11000 ? 10000 : 1025;
  TROUPE_CHECK(low - first >= 1000, "the ephemeral port range starts at {}: no room below it for a test's port", low);
  std::mt19937 pick{std::random_device{}()};
  std::uniform_int_distribution<int> in(first, low - 1);
  for (int attempt = 0; attempt < 200; ++attempt) {
    const auto port = uint16_t(in(pick));
    if (bindable(port)) return port;
  }
  TROUPE_CHECK(false, "no bindable port in 127.0.0.1:[{}, {}) after 200 tries", first, low);
  return 0;
}

}  // namespace troupe::testing
