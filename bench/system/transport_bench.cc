#include "bench/system/transport_bench.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <thread>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/actor_system.h"
#include "actors/launcher.h"
#include "bench/system/bench_pair.h"
#include "common/check.h"
#include "common/logging.h"
#include "transport/handshake.h"
#include "transport/node_config.h"
#include "transport/remote_actors.h"

namespace troupe::bench {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using transport::Tensor;

using data_atom = caf::atom_constant<caf::atom("data")>;
using flush_atom = caf::atom_constant<caf::atom("flush")>;
using ping_atom = caf::atom_constant<caf::atom("ping")>;
using quit_atom = caf::atom_constant<caf::atom("quit")>;

constexpr uint64_t kCoordinatorId = 1;
constexpr uint64_t kSinkId = 2;
constexpr double kMiB = 1024.0 * 1024.0;

// One scheduler thread per process (actors::configureActorSystem).
void configureBenchSystem(caf::actor_system_config& cfg) { actors::configureActorSystem(cfg, {1}); }

struct SinkState {
  int64_t messages = 0;
  int64_t bytes = 0;
};

caf::behavior sinkActor(caf::stateful_actor<SinkState>* self) {
  return {
      [=](data_atom, const Tensor& t) {
        self->state.messages++;
        self->state.bytes += int64_t(t.bytes);
      },
      [=](flush_atom) { return self->state.bytes; },
      [=](ping_atom, int64_t x) { return x; },
      [=](quit_atom) {
        self->quit();
        return true;
      },
  };
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// ---------------------------------------------------------------- ucx_perftest

uint16_t freePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof sin;
  uint16_t port = 0;
  if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&sin), sizeof sin) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&sin), &len) == 0) {
    port = ntohs(sin.sin_port);
  }
  if (fd >= 0) ::close(fd);
  return port;
}

// The "Final:" row of one ucx_perftest run as numbers, empty on failure.
// tcpOnly: UCX_TLS=tcp, to compare with troupe's TCP mode.
int serve(const TransportBenchOptions& options) {
  caf::actor_system_config cfg;
  configureBenchSystem(cfg);
  caf::actor_system system{cfg};
  auto remote = joinBenchPair(system, options.node, kSinkId, "bench-sink", options.coordinator);
  if (!remote.hasValue()) {
    std::fprintf(stderr, "troupe: error: %s\n", remote.status().message().c_str());
    return 1;
  }
  auto sink = system.spawn(sinkActor);
  (*remote)->publish(sink, "sink");
  caf::scoped_actor waiter{system};
  waiter->monitor(sink);
  int rc = 0;
  waiter->receive([](const caf::down_msg&) {}, caf::after(std::chrono::minutes(30)) >> [&] { rc = 1; });
  std::this_thread::sleep_for(50ms);  // the reply to quit leaves first
  remote->reset();
  return rc;
}

// One-way bandwidth in MiB/s: windows of tensors (8 MiB or 4 messages),
// each closed by a flush request, for `seconds`.
double measureBandwidth(caf::actor_system& system, const caf::actor& sink, uint64_t bytes, double seconds) {
  const Tensor t = Tensor::adopt(std::vector<uint8_t>(bytes, 0x5a), transport::DType::kBytes);
  // 8 MiB in flight (at least 4 messages): deeper windows measured slower
  // here, since the receive buffers then fall out of the caches.
  const int window = int(std::clamp<uint64_t>((uint64_t{8} << 20) / bytes, 4, 1024));
  caf::scoped_actor self{system};
  auto flush = [&] {
    bool ok = false;
    self->request(sink, std::chrono::seconds(60), flush_atom::value)
        .receive([&](int64_t) { ok = true; }, [&](caf::error& e) {
          logger("apps")->error("flush failed: {}", caf::to_string(e));
        });
    return ok;
  };
  if (!flush()) return 0;
  uint64_t sent = 0;
  const auto start = Clock::now();
  while (Clock::now() - start < std::chrono::duration<double>(seconds)) {
    for (int i = 0; i < window; ++i) self->send(sink, data_atom::value, t);
    if (!flush()) return 0;
    sent += uint64_t(window) * bytes;
  }
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  return double(sent) / kMiB / elapsed;
}

// Mean round trip in microseconds of a small request from an event-based
// actor (one request in flight at a time).
double measureRoundTrip(caf::actor_system& system, const caf::actor& sink, int roundTrips) {
  caf::scoped_actor self{system};
  auto client = caf::actor(self);
  system.spawn([=](caf::event_based_actor* me) {
    // The step function calls itself through a raw pointer; the actor owns
    // it (attach_functor) so it lives exactly as long as the actor. A
    // shared_ptr captured inside itself would never be freed.
    auto owned = std::make_shared<std::function<void(int64_t)>>();
    std::function<void(int64_t)>* next = owned.get();
    me->attach_functor([owned] {});
    auto start = std::make_shared<Clock::time_point>(Clock::now());
    *next = [=](int64_t i) {
      if (i == roundTrips) {
        const double us = std::chrono::duration<double, std::micro>(Clock::now() - *start).count() / roundTrips;
        me->send(client, us);
        me->quit();
        return;
      }
      me->request(sink, std::chrono::seconds(10), ping_atom::value, i)
          .then([=](int64_t) { (*next)(i + 1); }, [=](caf::error& e) {
            me->send(client, -1.0);
            me->quit(e);
          });
    };
    (*next)(0);
  });
  double us = -1;
  self->receive([&](double x) { us = x; }, caf::after(std::chrono::minutes(5)) >> [] {});
  return us;
}

}  // namespace

std::vector<double> runPerftest(const std::string& test, uint64_t bytes, uint64_t iterations, bool tcpOnly) {
  for (int attempt = 0; attempt < 3; ++attempt) {
    if (tcpOnly) setenv("UCX_TLS", "tcp", 1);
    const uint16_t port = freePort();
    actors::ChildProcess server({"ucx_perftest", "-p", std::to_string(port)}, "/dev/null");
    std::this_thread::sleep_for(300ms);
    const std::string cmd = fmt::format("timeout 120 ucx_perftest 127.0.0.1 -p {} -t {} -s {} -n {} 2>&1", port,
                                        test, bytes, iterations);
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) return {};
    std::string out;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    pclose(p);
    if (tcpOnly) unsetenv("UCX_TLS");
    std::istringstream lines(out);
    std::string line;
    while (std::getline(lines, line)) {
      if (line.rfind("Final:", 0) != 0) continue;
      std::istringstream fields(line.substr(6));
      std::vector<double> values;
      double v;
      while (fields >> v) values.push_back(v);
      if (values.size() >= 8) return values;
    }
    logger("apps")->warn("ucx_perftest {} gave no result (attempt {}): {}", test, attempt + 1,
                         out.substr(0, 300));
  }
  return {};
}

bool havePerftest() { return std::system("command -v ucx_perftest >/dev/null 2>&1") == 0; }

// ---------------------------------------------------------------- troupe



int runTransportBench(const TransportBenchOptions& options) {
  if (options.serve) return serve(options);
  if (!options.jsonPath.empty() && !std::ofstream(options.jsonPath, std::ios::app)) {
    TROUPE_SETUP_ERROR("bench transport: cannot write --json {}", options.jsonPath);
  }
  auto log = logger("apps");
  caf::actor_system_config cfg;
  configureBenchSystem(cfg);
  caf::actor_system system{cfg};
  const transport::NodeOptions& node = options.node;
  std::vector<std::string> argv = {actors::selfExe(), "bench", "transport", "--serve"};
  argv.insert(argv.end(), options.passOn.begin(), options.passOn.end());
  auto pair = startBenchPair(system, node, kCoordinatorId, argv);
  if (!pair.hasValue()) {
    std::fprintf(stderr, "troupe: error: %s\n", pair.status().message().c_str());
    return 1;
  }
  auto& remote = pair->remote;
  auto sink = remote->remoteActor(kSinkId, "sink");
  const bool perftest = options.withPerftest && havePerftest();
  if (options.withPerftest && !perftest) log->warn("ucx_perftest not found (Debian ucx-utils): no ceiling");

  std::printf("troupe bench transport: actor-to-actor over UCX between two processes on %s (%s)\n",
              node.listenHost.c_str(), node.sharedMemory ? "shared memory" : "TCP, peer error handling");
  std::printf("bandwidth in MiB/s (ucx_perftest's MB/s), median of %d trials of %.2f s\n", options.trials,
              options.secondsPerSize);
  std::printf("%10s %14s %16s %8s\n", "bytes", "troupe MiB/s", "perftest MiB/s", "ratio");
  measureRoundTrip(system, sink, 200);  // warm up endpoints and allocators
  using Json = nlohmann::ordered_json;
  // A figure to `digits` decimals, as the table prints it; ucx_perftest's
  // is null when there is none.
  auto fixed = [](double v, int digits) {
    const double scale = std::pow(10.0, digits);
    return std::round(v * scale) / scale;
  };
  auto perftestFigure = [&](double v, int digits) { return v > 0 ? Json(fixed(v, digits)) : Json(nullptr); };
  Json rowsJson = Json::array();
  for (uint64_t bytes : options.sizes) {
    measureBandwidth(system, sink, bytes, 0.1);  // warm-up
    std::vector<double> ours, theirs;
    for (int trial = 0; trial < options.trials; ++trial) {
      ours.push_back(measureBandwidth(system, sink, bytes, options.secondsPerSize));
      if (perftest) {
        const uint64_t iterations =
            std::clamp<uint64_t>(uint64_t(options.secondsPerSize * 6e9 / double(bytes)), 200, 2000000);
        auto row = runPerftest("tag_bw", bytes, iterations, !node.sharedMemory);
        if (!row.empty()) theirs.push_back(row[5]);  // bandwidth, overall
      }
    }
    const double a = median(ours), b = median(theirs);
    std::printf("%10llu %14.1f %16.1f %8s\n", (unsigned long long)bytes, a, b,
                b > 0 ? fmt::format("{:.2f}", a / b).c_str() : "-");
    std::fflush(stdout);
    rowsJson.push_back({{"bytes", bytes}, {"troupe_mbps", fixed(a, 1)}, {"ucx_perftest_mbps", perftestFigure(b, 1)}});
  }
  std::vector<double> rtt, ucxRtt;
  for (int trial = 0; trial < options.trials; ++trial) {
    rtt.push_back(measureRoundTrip(system, sink, options.latencyRoundTrips));
    if (perftest) {
      auto row = runPerftest("tag_lat", 8, 200000, !node.sharedMemory);
      // ucx_perftest's tag_lat reports half the ping-pong round trip.
      if (!row.empty()) ucxRtt.push_back(2 * row[2]);
    }
  }
  const double ours = median(rtt), theirs = median(ucxRtt);
  std::printf("round trip of a small request: troupe %.2f us, ucx_perftest %.2f us (2 x tag_lat), ratio %s\n", ours,
              theirs, theirs > 0 ? fmt::format("{:.1f}", ours / theirs).c_str() : "-");
  auto stats = remote->node().stats();
  std::printf("frames sent %llu, received %llu, malformed %llu\n", (unsigned long long)stats.framesSent,
              (unsigned long long)stats.framesReceived, (unsigned long long)stats.malformedDropped);

  caf::scoped_actor self{system};
  self->request(sink, 5s, quit_atom::value).receive([](bool) {}, [](caf::error&) {});
  pair->child->wait(5s);

  if (!options.jsonPath.empty()) {
    std::ofstream out(options.jsonPath);
    const Json json = {
        {"rows", rowsJson},
        {"latency",
         {{"troupe_roundtrip_us", fixed(ours, 3)}, {"ucx_perftest_roundtrip_us", perftestFigure(theirs, 3)}}}};
    out << json.dump(2) << "\n";
    if (!out) {
      std::fprintf(stderr, "troupe: error: cannot write %s\n", options.jsonPath.c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace troupe::bench
