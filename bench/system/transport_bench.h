// `troupe bench transport`: actor-to-actor one-way bandwidth (4 KiB .. 16 MiB
// tensors) and small-message round-trip latency between two troupe processes
// on loopback, beside UCX's own ceiling measured in the same run with
// ucx_perftest (tag_bw, tag_lat on 127.0.0.1).
#pragma once

#include <string>

#include "transport/node.h"
#include <vector>

namespace troupe::bench {

struct TransportBenchOptions {
  std::string jsonPath;           // also write the figures here
  std::vector<uint64_t> sizes = {4096, 65536, 1 << 20, 16 << 20};
  double secondsPerSize = 1.0;    // measuring time per payload size and trial
  int trials = 3;                 // the median is reported
  int latencyRoundTrips = 20000;
  bool withPerftest = true;       // run ucx_perftest beside
  transport::NodeOptions node;     // from the config's transport.* keys
  std::vector<std::string> passOn;  // --config/--set/--log-level for the receiving process
  // Hidden: run as the receiving process.
  bool serve = false;
  std::string coordinator;
};

// Returns the process exit status.
int runTransportBench(const TransportBenchOptions& options);

// ucx_perftest on loopback (shared with bench ps): whether it is installed,
// and one run's figures (perftest's final row; [5] is bandwidth in MB/s).
bool havePerftest();
std::vector<double> runPerftest(const std::string& test, uint64_t bytes, uint64_t iterations, bool tcpOnly);

}  // namespace troupe::bench
