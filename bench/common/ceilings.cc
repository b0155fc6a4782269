#include "bench/common/ceilings.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include <cblas.h>

#include "bench/common/huge_buffer.h"
#include "common/compute_pool.h"
#include "common/hash.h"

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

double measureRandomRowBandwidth(const void* table, size_t tableBytes, int threads, size_t rowBytes) {
  const int64_t rows = int64_t(tableBytes / rowBytes);
  const int64_t n = int64_t{1} << 21;
  std::vector<int64_t> index(n);
  Rng rng(42);
  for (auto& i : index) i = int64_t(rng.below(uint64_t(rows)));
  const char* base = static_cast<const char*>(table);
  const int64_t ahead = std::max<int64_t>(2, 64 / int64_t((rowBytes + 63) / 64));
  ComputePool pool(threads);
  std::vector<float> sink(threads * 16, 0.0f);
  auto gather = [&] {
    pool.parallelFor(n, 1 << 14, [&](int64_t b, int64_t e) {
      float acc[16] = {};
      for (int64_t i = b; i < e; ++i) {
        if (i + ahead < e) {
          const char* p = base + index[i + ahead] * rowBytes;
          for (size_t off = 0; off < rowBytes; off += 64) __builtin_prefetch(p + off);
        }
        const float* r = reinterpret_cast<const float*>(base + index[i] * rowBytes);
        for (size_t off = 0; off < rowBytes / sizeof(float); off += 16) {
          for (int k = 0; k < 16; ++k) acc[k] += r[off + k];
        }
      }
      sink[(b / (1 << 14)) % sink.size()] += acc[0] + acc[15];
    });
  };
  gather();  // warm-up
  double best = 0;
  for (int r = 0; r < 3; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    gather();
    best = std::max(best, double(n) * double(rowBytes) / seconds(t0));
  }
  return best;
}

Ceilings measureCeilings(int threads, const void* table, size_t tableBytes) {
  Ceilings c;
  c.memcpyBytesPerSecond = measureMemcpyBandwidth(threads);
  c.sgemmFlopsPerSecond = measureSgemmFlops(threads);
  if (table != nullptr) c.randomRowBytesPerSecond = measureRandomRowBandwidth(table, tableBytes, threads);
  return c;
}

}  // namespace troupe::bench
