#include "bench/system/ps_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <fstream>
#include <thread>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/actor_system.h"
#include "actors/launcher.h"
#include "bench/system/bench_pair.h"
#include "bench/system/transport_bench.h"
#include "common/check.h"
#include "common/logging.h"
#include "ps/shard.h"
#include "ps/wire.h"
#include "transport/node_config.h"
#include "transport/remote_actors.h"

namespace troupe::bench {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using transport::DType;
using transport::Tensor;

constexpr uint64_t kBenchCoordinator = 0xbe7c0001, kBenchShard = 0xbe7c0002;
// One table per row width measured.
const std::vector<int64_t> kDims = {16, 64, 256, 1024, 65536, 1 << 20};

int serve(const PsBenchOptions& options) {
  caf::actor_system_config cfg;
  actors::configureActorSystem(cfg, {1});
  caf::actor_system system{cfg};
  auto remote = joinBenchPair(system, options.node, kBenchShard, "ps", options.coordinator);
  if (!remote.hasValue()) return std::fprintf(stderr, "troupe: error: %s\n", remote.status().message().c_str()), 1;
  ps::ShardOptions so;
  so.workers = 1;
  for (size_t t = 0; t < kDims.size(); ++t) {
    ps::EmbeddingTableOptions table;
    table.tableId = int(t);
    table.dim = kDims[t];
    table.optimizer.kind = kernels::OptimizerKind::kSgd;
    table.optimizer.learningRate = 1e-6f;
    table.initialCapacity = 1 << 17;
    so.tables.push_back(table);
  }
  so.consistency = ps::Consistency::kAsp;
  auto shard = ps::spawnShard(system, so);
  (*remote)->publish(shard, "shard");
  caf::scoped_actor waiter{system};
  waiter->monitor(shard);
  waiter->receive([](const caf::down_msg&) {}, caf::after(std::chrono::minutes(30)) >> [] {});
  std::this_thread::sleep_for(50ms);
  remote->reset();
  return 0;
}

struct Figure {
  double requestsPerSec = 0;
  double p50us = 0;
};

// Requests of `keys` keys of table `table` (pulls, or pushes of zeros),
// `window` in flight, for `seconds`.
Figure measure(caf::actor_system& system, const caf::actor& shard, size_t table, int64_t keys, bool push,
               int window, double seconds) {
  std::vector<uint64_t> counts(kDims.size(), 0);
  counts[table] = uint64_t(keys);
  std::vector<uint64_t> keyList(static_cast<size_t>(keys));
  for (int64_t i = 0; i < keys; ++i) keyList[size_t(i)] = uint64_t(i) * 2654435761u + table;
  const Tensor countsT = Tensor::copyOf(counts.data(), counts.size() * 8, DType::kUInt64);
  const Tensor keysT = Tensor::copyOf(keyList.data(), keyList.size() * 8, DType::kUInt64);
  const Tensor grads = Tensor::adopt(std::vector<float>(size_t(keys * kDims[table]), 0.0f), DType::kFloat32);
  const Tensor none = Tensor::adopt(std::vector<float>(), DType::kFloat32);
  int64_t sequence = 0;
  auto message = [&] {
    return push ? ps::pushToWire(0, sequence++, 0, 1, countsT, keysT, grads, none)
                : ps::pullToWire(0, 0, true, false, countsT, keysT);
  };
  caf::scoped_actor self{system};
  // Warm-up: rows created, endpoints and buffers ready.
  self->send(shard, message());
  self->receive([](const Tensor&, const Tensor&) {}, [](int64_t) {}, caf::after(30s) >> [] {});
  std::vector<double> latencies;
  int64_t done = 0, inFlight = 0;
  const auto start = Clock::now();
  const auto end = start + std::chrono::duration<double>(seconds);
  std::deque<Clock::time_point> times;
  bool failed = false;
  while (!failed && (Clock::now() < end || inFlight > 0)) {
    while (inFlight < window && Clock::now() < end) {
      times.push_back(Clock::now());
      self->send(shard, message());
      ++inFlight;
    }
    auto got = [&] {
      latencies.push_back(std::chrono::duration<double, std::micro>(Clock::now() - times.front()).count());
      times.pop_front();
      --inFlight;
      ++done;
    };
    self->receive([&](const Tensor&, const Tensor&) { got(); }, [&](int64_t) { got(); },
                  [&](caf::error& e) {
                    std::fprintf(stderr, "troupe: error: bench ps: %s\n", caf::to_string(e).c_str());
                    failed = true;
                  },
                  caf::after(30s) >> [&] { failed = true; });
  }
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  Figure f;
  f.requestsPerSec = failed ? 0 : double(done) / elapsed;
  std::sort(latencies.begin(), latencies.end());
  f.p50us = latencies.empty() ? 0 : latencies[latencies.size() / 2];
  return f;
}

double ceilingGbps(uint64_t bytes, double seconds, bool shm) {
  const uint64_t iterations = std::clamp<uint64_t>(uint64_t(seconds * 4e9 / double(bytes)), 100, 500000);
  auto row = runPerftest("tag_bw", bytes, iterations, !shm);
  return row.size() > 5 ? row[5] * 1e6 / 1e9 : 0;  // MB/s -> GB/s
}

}  // namespace

int runPsBench(const PsBenchOptions& options) {
  if (options.serve) return serve(options);
  if (!options.jsonPath.empty() && !std::ofstream(options.jsonPath, std::ios::app)) {
    TROUPE_SETUP_ERROR("bench ps: cannot write --json {}", options.jsonPath);
  }
  caf::actor_system_config cfg;
  actors::configureActorSystem(cfg, {1});
  caf::actor_system system{cfg};
  const transport::NodeOptions& node = options.node;
  std::vector<std::string> argv = {actors::selfExe(), "bench", "ps", "--serve"};
  argv.insert(argv.end(), options.passOn.begin(), options.passOn.end());
  auto pair = startBenchPair(system, node, kBenchCoordinator, argv);
  if (!pair.hasValue()) return std::fprintf(stderr, "troupe: error: %s\n", pair.status().message().c_str()), 1;
  auto shard = pair->remote->remoteActor(kBenchShard, "shard");
  const bool perftest = options.withPerftest && havePerftest();
  if (options.withPerftest && !perftest) logger("apps")->warn("ucx_perftest not found (Debian ucx-utils): no ceiling");
  std::printf("troupe bench ps: 1 worker + 1 shard process on %s (%s), %.1f s per figure\n", node.listenHost.c_str(),
              node.sharedMemory ? "shared memory" : "TCP", options.seconds);
  std::printf("%6s %8s %14s %14s %10s %10s %12s %7s %7s\n", "floats", "keys", "push keys/s", "pull keys/s", "push GB/s",
              "pull GB/s", "ceiling GB/s", "push %", "pull %");
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  // A figure to `digits` decimals, as the table prints it.
  auto fixed = [](double v, int digits) {
    const double scale = std::pow(10.0, digits);
    return std::round(v * scale) / scale;
  };
  auto row = [&](int64_t floats, int64_t keys, int window, bool psLite) {
    const size_t table = size_t(std::find(kDims.begin(), kDims.end(), floats) - kDims.begin());
    Figure pu = measure(system, shard, table, keys, true, window, options.seconds);
    Figure pl = measure(system, shard, table, keys, false, window, options.seconds);
    const double bytes = double(keys) * double(floats) * 4;
    const double pushG = pu.requestsPerSec * bytes / 1e9, pullG = pl.requestsPerSec * bytes / 1e9;
    const double ceiling = perftest ? ceilingGbps(uint64_t(bytes), std::min(options.seconds, 1.0), node.sharedMemory) : 0;
    auto pct = [&](double g) { return ceiling > 0 ? fmt::format("{:.0f}", 100 * g / ceiling) : std::string("-"); };
    std::printf("%6lld %8lld %14.0f %14.0f %10.3f %10.3f %12.3f %7s %7s", (long long)floats, (long long)keys,
                pu.requestsPerSec * double(keys), pl.requestsPerSec * double(keys), pushG, pullG, ceiling,
                pct(pushG).c_str(), pct(pullG).c_str());
    if (psLite) {
      std::printf("   push %.0f req/s p50 %.0f us, pull %.0f req/s p50 %.0f us", pu.requestsPerSec, pu.p50us,
                  pl.requestsPerSec, pl.p50us);
    }
    std::printf("\n");
    std::fflush(stdout);
    rows.push_back({{"row_floats", floats},
                    {"keys", keys},
                    {"push_keys_per_s", fixed(pu.requestsPerSec * double(keys), 1)},
                    {"pull_keys_per_s", fixed(pl.requestsPerSec * double(keys), 1)},
                    {"push_gbps", fixed(pushG, 4)},
                    {"pull_gbps", fixed(pullG, 4)},
                    {"ceiling_gbps", fixed(ceiling, 4)},
                    {"push_requests_per_s", fixed(pu.requestsPerSec, 1)},
                    {"pull_requests_per_s", fixed(pl.requestsPerSec, 1)},
                    {"push_p50_us", fixed(pu.p50us, 1)},
                    {"pull_p50_us", fixed(pl.p50us, 1)},
                    {"shape", psLite ? "ps-lite" : "batch"}});
  };
  for (int64_t floats : {16, 64, 256}) {
    for (int64_t keys : {1000, 10000, 100000}) row(floats, keys, 4, false);
  }
  std::printf("ps-lite's shapes: one key per request\n");
  for (int64_t floats : {1024, 65536, 1 << 20}) row(floats, 1, floats <= 1024 ? 32 : 4, true);
  if (!options.jsonPath.empty()) {
    std::ofstream out(options.jsonPath);
    const nlohmann::ordered_json json = {{"bench", "ps"}, {"rows", rows}};
    out << json.dump(2) << "\n";
  }
  pair->child->stop(2s);  // the shard process has nothing to save
  return 0;
}

}  // namespace troupe::bench
