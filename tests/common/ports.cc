#include "tests/common/ports.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <mutex>
#include <random>
#include <set>
#include <utility>

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

// The kernel's ephemeral port range [low, high]: every bind to port 0 and
// every outgoing connection takes its port from there.
std::pair<int, int> ephemeralRange() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0, high = 0;
  TROUPE_CHECK(in >> low >> high && 0 < low && low <= high && high <= 65535,
               "cannot read the ephemeral port range from /proc/sys/net/ipv4/ip_local_port_range");
  return {low, high};
}

}  // namespace

uint16_t unusedPort() {
  // [10000, low) when the range leaves 1000 ports below it (clear of the
  // well-known and most registered services), else (high, 65535].
  const auto [low, high] = ephemeralRange();
  int first = 10000, last = low - 1;
  if (last - first < 1000) first = high + 1, last = 65535;
  TROUPE_CHECK(last - first >= 1000, "the ephemeral port range [{}, {}] leaves no room for a test's port", low, high);
  // No two calls in this process hand out the same port: two listeners a
  // test starts side by side could not both have it.
  static std::mutex mutex;
  static std::set<uint16_t> given;
  static std::mt19937 pick{std::random_device{}()};
  std::lock_guard<std::mutex> lock(mutex);
  std::uniform_int_distribution<int> in(first, last);
  for (int attempt = 0; attempt < 200; ++attempt) {
    const auto port = uint16_t(in(pick));
    if (!given.count(port) && bindable(port)) {
      given.insert(port);
      return port;
    }
  }
  TROUPE_CHECK(false, "no bindable port in 127.0.0.1:[{}, {}] after 200 tries", first, last);
  return 0;
}

}  // namespace troupe::testing
