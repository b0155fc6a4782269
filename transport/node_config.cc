#include "transport/node_config.h"

#include <cstdlib>

#include "common/check.h"
#include "transport/handshake.h"

namespace troupe::transport {

NodeOptions nodeOptionsFromConfig(const Config& config) {
  NodeOptions o;
  o.listenHost = config.getString("transport.listen_host");
  auto addr = parseHostPort(o.listenHost + ":1");
  if (!addr.hasValue() || o.listenHost == "0.0.0.0") {
    TROUPE_SETUP_ERROR("transport.listen_host = '{}': a concrete IPv4 address peers can reach (not 0.0.0.0)",
                       o.listenHost);
  }
  const int64_t port = config.getInt("transport.listen_port");
  if (port < 0 || port > 65535) TROUPE_SETUP_ERROR("transport.listen_port = {}: 0..65535", port);
  o.listenPort = uint16_t(port);
  auto ms = [&](const char* key, int64_t min) {
    const int64_t v = config.getInt(key);
    if (v < min) TROUPE_SETUP_ERROR("{} = {}: at least {}", key, v, min);
    return std::chrono::milliseconds(v);
  };
  o.heartbeatInterval = ms("transport.heartbeat_interval_ms", 1);
  o.heartbeatTimeout = ms("transport.heartbeat_timeout_ms", 2);
  if (o.heartbeatTimeout <= o.heartbeatInterval) {
    TROUPE_SETUP_ERROR("transport.heartbeat_timeout_ms = {} must exceed transport.heartbeat_interval_ms = {}",
                       o.heartbeatTimeout.count(), o.heartbeatInterval.count());
  }
  o.handshakeTimeout = ms("transport.handshake_timeout_ms", 1);
  o.joinTimeout = ms("transport.join_timeout_ms", 0);
  o.sharedMemory = config.getBool("transport.shared_memory");
  const int64_t spin = config.getInt("transport.spin_us");
  if (spin < 0 || spin > 1000000) TROUPE_SETUP_ERROR("transport.spin_us = {}: 0..1000000", spin);
  o.spinBeforeSleep = std::chrono::microseconds(spin);
  const int64_t mb = config.getInt("transport.max_message_mb");
  if (mb < 1) TROUPE_SETUP_ERROR("transport.max_message_mb = {}: at least 1", mb);
  o.maxFrameBytes = uint64_t(mb) << 20;
  o.reliableLinks = config.getBool("transport.reliable_links");
  return o;
}

std::string jobTokenFromEnvironment() {
  const char* token = std::getenv(kJobTokenVariable);
  if (token == nullptr || std::string(token).size() < 16) {
    TROUPE_SETUP_ERROR("{} must hold the job's secret token (at least 16 characters)", kJobTokenVariable);
  }
  return token;
}

std::string newJobToken() {
  std::string s;
  for (uint8_t b : randomNonce()) s += fmt::format("{:02x}", b);
  return s;
}

bool avoidSharedMemoryFifo() {
  if (std::getenv("UCX_TLS") != nullptr) return false;
  return ::setenv("UCX_TLS", "^sysv,posix", 1) == 0;
}

}  // namespace troupe::transport
