#include "bench/system/allreduce_bench.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/actor_system.h"
#include "actors/launcher.h"
#include "bench/system/bench_pair.h"
#include "collectives/ring_communicator.h"
#include "common/check.h"
#include "common/logging.h"
#include "transport/node_config.h"
#include "transport/remote_actors.h"

namespace troupe::bench {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kRankNodeBase = 0x6172000;  // node id of rank r: base + r

std::string dirOf(const std::string& path) { return path.substr(0, path.find_last_of('/')); }

std::string readAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// "RESULT <bytes> <microseconds>" lines of a log.
std::map<uint64_t, double> results(const std::string& text) {
  std::map<uint64_t, double> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    unsigned long long bytes = 0;
    double us = 0;
    const auto at = line.find("RESULT ");
    if (at != std::string::npos && std::sscanf(line.c_str() + at, "RESULT %llu %lf", &bytes, &us) == 2) {
      out[bytes] = us;
    }
  }
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// One rank of a troupe measurement.
int runRank(const AllReduceBenchOptions& o) {
  caf::actor_system_config cfg;
  actors::configureActorSystem(cfg, {1});
  caf::actor_system system{cfg};
  transport::NodeOptions node = o.node;
  node.nodeId = kRankNodeBase + uint64_t(o.rank);
  node.role = "allreduce-rank";
  node.coordinator = o.coordinator;
  node.isCoordinator = false;
  node.token = transport::jobTokenFromEnvironment();
  auto remote = transport::RemoteActors::start(system, node);
  if (!remote.hasValue()) TROUPE_SETUP_ERROR("rank {}: {}", o.rank, remote.status().message());
  Status s = (*remote)->node().waitForMembers(size_t(o.n) + 1, 60s);
  if (!s.isOk()) TROUPE_SETUP_ERROR("rank {}: {}", o.rank, s.message());
  collectives::RingOptions ro;
  ro.rank = o.rank;
  for (int r = 0; r < o.n; ++r) ro.nodes.push_back(kRankNodeBase + uint64_t(r));
  ro.chunkBytes = o.chunkBytes;
  ro.smallBytes = o.smallBytes;
  ro.spin = std::chrono::microseconds(o.spinUs);
  auto comm = collectives::RingCommunicator::create(**remote, ro);
  if (!comm.hasValue()) TROUPE_SETUP_ERROR("rank {}: {}", o.rank, comm.status().message());
  for (uint64_t bytes : o.sizes) {
    std::vector<float> buf(size_t(bytes / 4), 1.0f);
    const int iters = allReduceIterations(bytes);
    for (int i = 0; i < std::min(iters, 20); ++i) {
      s = (*comm)->allReduce(buf.data(), buf.size(), collectives::DType::kFloat32, collectives::ReduceOp::kSum);
      if (!s.isOk()) TROUPE_SETUP_ERROR("rank {}: {}", o.rank, s.message());
    }
    std::vector<double> trials;
    for (int t = 0; t < o.trials; ++t) {
      s = (*comm)->barrier();
      if (!s.isOk()) TROUPE_SETUP_ERROR("rank {}: {}", o.rank, s.message());
      const auto start = Clock::now();
      for (int i = 0; i < iters; ++i) {
        std::fill(buf.begin(), buf.begin() + std::min<size_t>(buf.size(), 1), 1.0f);
        s = (*comm)->allReduce(buf.data(), buf.size(), collectives::DType::kFloat32, collectives::ReduceOp::kSum);
        if (!s.isOk()) TROUPE_SETUP_ERROR("rank {}: {}", o.rank, s.message());
      }
      trials.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count() / iters);
    }
    if (o.rank == 0) {
      std::printf("RESULT %llu %.3f\n", (unsigned long long)bytes, median(trials));
      std::fflush(stdout);
    }
  }
  s = (*comm)->barrier();
  comm->reset();
  return s.isOk() ? 0 : 1;
}

std::string sizesArg(const std::vector<uint64_t>& sizes) {
  std::string out;
  for (uint64_t b : sizes) out += (out.empty() ? "" : ",") + std::to_string(b);
  return out;
}

// troupe with n ranks: this process holds the coordinator node, the ranks
// are children of this binary.
std::map<uint64_t, double> measureTroupe(const AllReduceBenchOptions& o, int n, const std::string& dir) {
  caf::actor_system_config cfg;
  actors::configureActorSystem(cfg, {1});
  caf::actor_system system{cfg};
  transport::NodeOptions node = o.node;
  node.role = "coordinator";
  node.isCoordinator = true;
  node.coordinator.clear();
  node.listenPort = 0;
  node.token = transport::newJobToken();
  ::setenv(transport::kJobTokenVariable, node.token.c_str(), 1);
  auto remote = transport::RemoteActors::start(system, node);
  if (!remote.hasValue()) TROUPE_SETUP_ERROR("bench allreduce: {}", remote.status().message());
  std::vector<std::unique_ptr<actors::ChildProcess>> ranks;
  for (int r = 0; r < n; ++r) {
    std::vector<std::string> argv = {actors::selfExe(), "bench", "allreduce", "--rank", std::to_string(r), "--n",
                                     std::to_string(n), "--coordinator", (*remote)->node().address(),
                                     "--trials", std::to_string(o.trials), "--sizes", sizesArg(o.sizes)};
    argv.insert(argv.end(), o.passOn.begin(), o.passOn.end());
    ranks.push_back(std::make_unique<actors::ChildProcess>(argv, fmt::format("{}/troupe-{}-{}.log", dir, n, r)));
  }
  for (auto& c : ranks) c->wait(600s);
  for (auto& c : ranks) c->stop(2s);
  return results(readAll(fmt::format("{}/troupe-{}-0.log", dir, n)));
}

std::map<uint64_t, double> measureGloo(const AllReduceBenchOptions& o, int n, const std::string& dir,
                                       const std::string& exe) {
  const std::string store = fmt::format("{}/gloo-store-{}", dir, n);
  std::filesystem::remove_all(store);
  std::filesystem::create_directories(store);
  std::vector<std::unique_ptr<actors::ChildProcess>> ranks;
  for (int r = 0; r < n; ++r) {
    ranks.push_back(std::make_unique<actors::ChildProcess>(
        std::vector<std::string>{exe, std::to_string(r), std::to_string(n), store, std::to_string(o.trials),
                                 sizesArg(o.sizes)},
        fmt::format("{}/gloo-{}-{}.log", dir, n, r)));
  }
  for (auto& c : ranks) c->wait(600s);
  for (auto& c : ranks) c->stop(2s);
  return results(readAll(fmt::format("{}/gloo-{}-0.log", dir, n)));
}

std::map<uint64_t, double> measureMpi(const AllReduceBenchOptions& o, int n, const std::string& dir,
                                      const std::string& exe) {
  // As root (containers) Open MPI wants its consent; more ranks than cores
  // need --oversubscribe; shared memory between the ranks (vader).
  actors::ChildProcess run({"mpirun", "--allow-run-as-root", "--oversubscribe", "-np", std::to_string(n), "--mca", "btl",
                    "self,vader", exe, std::to_string(o.trials), sizesArg(o.sizes)},
                   fmt::format("{}/mpi-{}.log", dir, n));
  run.wait(600s);
  run.stop(2s);
  return results(readAll(fmt::format("{}/mpi-{}.log", dir, n)));
}

bool executable(const std::string& path) { return ::access(path.c_str(), X_OK) == 0; }

bool onPath(const std::string& name) {
  return std::system(("command -v " + name + " >/dev/null 2>&1").c_str()) == 0;
}

}  // namespace

int allReduceIterations(uint64_t bytes) {
  if (bytes <= (64 << 10)) return 2000;
  if (bytes <= (4 << 20)) return 100;
  return 5;
}

int runAllReduceBench(const AllReduceBenchOptions& o) {
  if (o.rank >= 0) return runRank(o);
  auto log = logger("bench");
  const std::string dir = fmt::format("/tmp/troupe-bench-allreduce-{}", ::getpid());
  std::filesystem::create_directories(dir);
  const std::string bin = dirOf(actors::selfExe());
  const std::string glooExe = bin + "/troupe_gloo_allreduce", mpiExe = bin + "/troupe_mpi_allreduce";
  const bool gloo = o.withPeers && executable(glooExe);
  const bool mpi = o.withPeers && executable(mpiExe) && onPath("mpirun");
  if (o.withPeers && !gloo) std::printf("(Gloo left out: %s was not built; install libgloo-dev and rebuild)\n", glooExe.c_str());
  if (o.withPeers && !mpi) std::printf("(Open MPI left out: %s or mpirun missing; install openmpi-bin libopenmpi-dev and rebuild)\n", mpiExe.c_str());
  std::printf("all-reduce, float32 sum, %d trials (median), loopback on this machine\n", o.trials);
  std::printf("%3s %10s | %12s %12s %12s | %10s %10s %10s | %8s\n", "n", "bytes", "troupe us", "gloo us", "mpi us",
              "troupe GB/s", "gloo GB/s", "mpi GB/s", "vs best");
  nlohmann::ordered_json json = nlohmann::ordered_json::array();
  auto busbw = [](uint64_t bytes, int n, double us) {
    return us > 0 ? double(bytes) / (us * 1e-6) / 1e9 * 2.0 * double(n - 1) / double(n) : 0.0;
  };
  // A figure to 3 decimals; null when there is none.
  auto num = [](double v) {
    return v > 0 ? nlohmann::ordered_json(std::round(v * 1000) / 1000) : nlohmann::ordered_json(nullptr);
  };
  // A table cell: "-" where there is no figure (a peer left out or failed), not 0.
  auto cell = [](double v, int width, int decimals, bool times = false) {
    char text[48];
    if (v > 0) {
      std::snprintf(text, sizeof(text), times ? "%*.*fx" : "%*.*f", width, decimals, v);
    } else {
      std::snprintf(text, sizeof(text), "%*s", width + (times ? 1 : 0), "-");
    }
    return std::string(text);
  };
  for (int n : o.ranks) {
    auto t = measureTroupe(o, n, dir);
    auto g = gloo ? measureGloo(o, n, dir, glooExe) : std::map<uint64_t, double>{};
    auto m = mpi ? measureMpi(o, n, dir, mpiExe) : std::map<uint64_t, double>{};
    for (uint64_t bytes : o.sizes) {
      const double tu = t.count(bytes) ? t[bytes] : 0, gu = g.count(bytes) ? g[bytes] : 0,
                   mu = m.count(bytes) ? m[bytes] : 0;
      const double tb = busbw(bytes, n, tu), gb = busbw(bytes, n, gu), mb = busbw(bytes, n, mu);
      const double best = std::max(gb, mb);
      std::printf("%3d %10llu | %s %s %s | %s %s %s | %s\n", n, (unsigned long long)bytes, cell(tu, 12, 1).c_str(),
                  cell(gu, 12, 1).c_str(), cell(mu, 12, 1).c_str(), cell(tb, 10, 3).c_str(), cell(gb, 10, 3).c_str(),
                  cell(mb, 10, 3).c_str(), cell(best > 0 && tb > 0 ? tb / best : 0.0, 7, 2, true).c_str());
      json.push_back({{"n", n},
                      {"bytes", bytes},
                      {"troupe_busbw_gbps", num(tb)},
                      {"gloo_busbw_gbps", num(gb)},
                      {"mpi_busbw_gbps", num(mb)},
                      {"troupe_us", num(tu)},
                      {"gloo_us", num(gu)},
                      {"mpi_us", num(mu)}});
      if (tu == 0) log->error("troupe with n = {} gave no figure for {} bytes; see {}/troupe-{}-*.log", n, bytes, dir, n);
    }
    std::fflush(stdout);
  }
  if (!o.jsonPath.empty()) {
    std::ofstream out(o.jsonPath);
    out << json.dump(2) << "\n";
    if (!out) TROUPE_SETUP_ERROR("cannot write --json '{}'", o.jsonPath);
  }
  std::printf("logs of every process: %s\n", dir.c_str());
  return 0;
}

}  // namespace troupe::bench
