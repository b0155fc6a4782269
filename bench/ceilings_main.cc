// troupe_ceilings: prints this machine's ceilings as JSON for scripts that
// compare themselves with them (bench/compare_pytorch.sh):
//   {"threads": T, "memcpy_gbps": X, "sgemm_gflops": Y, "blas_core": "..."}
// (one key a line, by nlohmann::json).
// The sgemm is OpenBLAS's on the core troupe itself runs on: like troupe's
// main, it first makes sure OpenBLAS did not pick a narrower core than the
// CPU runs (kernels/cpu/blas_core.h), or the ceiling would be the fallback's.
//
//   troupe_ceilings [--threads=N]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include <nlohmann/json.hpp>

#include "bench/common/ceilings.h"
#include "kernels/cpu/blas_core.h"

int main(int argc, char** argv) {
  troupe::kernels::chooseBlasCore(argv);
  int threads = int(std::thread::hardware_concurrency());
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--threads=", 10) == 0) {
      threads = std::atoi(argv[i] + 10);
    } else {
      std::fprintf(stderr, "usage: troupe_ceilings [--threads=N]\n");
      return 2;
    }
  }
  if (threads < 1) threads = 1;
  const double memcpy = troupe::bench::measureMemcpyBandwidth(threads);
  const double sgemm = troupe::bench::measureSgemmFlops(threads, 2048, 6);
  // GB/s and GFLOP/s, to 3 decimals.
  auto milli = [](double v) { return std::round(v * 1000) / 1000; };
  const nlohmann::ordered_json json = {{"threads", threads},
                                       {"memcpy_gbps", milli(memcpy / 1e9)},
                                       {"sgemm_gflops", milli(sgemm / 1e9)},
                                       {"blas_core", troupe::kernels::blasCoreName()}};
  std::printf("%s\n", json.dump(2).c_str());
  return 0;
}
