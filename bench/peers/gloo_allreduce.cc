// The Gloo peer of `troupe bench allreduce`: Gloo's ring all-reduce (float
// sum) over its TCP transport on loopback, ranks meeting through a file
// store, timed the way troupe's ranks time theirs (warm-up, barrier, a fixed
// count of all-reduces per trial, the median of the trials on rank 0).
//
//   troupe_gloo_allreduce RANK SIZE_OF_GROUP STORE_DIR TRIALS SIZE[,SIZE...]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

namespace {

int iterations(unsigned long long bytes) {
  if (bytes <= (64u << 10)) return 2000;
  if (bytes <= (4u << 20)) return 100;
  return 5;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: troupe_gloo_allreduce RANK SIZE STORE_DIR TRIALS SIZE[,SIZE...]\n");
    return 2;
  }
  const int rank = std::atoi(argv[1]), size = std::atoi(argv[2]), trials = std::atoi(argv[4]);
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto device = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore store(argv[3]);
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
  context->connectFullMesh(store, device);
  std::stringstream list(argv[5]);
  std::string item;
  while (std::getline(list, item, ',')) {
    const unsigned long long bytes = std::stoull(item);
    std::vector<float> buf(bytes / 4, 1.0f);
    auto allreduce = [&] {
      gloo::AllreduceOptions opts(context);
      opts.setOutput(buf.data(), buf.size());
      opts.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
      opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
      gloo::allreduce(opts);
    };
    const int iters = iterations(bytes);
    for (int i = 0; i < std::min(iters, 20); ++i) allreduce();
    std::vector<double> t;
    for (int k = 0; k < trials; ++k) {
      gloo::BarrierOptions barrier(context);
      gloo::barrier(barrier);
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) {
        buf[0] = 1.0f;
        allreduce();
      }
      t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / iters);
    }
    std::sort(t.begin(), t.end());
    if (rank == 0) {
      std::printf("RESULT %llu %.3f\n", bytes, t[t.size() / 2]);
      std::fflush(stdout);
    }
  }
  return 0;
}
