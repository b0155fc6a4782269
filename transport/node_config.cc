#include "transport/node_config.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>

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
  o.listenPort = uint16_t(config.getInt("transport.listen_port"));  // the schema's ranges hold every key here
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
  o.maxHandshaking = size_t(config.getInt("transport.handshake_slots"));
  o.maxHandshakingPerHost = size_t(config.getInt("transport.handshake_slots_per_host"));
  o.joinTimeout = ms("transport.join_timeout_ms", 0);
  o.sharedMemory = config.getBool("transport.shared_memory");
  o.spinBeforeSleep = std::chrono::microseconds(config.getInt("transport.spin_us"));
  o.maxFrameBytes = uint64_t(config.getInt("transport.max_message_mb")) << 20;
  o.reliableLinks = config.getBool("transport.reliable_links");
  auto integrity = parseIntegrity(config.getString("transport.integrity"));
  if (!integrity.hasValue()) TROUPE_SETUP_ERROR("transport.integrity = {}", integrity.status().message());
  o.integrity = *integrity;
  return o;
}

namespace {

constexpr const char* kTokenHint = "make one with `troupe token --out FILE` (or `troupe token`)";

}  // namespace

std::string tokenWeakness(const std::string& token) {
  if (token.empty()) return "it is empty";
  bool digit = false, lower = false, upper = false, symbol = false, hex = true;
  std::array<bool, 256> seen{};
  size_t distinct = 0;
  for (unsigned char ch : token) {
    if (ch < 0x21 || ch > 0x7e) return "it holds a character that is not printable ASCII (or a space)";
    if (!seen[ch]) distinct++;
    seen[ch] = true;
    digit = digit || std::isdigit(ch);
    lower = lower || std::islower(ch);
    upper = upper || std::isupper(ch);
    symbol = symbol || !std::isalnum(ch);
    hex = hex && std::isxdigit(ch);
  }
  // The alphabet a guesser must try: the classes of characters the token
  // uses (hex digits count as 16 whatever their case).
  double alphabet = 0;
  std::string classes;
  auto add = [&](bool used, double size, const char* name) {
    if (!used) return;
    alphabet += size;
    classes += classes.empty() ? name : std::string(", ") + name;
  };
  if (hex && (lower || upper)) {
    add(true, 16, "hex digits");
  } else {
    add(digit, 10, "digits");
    add(lower, 26, "lower-case letters");
    add(upper, 26, "upper-case letters");
    add(symbol, 32, "symbols");
  }
  const double bits = double(token.size()) * std::log2(alphabet);
  if (bits < 128) {
    return fmt::format("{} characters of {} hold at most {:.0f} bits; at least 128 are needed", token.size(), classes,
                       bits);
  }
  if (distinct < 8) return fmt::format("it has only {} distinct characters", distinct);
  return "";
}

std::string jobTokenFromEnvironment() {
  const char* token = std::getenv(kJobTokenVariable);
  if (token == nullptr || *token == '\0') {
    TROUPE_SETUP_ERROR("{} must hold the job's secret token (or set transport.token_file); {}", kJobTokenVariable,
                       kTokenHint);
  }
  if (std::string why = tokenWeakness(token); !why.empty()) {
    TROUPE_SETUP_ERROR("{} is too weak to guard the job: {}; {}", kJobTokenVariable, why, kTokenHint);
  }
  return token;
}

std::string jobToken(const Config& config) {
  const std::string path = config.getString("transport.token_file");
  if (path.empty()) return jobTokenFromEnvironment();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) TROUPE_SETUP_ERROR("transport.token_file '{}': {}", path, std::strerror(errno));
  struct stat st {};
  std::string token;
  std::string problem;
  if (::fstat(fd, &st) != 0) {
    problem = std::strerror(errno);
  } else if (!S_ISREG(st.st_mode)) {
    problem = "not a regular file";
  } else if (st.st_uid != ::geteuid()) {
    problem = fmt::format("owned by uid {}, not by this user (uid {})", st.st_uid, ::geteuid());
  } else if ((st.st_mode & 077) != 0) {
    problem = fmt::format("mode {:04o}: others may read or write it; chmod 600 {}", st.st_mode & 07777, path);
  } else if (st.st_size > 4096) {
    problem = fmt::format("{} bytes: a token file holds one token (at most 4096 bytes)", st.st_size);
  } else {
    token.resize(size_t(st.st_size));
    size_t got = 0;
    while (got < token.size()) {
      const ssize_t n = ::read(fd, token.data() + got, token.size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      got += size_t(n);
    }
    if (got != token.size()) problem = fmt::format("read {} of its {} bytes", got, token.size());
  }
  ::close(fd);
  if (!problem.empty()) TROUPE_SETUP_ERROR("transport.token_file '{}': {}", path, problem);
  while (!token.empty() && std::isspace(static_cast<unsigned char>(token.back()))) token.pop_back();
  if (std::string why = tokenWeakness(token); !why.empty()) {
    TROUPE_SETUP_ERROR("transport.token_file '{}' is too weak to guard the job: {}; {}", path, why, kTokenHint);
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
