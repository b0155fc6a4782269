// `troupe bench allreduce`: all-reduce (float32 sum) latency, algorithm and
// bus bandwidth (busbw = algbw x 2 (n - 1) / n) for 4 KiB, 1 MiB and 64 MiB
// with n = 2 and 4 processes on this machine, beside Gloo's ring over TCP
// (Debian libgloo-dev) and Open MPI's MPI_Allreduce (Debian openmpi-bin)
// measured the same way in the same run: each of n processes runs warm-up
// iterations, a barrier, then `iterations` all-reduces; rank 0's time per
// all-reduce, the median of `trials`.
//
// The peers are small programs built beside troupe when their libraries
// are found (bench/peers); a missing one is reported and left out.
#pragma once

#include <string>
#include <vector>

#include "transport/node.h"

namespace troupe::bench {

struct AllReduceBenchOptions {
  std::string jsonPath;
  std::vector<int> ranks = {2, 4};
  std::vector<uint64_t> sizes = {4096, 1 << 20, 64 << 20};
  int trials = 3;
  bool withPeers = true;
  transport::NodeOptions node;
  std::vector<std::string> passOn;  // --config/--set for the rank processes
  size_t chunkBytes = 512 << 10;
  size_t smallBytes = 32 << 10;
  int spinUs = 50;
  // Hidden: run as rank `rank` of `n`, joined to `coordinator`.
  int rank = -1, n = 0;
  std::string coordinator;
};

int runAllReduceBench(const AllReduceBenchOptions& options);

// Iterations per timed trial for a buffer of `bytes` (shared with the peers'
// command lines so every contender does the same work).
int allReduceIterations(uint64_t bytes);

}  // namespace troupe::bench
