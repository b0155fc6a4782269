// `troupe bench ps`: push and pull throughput of one worker against one
// parameter-server shard in another process on loopback, over the real shard
// protocol (ps/wire.h), beside the transport's ceiling (ucx_perftest tag_bw
// at the same message size) measured in the same run. Rows of 16, 64 and 256
// floats in batches of 1K to 100K keys, and ps-lite's own benchmark shapes
// (one key of 1K, 64K and 1M floats per request, with p50 latency).
#pragma once

#include <string>
#include <vector>

#include "transport/node.h"

namespace troupe::bench {

struct PsBenchOptions {
  std::string jsonPath;
  double seconds = 1.0;  // measuring time per figure
  bool withPerftest = true;
  transport::NodeOptions node;
  std::vector<std::string> passOn;
  bool serve = false;  // hidden: the shard process
  std::string coordinator;
};

int runPsBench(const PsBenchOptions& options);

}  // namespace troupe::bench
