// The CUDA codecs (kernels/cuda/cuda_codec.h) against the copies they stand
// in for, measured in the same run on the same GPU: a gradient on the GPU
// leaves it either whole (a device-to-host copy of its floats, then the CPU
// codec if it is compressed on the host) or encoded on the GPU (the kernels
// and a copy of the encoded bytes only). Decode likewise against the
// host-to-device copy of the floats. Also the device-to-device copy, the
// GPU memory's own ceiling. Host buffers are pageable (std::vector), as the
// transport's are.
//
//   troupe_cuda_codec_bench [--floats=16777216] [--reps=20]
//
// Prints a Markdown table: the median of --reps runs (after 3 warm-up runs)
// as GB/s of float gradient.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "common/hash.h"
#include "kernels/codec.h"

namespace {

using troupe::kernels::CodecKind;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "troupe_cuda_codec_bench: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

void check(const troupe::Status& s, const char* what) {
  if (!s.isOk()) {
    std::fprintf(stderr, "troupe_cuda_codec_bench: %s: %s\n", what, s.message().c_str());
    std::exit(1);
  }
}

// The median seconds of `reps` runs of f, after three unmeasured ones.
double median(int reps, const std::function<void()>& f) {
  for (int i = 0; i < 3; ++i) f();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto a = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int64_t n = int64_t{1} << 24;
  int reps = 20;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--floats=", 9) == 0) {
      n = std::atoll(argv[i] + 9);
    } else if (std::strncmp(argv[i], "--reps=", 7) == 0) {
      reps = std::atoi(argv[i] + 7);
    } else {
      std::fprintf(stderr, "usage: troupe_cuda_codec_bench [--floats=N] [--reps=R]\n");
      return 2;
    }
  }
  if (n < 1 || n > (int64_t{1} << 31) - 1 || reps < 1) {
    std::fprintf(stderr, "troupe_cuda_codec_bench: --floats must be 1 to 2^31 - 1 and --reps at least 1\n");
    return 2;
  }
  const size_t bytes = size_t(n) * 4;
  std::vector<float> host(static_cast<size_t>(n)), back(static_cast<size_t>(n));
  troupe::Rng rng(1);
  for (auto& x : host) x = float(rng.normal() * 1e-3);
  float *grad = nullptr, *residual = nullptr, *out = nullptr, *copy = nullptr;
  check(cudaMalloc(reinterpret_cast<void**>(&grad), bytes), "cudaMalloc");
  check(cudaMalloc(reinterpret_cast<void**>(&residual), bytes), "cudaMalloc");
  check(cudaMalloc(reinterpret_cast<void**>(&out), bytes), "cudaMalloc");
  check(cudaMalloc(reinterpret_cast<void**>(&copy), bytes), "cudaMalloc");
  check(cudaMemcpy(grad, host.data(), bytes, cudaMemcpyHostToDevice), "copy");
  check(cudaMemset(residual, 0, bytes), "memset");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");

  const double gb = double(bytes) / 1e9;
  const double d2d = median(reps, [&] {
    check(cudaMemcpy(copy, grad, bytes, cudaMemcpyDeviceToDevice), "d2d");
    check(cudaDeviceSynchronize(), "sync");
  });
  const double d2h = median(reps, [&] { check(cudaMemcpy(back.data(), grad, bytes, cudaMemcpyDeviceToHost), "d2h"); });
  const double h2d = median(reps, [&] { check(cudaMemcpy(out, host.data(), bytes, cudaMemcpyHostToDevice), "h2d"); });
  std::printf("GPU %s, %lld floats (%.0f MiB), median of %d\n\n", prop.name, (long long)n, double(bytes) / 1048576.0,
              reps);
  std::printf("| copy | GB/s |\n| --- | ---: |\n");
  std::printf("| device to device | %.1f |\n| device to host | %.1f |\n| host to device | %.1f |\n\n", gb / d2d,
              gb / d2h, gb / h2d);
  std::printf(
      "| codec | bytes / encoded | GPU encode GB/s | / d2h copy | d2h + CPU encode GB/s | GPU decode GB/s | / h2d copy "
      "| CPU decode + h2d GB/s |\n");
  std::printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (CodecKind kind : {CodecKind::kFp16, CodecKind::kBf16, CodecKind::kInt8, CodecKind::kOneBit, CodecKind::kTopK,
                         CodecKind::kRandomK}) {
    troupe::kernels::CodecOptions o;
    o.kind = kind;
    auto gpu = troupe::kernels::makeCodec(o, troupe::kernels::Device::kCuda);
    auto cpu = troupe::kernels::makeCodec(o, troupe::kernels::Device::kCpu);
    std::vector<std::byte> encoded;
    std::vector<float> hostResidual(static_cast<size_t>(n), 0.0f);
    uint64_t step = 0;
    const double enc = median(reps, [&] { check(gpu->encode(grad, n, residual, step++, &encoded), "encode"); });
    const double cpuEnc = median(reps, [&] {
      check(cudaMemcpy(back.data(), grad, bytes, cudaMemcpyDeviceToHost), "d2h");
      check(cpu->encode(back.data(), n, hostResidual.data(), step++, &encoded), "cpu encode");
    });
    const double ratio = double(bytes) / double(encoded.size());
    const double dec = median(reps, [&] { check(gpu->decode(encoded.data(), encoded.size(), n, out, false), "decode"); });
    const double cpuDec = median(reps, [&] {
      check(cpu->decode(encoded.data(), encoded.size(), n, back.data(), false), "cpu decode");
      check(cudaMemcpy(out, back.data(), bytes, cudaMemcpyHostToDevice), "h2d");
    });
    std::printf("| %s | %.1f | %.1f | %.2f | %.1f | %.1f | %.2f | %.1f |\n", troupe::kernels::codecName(kind), ratio,
                gb / enc, d2h / enc, gb / cpuEnc, gb / dec, h2d / dec, gb / cpuDec);
  }
  cudaFree(grad);
  cudaFree(residual);
  cudaFree(out);
  cudaFree(copy);
  return 0;
}
