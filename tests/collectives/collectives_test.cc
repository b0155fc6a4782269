// Collectives over real processes: each rank is this binary run again as a
// peer (--peer), with its own UCX node, joined on loopback. The gtest cases
// start the peers, wait for them (bounded) and compare what they print.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <caf/all.hpp>
#include <gtest/gtest.h>

#include "collectives/compressed_allreduce.h"
#include "collectives/gradient_buckets.h"
#include "collectives/peer_watch.h"
#include "collectives/reduce.h"
#include "collectives/ring_communicator.h"
#include "common/hash.h"
#include "common/logging.h"
#include "tests/common/subprocess.h"
#include "tests/common/temp_dir.h"

namespace troupe::collectives {
namespace {

using namespace std::chrono_literals;
using testing::Child;
using testing::TempDir;

constexpr uint64_t kNodeBase = 0x7100;

// ------------------------------------------------------------------ the peer

struct PeerArgs {
  int rank = 0, n = 1;
  std::string scenario, portFile, coordinator;
  size_t chunk = 4096;
  size_t small = 32 << 10;
  uint64_t seed = 1;
  int heartbeatTimeoutMs = 1000;
};

// Inputs with exact sums (small multiples of 1/4) so every algorithm must
// give exactly the expected value.
float exactValue(int rank, size_t i) { return float(int((uint64_t(rank) * 7 + i * 13) % 11)) * 0.25f; }

uint16_t toHalf(DType t, float f) { return t == DType::kBFloat16 ? floatToBf16(f) : floatToFp16(f); }
float fromHalf(DType t, uint16_t h) { return t == DType::kBFloat16 ? bf16ToFloat(h) : fp16ToFloat(h); }


// Every collective on shapes around the chunk and latency-path boundaries.
// Returns the first mismatch ("" when all match) and prints a hash of
// every result for the cross-rank comparison.
std::string runCorrectness(Communicator& comm, const PeerArgs& a, uint64_t* hash) {
  const int n = comm.size(), r = comm.rank();
  // Around the default latency-path limit (32 KiB) and the chunk size.
  std::vector<size_t> counts{0, 1, 3, 7, 1000, 8192, 8193, a.chunk / 4 * size_t(n) + 5, 100003};
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
      for (size_t count : counts) {
        const size_t es = reduceElementBytes(dt);
        std::vector<std::byte> buf(count * es);
        for (size_t i = 0; i < count; ++i) {
          const float v = exactValue(r, i);
          if (dt == DType::kFloat32) {
            std::memcpy(buf.data() + i * 4, &v, 4);
          } else {
            const uint16_t h = toHalf(dt, v);
            std::memcpy(buf.data() + i * 2, &h, 2);
          }
        }
        Status s = comm.allReduce(buf.data(), count, dt, op);
        if (!s.isOk()) return "allReduce: " + s.toString();
        for (size_t i = 0; i < count; ++i) {
          float sum = 0;
          for (int k = 0; k < n; ++k) sum += exactValue(k, i);
          float want = op == ReduceOp::kSum ? sum : sum * (1.0f / float(n));
          float got;
          if (dt == DType::kFloat32) {
            std::memcpy(&got, buf.data() + i * 4, 4);
          } else {
            uint16_t h;
            std::memcpy(&h, buf.data() + i * 2, 2);
            got = fromHalf(dt, h);
            want = fromHalf(dt, toHalf(dt, want));
          }
          if (got != want) {
            return fmt::format("allReduce {} dtype {} count {} element {}: got {}, want {}", reduceOpName(op), int(dt),
                               count, i, got, want);
          }
        }
        *hash = hashBytes(std::string_view(reinterpret_cast<const char*>(buf.data()), buf.size()), *hash);
      }
    }
  }
  for (size_t bytes : {size_t(0), size_t(1), size_t(5000), a.chunk * 3 + 1}) {
    for (int root = 0; root < n; ++root) {
      std::vector<uint8_t> b(bytes);
      for (size_t i = 0; i < bytes; ++i) b[i] = uint8_t(r == root ? (i * 31 + size_t(root)) : 0xEE);
      Status s = comm.broadcast(b.data(), bytes, root);
      if (!s.isOk()) return "broadcast: " + s.toString();
      for (size_t i = 0; i < bytes; ++i) {
        if (b[i] != uint8_t(i * 31 + size_t(root))) return fmt::format("broadcast root {} byte {} wrong", root, i);
      }
    }
    std::vector<uint8_t> in(bytes), out(bytes * size_t(n), 0xEE);
    for (size_t i = 0; i < bytes; ++i) in[i] = uint8_t(i + size_t(r) * 3);
    Status s = comm.allGather(in.data(), out.data(), bytes);
    if (!s.isOk()) return "allGather: " + s.toString();
    for (int k = 0; k < n; ++k) {
      for (size_t i = 0; i < bytes; ++i) {
        if (out[size_t(k) * bytes + i] != uint8_t(i + size_t(k) * 3)) return fmt::format("allGather block {} wrong", k);
      }
    }
  }
  for (size_t base : {size_t(0), size_t(10), a.chunk * 2 + 3}) {
    std::vector<uint8_t> in(base + size_t(r) * 17);
    for (size_t i = 0; i < in.size(); ++i) in[i] = uint8_t(i ^ size_t(r));
    auto got = comm.allGatherV(in.data(), in.size());
    if (!got.hasValue()) return "allGatherV: " + got.status().toString();
    if (int(got->size()) != n) return "allGatherV: wrong block count";
    for (int k = 0; k < n; ++k) {
      const auto& blk = (*got)[size_t(k)];
      if (blk.size() != base + size_t(k) * 17) return fmt::format("allGatherV block {} has {} bytes", k, blk.size());
      for (size_t i = 0; i < blk.size(); ++i) {
        if (uint8_t(blk[i]) != uint8_t(i ^ size_t(k))) return fmt::format("allGatherV block {} byte {} wrong", k, i);
      }
    }
  }
  for (size_t bytes : {size_t(0), size_t(1), size_t(5000), a.chunk * 3 + 1}) {
    // Block j of rank r holds (r, j, i); rank r's out gets block r of every rank.
    std::vector<uint8_t> in(bytes * size_t(n)), out(bytes * size_t(n), 0xEE);
    for (int j = 0; j < n; ++j) {
      for (size_t i = 0; i < bytes; ++i) in[size_t(j) * bytes + i] = uint8_t(r * 53 + j * 7 + int(i));
    }
    Status s = comm.allToAll(in.data(), out.data(), bytes);
    if (!s.isOk()) return "allToAll: " + s.toString();
    for (int k = 0; k < n; ++k) {
      for (size_t i = 0; i < bytes; ++i) {
        if (out[size_t(k) * bytes + i] != uint8_t(k * 53 + r * 7 + int(i))) {
          return fmt::format("allToAll {} bytes: block from rank {} byte {} wrong", bytes, k, i);
        }
      }
    }
  }
  for (int i = 0; i < 5; ++i) {
    Status s = comm.barrier();
    if (!s.isOk()) return "barrier: " + s.toString();
  }
  return "";
}

// A rank's gradient in the compression runs: smooth, signed, of varied
// magnitude, different on every rank.
float gradientValue(int rank, int64_t i) {
  return float(std::sin(0.37 * double(i) + 1.3 * rank) * (1.0 + 0.5 * std::cos(0.011 * double(i))));
}

// Every codec through CompressedAllReduce: the same gradient on every rank
// each step for `steps` steps. Error feedback loses nothing, it only
// delays: the mean of the results must approach the exact mean of the
// ranks' gradients within a bound of each codec (what a residual can hold
// back, divided by the steps), every rank must hold the same bits, the
// tensor bytes must be the codec's share of a float32 ring's, and the
// transport must have counted at least those bytes under the label.
std::string runCompressed(Communicator& comm, transport::RemoteActors& remote, uint64_t* hash) {
  const int n = comm.size(), r = comm.rank();
  const int steps = 60;
  struct Case {
    kernels::CodecKind kind;
    double fraction;
    double meanTolerance;  // |mean of results - exact mean|, max over elements
  };
  const std::vector<Case> cases = {
      // Exact but for float sums: none, int8, onebit, topk, randomk. The
      // casts are summed in the ring as halves, rounded once per addition
      // (what no residual sees): 2^-11 (fp16) and 2^-8 (bf16) of |sum| <= 3.
      {kernels::CodecKind::kNone, 1.0, 1e-5},    {kernels::CodecKind::kFp16, 1.0, 3.0 / 2048},
      {kernels::CodecKind::kBf16, 1.0, 3.0 / 256}, {kernels::CodecKind::kInt8, 1.0, 1e-5},
      {kernels::CodecKind::kOneBit, 1.0, 1e-5},  {kernels::CodecKind::kTopK, 0.25, 1e-5},
      {kernels::CodecKind::kRandomK, 0.25, 1e-5},
  };
  for (const Case& c : cases) {
    for (int64_t count : {int64_t(1), int64_t(7), int64_t(1000), int64_t(20011)}) {
      kernels::CodecOptions o;
      o.kind = c.kind;
      o.fraction = c.fraction;
      o.chunk = 64;
      o.seed = 5;
      CompressedAllReduce reducer(o, /*warmupSteps=*/1);
      const std::string label = std::string("test-") + kernels::codecName(c.kind);
      comm.setTrafficLabel(label);
      auto countedUnder = [&remote](const std::string& l) {
        const auto wire = remote.traffic();
        const auto it = wire.find(l);
        return it == wire.end() ? transport::RemoteActors::TrafficCount{} : it->second;
      };
      const auto before = countedUnder(label);
      std::vector<double> sum(size_t(count), 0.0);
      std::vector<float> g(static_cast<size_t>(count));
      for (int step = 0; step < steps; ++step) {
        for (int64_t i = 0; i < count; ++i) g[size_t(i)] = gradientValue(r, i);
        Status s = reducer.reduce(comm, 3, g.data(), count, step);
        if (!s.isOk()) return fmt::format("{} count {} step {}: {}", kernels::codecName(c.kind), count, step, s.toString());
        for (int64_t i = 0; i < count; ++i) sum[size_t(i)] += g[size_t(i)];
        *hash = hashBytes(std::string_view(reinterpret_cast<const char*>(g.data()), g.size() * 4), *hash);
        if (step == 0) {
          // The warm-up step goes uncompressed: the exact mean (float32 ring).
          for (int64_t i = 0; i < count; ++i) {
            double exact = 0;
            for (int k = 0; k < n; ++k) exact += gradientValue(k, i);
            exact /= n;
            if (std::fabs(g[size_t(i)] - exact) > 1e-5) {
              return fmt::format("{} count {}: the warm-up step gave {} at {}, the mean is {}", kernels::codecName(c.kind),
                                 count, g[size_t(i)], i, exact);
            }
          }
        }
      }
      const auto after = countedUnder(label);  // (the checks' own reductions are not the codec's)
      comm.setTrafficLabel("collective");
      // What the residuals still hold: the ranks' (averaged) and the
      // segment owners' (int8, onebit), each where it belongs.
      std::vector<float> held = reducer.residuals(3), owned(static_cast<size_t>(count), 0.0f);
      if (held.empty()) held.assign(size_t(count), 0.0f);
      const std::vector<float> mine = reducer.ownerResiduals(3);
      if (!mine.empty()) std::copy(mine.begin(), mine.end(), owned.begin() + count * r / n);
      // (the casts encode each rank's share of the mean: their residuals add up)
      const bool cast = c.kind == kernels::CodecKind::kFp16 || c.kind == kernels::CodecKind::kBf16;
      Status s = comm.allReduce(held.data(), size_t(count), DType::kFloat32, cast ? ReduceOp::kSum : ReduceOp::kAverage);
      if (s.isOk()) s = comm.allReduce(owned.data(), size_t(count), DType::kFloat32, ReduceOp::kSum);
      if (!s.isOk()) return "gathering the residuals: " + s.toString();
      double worst = 0;
      int64_t at = 0;
      for (int64_t i = 0; i < count; ++i) {
        double exact = 0;
        for (int k = 0; k < n; ++k) exact += gradientValue(k, i);
        exact /= n;
        // Sent plus held back is every step's mean: nothing was lost.
        const double err = std::fabs((sum[size_t(i)] + double(held[size_t(i)]) + double(owned[size_t(i)])) / steps - exact);
        if (err > worst) worst = err, at = i;
      }
      if (worst > c.meanTolerance) {
        return fmt::format("{} count {}: over {} steps, what was sent and what the residuals hold is off the mean by "
                           "{} at element {} (bound {})",
                           kernels::codecName(c.kind), count, steps, worst, at, c.meanTolerance);
      }
      // The bytes: (steps - 1) compressed reductions and one plain.
      const auto st = reducer.stats();
      if (st.reductions != steps || st.compressed != (c.kind == kernels::CodecKind::kNone || n == 1 ? 0 : steps - 1)) {
        return fmt::format("{}: {} reductions, {} compressed", kernels::codecName(c.kind), st.reductions, st.compressed);
      }
      // A ring all-reduce of m elements sends every segment once and
      // segments r, r - 1, ..., r - (n - 3) again (the all-gather's
      // forwards); nothing with one rank.
      auto ringOf = [&](int64_t m) {
        if (n == 1) return 0.0;
        auto seg = [&](int j) { return double(m * (j + 1) / n - m * j / n); };
        double elems = double(m);
        for (int t = 0; t + 2 < n; ++t) elems += seg(((r - t) % n + n) % n);
        return elems * 4.0;
      };
      const double ring = ringOf(count);
      const auto k = std::max<int64_t>(1, int64_t(std::ceil(c.fraction * double(count))));
      double encoded = ring;  // a compressed step's bytes from this rank
      size_t longest = 0;     // int8, onebit: the longest segment's encoding sets the block
      for (int j = 0; j < n; ++j) {
        const int64_t len = count * (j + 1) / n - count * j / n;
        const int64_t chunks = (len + 63) / 64;
        longest = std::max(longest, c.kind == kernels::CodecKind::kInt8 ? size_t(32 + chunks * 4 + len)
                                                                           : size_t(32 + chunks * 4 + (len + 7) / 8));
      }
      switch (c.kind) {
        case kernels::CodecKind::kNone: break;
        case kernels::CodecKind::kFp16:
        case kernels::CodecKind::kBf16: encoded = ring / 2; break;
        case kernels::CodecKind::kInt8:
        case kernels::CodecKind::kOneBit: encoded = 2.0 * (n - 1) * double(longest); break;
        case kernels::CodecKind::kTopK: encoded = (n - 1) * double(32 + 8 * k); break;
        case kernels::CodecKind::kRandomK: encoded = ringOf(k); break;
      }
      // (one rank sends nothing and compresses nothing)
      const double wantEncoded = ring + (steps - 1) * encoded, wantRaw = steps * ring;
      if (std::fabs(st.encodedBytes - wantEncoded) > 1e-6 * wantEncoded + 1 || std::fabs(st.rawBytes - wantRaw) > 1e-6 * wantRaw + 1) {
        return fmt::format("{} count {}: {} encoded and {} float32 bytes counted, {} and {} expected",
                           kernels::codecName(c.kind), count, st.encodedBytes, st.rawBytes, wantEncoded, wantRaw);
      }
      const double counted = double(after.bytes - before.bytes), frames = double(after.frames - before.frames);
      if (n > 1 && (counted < wantEncoded || counted > wantEncoded + 512.0 * frames + 1)) {
        return fmt::format("{} count {}: the transport counted {} bytes in {} frames under '{}', the tensors were {}",
                           kernels::codecName(c.kind), count, counted, frames, label, wantEncoded);
      }
    }
  }
  return "";
}

// Rounding-sensitive inputs: the result's bits must agree on every rank and
// from one run to the next.
uint64_t runDeterminism(Communicator& comm, const PeerArgs& a, std::string* error) {
  uint64_t hash = 0;
  for (size_t count : {size_t(1000), size_t(3000), size_t(262147)}) {
    for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
      Rng rng(hashCombine(a.seed, uint64_t(comm.rank()) * 1000 + count));
      const size_t es = reduceElementBytes(dt);
      std::vector<std::byte> buf(count * es);
      for (size_t i = 0; i < count; ++i) {
        const float v = float(rng.uniform() * 2 - 1) * 1e3f;
        if (dt == DType::kFloat32) {
          std::memcpy(buf.data() + i * 4, &v, 4);
        } else {
          const uint16_t h = floatToBf16(v);
          std::memcpy(buf.data() + i * 2, &h, 2);
        }
      }
      Status s = comm.allReduce(buf.data(), count, dt, ReduceOp::kAverage);
      if (!s.isOk()) {
        *error = s.toString();
        return 0;
      }
      hash = hashBytes(std::string_view(reinterpret_cast<const char*>(buf.data()), buf.size()), hash);
    }
  }
  return hash;
}

int peerMain(const PeerArgs& a) {
  caf::actor_system_config cfg;
  caf::actor_system system{cfg};
  transport::NodeOptions no;
  no.nodeId = kNodeBase + uint64_t(a.rank);
  no.role = "rank";
  no.token = "collectives-test";
  no.heartbeatTimeout = std::chrono::milliseconds(a.heartbeatTimeoutMs);
  no.heartbeatInterval = std::chrono::milliseconds(std::max(50, a.heartbeatTimeoutMs / 5));
  if (a.rank == 0) {
    no.isCoordinator = true;
  } else {
    no.coordinator = a.coordinator;
  }
  auto remote = transport::RemoteActors::start(system, no);
  if (!remote.hasValue()) {
    std::printf("error %s\n", remote.status().toString().c_str());
    return 2;
  }
  if (a.rank == 0) {
    std::ofstream(a.portFile + ".tmp") << (*remote)->node().port() << "\n";
    std::rename((a.portFile + ".tmp").c_str(), a.portFile.c_str());
  }
  Status s = (*remote)->node().waitForMembers(size_t(a.n), 30s);
  if (!s.isOk()) {
    std::printf("error members: %s\n", s.toString().c_str());
    return 2;
  }
  std::vector<uint64_t> nodes;
  for (int r = 0; r < a.n; ++r) nodes.push_back(kNodeBase + uint64_t(r));
  if (a.scenario == "watch") {
    // No traffic but the watch's own: it alone must connect this rank to
    // the others (only the coordinator's rank is connected by the join),
    // so a killed rank is seen (what the NCCL backend relies on).
    PeerWatch watch(**remote, nodes, a.rank);
    std::printf("running\n");
    std::fflush(stdout);
    const auto start = std::chrono::steady_clock::now();
    while (watch.status().isOk() && std::chrono::steady_clock::now() - start < 30s) std::this_thread::sleep_for(10ms);
    const Status down = watch.status();
    std::printf("%s %s\n", down.isOk() ? "nothing" : "down", down.toString().c_str());
    std::fflush(stdout);
    std::this_thread::sleep_for(3s);  // the others see this rank's goodbye only after their own verdict
    return down.isOk() ? 1 : 3;
  }
  if (a.scenario == "leave" && a.rank == a.n - 1) {
    // This rank leaves the job (its process exits) instead of forming the
    // group, once the others know every member (they are forming it then).
    std::this_thread::sleep_for(500ms);
    std::printf("leaving\n");
    std::fflush(stdout);
    return 0;
  }
  RingOptions ro;
  ro.rank = a.rank;
  ro.nodes = nodes;
  if (a.scenario == "leave") ro.connectTimeout = 60s;
  ro.chunkBytes = a.chunk;
  ro.smallBytes = a.small;
  ro.timeout = 60s;
  auto comm = RingCommunicator::create(**remote, ro);
  if (!comm.hasValue()) {
    std::printf("error create: %s\n", comm.status().toString().c_str());
    return 2;
  }
  int rc = 0;
  if (a.scenario == "regroup") {
    // A group formed again (epoch 1) while this process still holds the old
    // one: the old one going away must leave the new group's frames alone.
    s = (*comm)->barrier();  // every rank formed the old group (its frames are not the new one's)
    if (!s.isOk()) {
      std::printf("error barrier: %s\n", s.toString().c_str());
      return 2;
    }
    RingOptions again = ro;
    again.epoch = 1;
    again.timeout = 10s;
    auto next = RingCommunicator::create(**remote, again);
    if (!next.hasValue()) {
      std::printf("error create again: %s\n", next.status().toString().c_str());
      return 2;
    }
    comm->reset();
    std::vector<float> buf(4096, float(a.rank + 1));
    s = (*next)->allReduce(buf.data(), buf.size(), DType::kFloat32, ReduceOp::kSum);
    const float want = float(a.n * (a.n + 1) / 2);
    if (!s.isOk() || buf[0] != want || buf.back() != want) {
      std::printf("error the new group: %s (%g, wanted %g)\n", s.toString().c_str(), double(buf[0]), double(want));
      return 1;
    }
    std::printf("hash %016llx\n", 0x1ULL);
    std::fflush(stdout);
    next->reset();
    return 0;
  }
  if (a.scenario == "correct") {
    uint64_t hash = 0;
    std::string err = runCorrectness(**comm, a, &hash);
    if (!err.empty()) {
      std::printf("mismatch %s\n", err.c_str());
      rc = 1;
    } else {
      std::printf("hash %016llx\n", (unsigned long long)hash);
    }
  } else if (a.scenario == "compressed") {
    uint64_t hash = 0;
    std::string err = runCompressed(**comm, **remote, &hash);
    if (!err.empty()) {
      std::printf("mismatch %s\n", err.c_str());
      rc = 1;
    } else {
      std::printf("hash %016llx\n", (unsigned long long)hash);
    }
  } else if (a.scenario == "abort") {
    // The last rank fails on its own between collectives and aborts; the
    // others, waiting in their next all-reduce, hear it at once.
    s = (*comm)->barrier();
    if (!s.isOk()) {
      std::printf("error barrier: %s\n", s.toString().c_str());
      return 2;
    }
    const auto start = std::chrono::steady_clock::now();
    if (a.rank == a.n - 1) {
      // (after the others' barrier sends are done: they are waiting in
      // their all-reduce when the abort comes)
      std::this_thread::sleep_for(200ms);
      s = (*comm)->abort(Status::corruption("rank's own decode failed"));
    } else {
      std::vector<float> buf(1000, 1.0f);
      s = (*comm)->allReduce(buf.data(), buf.size(), DType::kFloat32, ReduceOp::kSum);
    }
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    Status again = (*comm)->barrier();
    std::printf("failed %s | again %s | took %.3f\n", s.toString().c_str(), again.toString().c_str(), took);
    rc = s.isOk() || again.isOk() ? 1 : 3;
  } else if (a.scenario == "determinism") {
    std::string err;
    const uint64_t hash = runDeterminism(**comm, a, &err);
    if (!err.empty()) {
      std::printf("error %s\n", err.c_str());
      rc = 1;
    } else {
      std::printf("hash %016llx\n", (unsigned long long)hash);
    }
  } else if (a.scenario == "kill") {
    // All-reduce 4 MiB until a collective fails (a rank is killed), bounded.
    std::vector<float> buf(size_t(1) << 20, 1.0f);
    const auto start = std::chrono::steady_clock::now();
    int i = 0;
    for (; i < 100000 && std::chrono::steady_clock::now() - start < 60s; ++i) {
      if (i == 3) {
        std::printf("running\n");
        std::fflush(stdout);
      }
      s = (*comm)->allReduce(buf.data(), buf.size(), DType::kFloat32, ReduceOp::kAverage);
      if (!s.isOk()) break;
    }
    if (s.isOk()) {
      std::printf("no failure after %d collectives\n", i);
      rc = 1;
    } else {
      // Every later call fails at once with the same error.
      Status again = (*comm)->barrier();
      std::printf("failed %s | again %s\n", s.toString().c_str(), again.toString().c_str());
      rc = again.isOk() ? 1 : 3;
    }
  }
  std::fflush(stdout);
  comm->reset();
  return rc;
}

// ------------------------------------------------------------------ the tests

struct Group {
  std::vector<std::unique_ptr<Child>> children;
  std::vector<std::string> logs;
};

Group startGroup(const TempDir& dir, int n, const std::string& scenario, std::vector<std::string> extra = {}) {
  Group g;
  const std::string portFile = dir.path() + "/port";
  ::unlink(portFile.c_str());
  for (int r = 0; r < n; ++r) {
    std::vector<std::string> argv{testing::selfExe(), "--peer", "--rank", std::to_string(r), "--n", std::to_string(n),
                                  "--scenario", scenario, "--port-file", portFile};
    argv.insert(argv.end(), extra.begin(), extra.end());
    if (r > 0) {
      std::string port;
      for (int i = 0; i < 3000 && port.empty(); ++i) {
        std::ifstream in(portFile);
        if (!(in >> port)) {
          port.clear();
          std::this_thread::sleep_for(10ms);
        }
      }
      EXPECT_FALSE(port.empty()) << "rank 0 wrote no port";
      argv.push_back("--coordinator");
      argv.push_back("127.0.0.1:" + port);
    }
    g.logs.push_back(dir.path() + "/" + scenario + "-" + std::to_string(r) + ".log");
    g.children.push_back(std::make_unique<Child>(argv, g.logs.back()));
  }
  return g;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string lineWith(const std::string& text, const std::string& prefix) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(prefix, 0) == 0) return line.substr(prefix.size());
  }
  return "";
}

// Runs a group to the end; the hash each rank printed.
std::vector<std::string> runGroup(int n, const std::string& scenario, std::vector<std::string> extra = {}) {
  TempDir dir;
  Group g = startGroup(dir, n, scenario, std::move(extra));
  std::vector<std::string> hashes;
  for (int r = 0; r < n; ++r) {
    auto res = g.children[size_t(r)]->wait(120s);
    const std::string log = slurp(g.logs[size_t(r)]);
    EXPECT_EQ(res.exitCode, 0) << "rank " << r << " of " << n << ":\n" << log;
    hashes.push_back(lineWith(log, "hash "));
  }
  return hashes;
}

class CollectivesGroups : public ::testing::TestWithParam<int> {};

TEST_P(CollectivesGroups, EveryCollectiveEveryShapeAndTypeIsExactAndIdenticalOnEveryRank) {
  const int n = GetParam();
  auto hashes = runGroup(n, "correct");
  for (int r = 0; r < n; ++r) {
    EXPECT_FALSE(hashes[size_t(r)].empty()) << "rank " << r;
    EXPECT_EQ(hashes[size_t(r)], hashes[0]) << "rank " << r << " differs from rank 0";
  }
}

TEST_P(CollectivesGroups, LatencyPathAndRingAgreeOnExactSums) {
  // smallBytes 0: every all-reduce takes the ring, whatever n.
  const int n = GetParam();
  auto ring = runGroup(n, "correct", {"--small", "0"});
  auto mixed = runGroup(n, "correct");
  EXPECT_EQ(ring[0], mixed[0]);
}

TEST_P(CollectivesGroups, EveryCodecLosesNothingOverStepsAndSendsItsShareOfTheBytes) {
  const int n = GetParam();
  // (smallBytes 0: the plain reductions take the ring, whose bytes the
  // reducer counts as the float32 reference)
  auto hashes = runGroup(n, "compressed", {"--small", "0"});
  for (int r = 0; r < n; ++r) {
    EXPECT_FALSE(hashes[size_t(r)].empty()) << "rank " << r;
    EXPECT_EQ(hashes[size_t(r)], hashes[0]) << "rank " << r << " holds other bits than rank 0";
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, CollectivesGroups, ::testing::Values(1, 2, 3, 4));

// A rank that fails on its own between collectives (a peer's block that
// does not decode) aborts: the others' next collective fails at once with
// its reason, not after the collective timeout (60 s here).
TEST(Collectives, ARankThatAbortsFailsTheOthersNextCollectiveAtOnce) {
  TempDir dir;
  Group g = startGroup(dir, 3, "abort");
  for (int r = 0; r < 3; ++r) {
    auto res = g.children[size_t(r)]->wait(60s);
    const std::string log = slurp(g.logs[size_t(r)]);
    EXPECT_EQ(res.exitCode, 3) << "rank " << r << ":\n" << log;
    EXPECT_NE(log.find("rank's own decode failed"), std::string::npos) << "rank " << r << ":\n" << log;
    const double took = std::strtod(lineWith(log, "failed ").substr(lineWith(log, "failed ").rfind("took ") + 5).c_str(), nullptr);
    EXPECT_LT(took, 5.0) << "rank " << r << ":\n" << log;
  }
}

// The compressed all-reduce calls abort when a block it received does not
// decode (here: a peer's encoding of another codec), naming the block.
class CorruptingComm final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  const char* backend() const override { return "corrupting"; }
  Status allReduce(void*, size_t, DType, ReduceOp) override { return Status::ok(); }
  Status broadcast(void*, size_t, int) override { return Status::ok(); }
  Status allGather(const void* in, void* out, size_t bytes) override {
    // Rank 1's block: this rank's with the codec kind byte changed.
    std::memcpy(out, in, bytes);
    std::memcpy(static_cast<std::byte*>(out) + bytes, in, bytes);
    static_cast<uint8_t*>(out)[bytes + 4] ^= 0x7;
    return Status::ok();
  }
  Expected<std::vector<std::vector<std::byte>>> allGatherV(const void*, size_t) override {
    return std::vector<std::vector<std::byte>>{};
  }
  Status barrier() override { return Status::ok(); }
  Status abort(Status why) override {
    aborted = why;
    return why;
  }
  Status aborted;
};

TEST(CompressedAllReduce, ABlockThatDoesNotDecodeAbortsTheGroup) {
  CorruptingComm comm;
  kernels::CodecOptions o;
  o.kind = kernels::CodecKind::kTopK;
  o.fraction = 0.5;
  CompressedAllReduce reducer(o, 0);
  std::vector<float> g(100, 1.0f);
  Status s = reducer.reduce(comm, 0, g.data(), int64_t(g.size()), 0);
  EXPECT_FALSE(s.isOk());
  EXPECT_FALSE(comm.aborted.isOk()) << "abort was not called";
  EXPECT_NE(comm.aborted.message().find("rank 1's block"), std::string::npos) << comm.aborted.message();
}

TEST(Collectives, RoundingSensitiveResultsAreBitIdenticalAcrossRanksAndRuns) {
  auto first = runGroup(4, "determinism", {"--seed", "11"});
  auto second = runGroup(4, "determinism", {"--seed", "11"});
  auto other = runGroup(4, "determinism", {"--seed", "12"});
  for (int r = 0; r < 4; ++r) {
    ASSERT_FALSE(first[size_t(r)].empty());
    EXPECT_EQ(first[size_t(r)], first[0]) << "rank " << r;
    EXPECT_EQ(second[size_t(r)], first[0]) << "run 2, rank " << r;
  }
  EXPECT_NE(other[0], first[0]) << "a different seed must change the result (the test can fail)";
}

class KilledRank : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(KilledRank, FailsEveryOtherRankWithinTheHeartbeatTimeout) {
  const auto [n, victim] = GetParam();
  TempDir dir;
  Group g = startGroup(dir, n, "kill", {"--heartbeat-ms", "1000", "--chunk", "65536"});
  // Wait until the victim is inside its all-reduce loop (bounded).
  bool running = false;
  for (int i = 0; i < 3000 && !running; ++i) {
    running = slurp(g.logs[size_t(victim)]).find("running") != std::string::npos;
    if (!running) std::this_thread::sleep_for(10ms);
  }
  ASSERT_TRUE(running) << slurp(g.logs[size_t(victim)]);
  const auto killedAt = std::chrono::steady_clock::now();
  g.children[size_t(victim)]->kill(SIGKILL);
  for (int r = 0; r < n; ++r) {
    if (r == victim) continue;
    auto res = g.children[size_t(r)]->wait(30s);
    const double after = std::chrono::duration<double>(std::chrono::steady_clock::now() - killedAt).count();
    const std::string log = slurp(g.logs[size_t(r)]);
    EXPECT_EQ(res.exitCode, 3) << "rank " << r << ":\n" << log;
    EXPECT_NE(log.find("failed"), std::string::npos) << log;
    // Heartbeat timeout 1 s, plus start-up and scheduling slack.
    EXPECT_LT(after, 6.0) << "rank " << r << " took " << after << " s to fail";
  }
  g.children[size_t(victim)]->wait(5s);
}

// A rank that leaves the job (its process exits cleanly) while the others
// form a group: they learn it and fail at once, rather than waiting the 60 s
// of their connect timeout for a hello that never comes.
TEST(Collectives, ARankThatLeftFailsTheGroupFormingAtOnce) {
  TempDir dir;
  const auto start = std::chrono::steady_clock::now();
  Group g = startGroup(dir, 3, "leave", {"--heartbeat-ms", "1000"});
  for (int r = 0; r < 2; ++r) {
    auto res = g.children[size_t(r)]->wait(30s);
    const double after = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const std::string log = slurp(g.logs[size_t(r)]);
    EXPECT_EQ(res.exitCode, 2) << "rank " << r << ":\n" << log;
    EXPECT_NE(log.find("error create: "), std::string::npos) << log;
    EXPECT_NE(log.find("rank 2"), std::string::npos) << log;
    EXPECT_LT(after, 20.0) << "rank " << r << " took " << after << " s";
  }
  // The leaving rank's own exit status is not asserted: its transport can
  // crash inside UCX (ucp_ep_client_cm_connect_start) when a peer's
  // connection comes in as it shuts down, a known bug of the transport's
  // teardown, tracked on its own.
  EXPECT_FALSE(g.children[2]->wait(10s).timedOut);
}

// A process that forms a group again before its old communicator is gone
// (a regroup): destroying the old one detaches only its own frame sink, so
// the new group's collectives still get their frames.
TEST(Collectives, AnOldGroupGoingAwayLeavesTheNewGroupsFramesAlone) {
  auto hashes = runGroup(3, "regroup");
  for (const auto& h : hashes) EXPECT_EQ(h, "0000000000000001");
}

// The peer watch (the NCCL backend's health): with no other traffic between
// ranks 1 and 2 (neither is the coordinator), rank 1 still sees rank 2
// killed, within the heartbeat timeout.
TEST(PeerWatch, SeesAKilledRankItNeverExchangedDataWith) {
  TempDir dir;
  Group g = startGroup(dir, 3, "watch", {"--heartbeat-ms", "1000"});
  for (int r = 0; r < 3; ++r) {
    bool running = false;
    for (int i = 0; i < 3000 && !running; ++i) {
      running = slurp(g.logs[size_t(r)]).find("running") != std::string::npos;
      if (!running) std::this_thread::sleep_for(10ms);
    }
    ASSERT_TRUE(running) << slurp(g.logs[size_t(r)]);
  }
  std::this_thread::sleep_for(300ms);  // the watch frames connect ranks 1 and 2
  const auto killedAt = std::chrono::steady_clock::now();
  g.children[2]->kill(SIGKILL);
  for (int r : {1, 0}) {
    std::string log;
    for (int i = 0; i < 1500; ++i) {
      log = slurp(g.logs[size_t(r)]);
      if (log.find("down ") != std::string::npos || log.find("nothing ") != std::string::npos) break;
      std::this_thread::sleep_for(10ms);
    }
    const double after = std::chrono::duration<double>(std::chrono::steady_clock::now() - killedAt).count();
    EXPECT_NE(log.find("down "), std::string::npos) << "rank " << r << ":\n" << log;
    EXPECT_NE(log.find("rank 2"), std::string::npos) << "rank " << r << ":\n" << log;
    EXPECT_LT(after, 6.0) << "rank " << r << " took " << after << " s";
  }
  for (int r : {0, 1}) g.children[size_t(r)]->wait(20s);
  g.children[2]->wait(5s);
}

INSTANTIATE_TEST_SUITE_P(Groups, KilledRank,
                         ::testing::Values(std::make_pair(2, 1), std::make_pair(3, 0), std::make_pair(4, 2)));

// ------------------------------------------------------------------ in process

TEST(Reduce, HalfConversionsRoundToNearestEven) {
  EXPECT_EQ(floatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16ToFloat(0x3f80), 1.0f);
  // 1 + 2^-8 is halfway between two bf16 values: ties to even (1.0).
  EXPECT_EQ(floatToBf16(1.00390625f), 0x3f80);
  EXPECT_EQ(floatToBf16(1.01171875f), 0x3f82);  // 1 + 3 x 2^-8 -> up to even
  EXPECT_EQ(floatToFp16(1.0f), 0x3c00);
  EXPECT_EQ(fp16ToFloat(0x3c00), 1.0f);
  EXPECT_EQ(floatToFp16(65504.0f), 0x7bff);
  EXPECT_EQ(floatToFp16(70000.0f), 0x7c00);
  EXPECT_EQ(floatToFp16(-2.0f), 0xc000);
  EXPECT_EQ(fp16ToFloat(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(floatToFp16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(floatToFp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // halfway: to even
  for (uint32_t h = 0; h < 0x7c00; ++h) {  // every finite positive half round-trips
    ASSERT_EQ(floatToFp16(fp16ToFloat(uint16_t(h))), h) << h;
  }
  EXPECT_TRUE(std::isnan(fp16ToFloat(floatToFp16(std::nanf("")))));
}

// A communicator in one process for the bucket tests: records what it was
// asked to reduce and doubles it (a "sum" over two equal ranks).
class RecordingComm final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  const char* backend() const override { return "recording"; }
  Status allReduce(void* data, size_t count, DType, ReduceOp) override {
    std::lock_guard<std::mutex> lock(mutex);
    auto* f = static_cast<float*>(data);
    calls.push_back({int64_t(f - base), int64_t(count)});
    for (size_t i = 0; i < count; ++i) f[i] *= 2;
    if (failAt >= 0 && int(calls.size()) == failAt) return Status::unavailable("rank 1 is down");
    return Status::ok();
  }
  Status broadcast(void*, size_t, int) override { return Status::ok(); }
  Status allGather(const void*, void*, size_t) override { return Status::ok(); }
  Expected<std::vector<std::vector<std::byte>>> allGatherV(const void*, size_t) override {
    return std::vector<std::vector<std::byte>>{};
  }
  Status barrier() override { return Status::ok(); }
  std::mutex mutex;
  std::vector<GradRange> calls;
  float* base = nullptr;
  int failAt = -1;
};

TEST(GradientBuckets, GroupsAdjacentRangesInBackwardOrderAndCoversTheRest) {
  auto comm = std::make_shared<RecordingComm>();
  std::vector<float> grads(100, 1.0f);
  comm->base = grads.data();
  // Backward fills [60,100) then [40,60) then [10,40); [0,10) is never reported.
  GradientBuckets b(comm, grads.data(), 100, {{60, 40}, {40, 20}, {10, 30}}, /*bucketBytes=*/60 * 4);
  ASSERT_EQ(b.buckets().size(), 3u);
  EXPECT_EQ(b.buckets()[0].offset, 40);  // [40,100): two ranges, 60 floats
  EXPECT_EQ(b.buckets()[0].count, 60);
  EXPECT_EQ(b.buckets()[1].offset, 10);
  EXPECT_EQ(b.buckets()[2].offset, 0);  // the uncovered head
  for (int step = 0; step < 2; ++step) {
    b.ready(60, 40);
    // The first bucket waits for its second range.
    std::this_thread::sleep_for(20ms);
    {
      std::lock_guard<std::mutex> lock(comm->mutex);
      EXPECT_EQ(comm->calls.size(), size_t(step * 3));
    }
    b.ready(40, 20);
    b.ready(10, 30);
    ASSERT_TRUE(b.finish().isOk());
  }
  ASSERT_EQ(comm->calls.size(), 6u);
  EXPECT_EQ(comm->calls[0].offset, 40);
  EXPECT_EQ(comm->calls[1].offset, 10);
  EXPECT_EQ(comm->calls[2].offset, 0);
  for (float g : grads) EXPECT_EQ(g, 4.0f);  // every float reduced once per step
}

TEST(GradientBuckets, LaunchesInFixedOrderAndReportsTheFirstError) {
  auto comm = std::make_shared<RecordingComm>();
  std::vector<float> grads(30, 1.0f);
  comm->base = grads.data();
  comm->failAt = 1;
  GradientBuckets b(comm, grads.data(), 30, {{20, 10}, {10, 10}, {0, 10}}, 40);
  b.ready(0, 10);  // out of order: nothing may start before bucket 0
  std::this_thread::sleep_for(20ms);
  {
    std::lock_guard<std::mutex> lock(comm->mutex);
    EXPECT_TRUE(comm->calls.empty());
  }
  b.ready(20, 10);
  b.ready(10, 10);
  Status s = b.finish();
  EXPECT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("rank 1 is down"), std::string::npos);
  std::lock_guard<std::mutex> lock(comm->mutex);
  EXPECT_EQ(comm->calls.size(), 1u) << "buckets after a failure are not reduced";
}

TEST(GradientBuckets, RefusesRangesOutsideOrOverlapping) {
  auto comm = std::make_shared<RecordingComm>();
  std::vector<float> grads(10);
  EXPECT_THROW(GradientBuckets(comm, grads.data(), 10, {{5, 10}}, 64), SetupError);
  EXPECT_THROW(GradientBuckets(comm, grads.data(), 10, {{0, 6}, {5, 2}}, 64), SetupError);
}

}  // namespace
}  // namespace troupe::collectives

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--peer") {
    troupe::collectives::PeerArgs a;
    for (int i = 2; i + 1 < argc; i += 2) {
      const std::string k = argv[i], v = argv[i + 1];
      if (k == "--rank") a.rank = std::stoi(v);
      else if (k == "--n") a.n = std::stoi(v);
      else if (k == "--scenario") a.scenario = v;
      else if (k == "--port-file") a.portFile = v;
      else if (k == "--coordinator") a.coordinator = v;
      else if (k == "--chunk") a.chunk = std::stoul(v);
      else if (k == "--small") a.small = std::stoul(v);
      else if (k == "--seed") a.seed = std::stoull(v);
      else if (k == "--heartbeat-ms") a.heartbeatTimeoutMs = std::stoi(v);
    }
    return troupe::collectives::peerMain(a);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
