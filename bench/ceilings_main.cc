// troupe_ceilings: prints this machine's ceilings as JSON for scripts that
// compare themselves with them (bench/compare_pytorch.sh):
//   {"threads": T, "memcpy_gbps": X, "sgemm_gflops": Y, "blas_core": "..."}
// The sgemm is OpenBLAS's on the core troupe itself runs on: like troupe's
// main, it first makes sure OpenBLAS did not pick a narrower core than the
// CPU runs (kernels/cpu/blas_core.h), or the ceiling would be the fallback's.
//
//   troupe_ceilings [--threads=N]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

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
  std::printf("{\"threads\": %d, \"memcpy_gbps\": %.3f, \"sgemm_gflops\": %.3f, \"blas_core\": \"%s\"}\n", threads,
              memcpy / 1e9, sgemm / 1e9, troupe::kernels::blasCoreName().c_str());
  return 0;
}
