#include "bench/common/ceilings.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include <cblas.h>

#include "bench/common/huge_buffer.h"
#include "common/compute_pool.h"

namespace troupe::bench {
namespace {

double seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

double measureMemcpyBandwidth(int threads, size_t bytes, int repeats) {
  HugeBuffer src(bytes), dst(bytes);
  std::memset(src.data(), 1, bytes);
  ComputePool pool(threads);
  const int64_t chunks = threads;
  const size_t chunk = (bytes / chunks + 63) / 64 * 64;
  auto copy = [&] {
    pool.parallelFor(chunks, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        const size_t begin = std::min(bytes, size_t(c) * chunk);
        const size_t end = std::min(bytes, begin + chunk);
        std::memcpy(static_cast<char*>(dst.data()) + begin, static_cast<char*>(src.data()) + begin, end - begin);
      }
    });
  };
  copy();  // warm-up
  double best = 0;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    copy();
    best = std::max(best, 2.0 * double(bytes) / seconds(t0));
  }
  return best;
}

double measureSgemmFlops(int threads, int n, int repeats) {
  openblas_set_num_threads(threads);
  std::vector<float> a(size_t(n) * n), b(size_t(n) * n), c(size_t(n) * n);
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = float(i % 97) * 0.01f;
    b[i] = float(i % 89) * 0.01f;
  }
  auto gemm = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n,
                0.0f, c.data(), n);
  };
  gemm();  // warm-up
  double best = 0;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    gemm();
    best = std::max(best, 2.0 * double(n) * n * n / seconds(t0));
  }
  return best;
}

Ceilings measureCeilings(int threads) {
  return {measureMemcpyBandwidth(threads), measureSgemmFlops(threads)};
}

}  // namespace troupe::bench
