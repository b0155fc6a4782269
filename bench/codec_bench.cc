// The gradient codecs' speed against memcpy measured in the same run
// (STYLE.md, Benchmarks): encode (with error feedback: the residual read
// and written) and decode of a gradient far larger than the caches, one
// thread (a codec call runs on one), as bytes of float gradient per second
// and the share of memcpy's rate copying those bytes. Issue 15's goal:
// >= 50% of memcpy for fp16 and int8.
//
//   troupe_codec_bench [--floats=16777216] [benchmark flags, e.g. --benchmark_repetitions=5]
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "bench/common/statistics.h"
#include "common/hash.h"
#include "kernels/codec.h"

namespace troupe::bench {
namespace {

using kernels::CodecKind;

struct Setup {
  int64_t floats = int64_t{1} << 24;  // 64 MiB
  std::vector<float> gradient, residual, decoded, copy;
  std::vector<std::byte> encoded;
};

Setup& setup() {
  static Setup s;
  return s;
}

void fill(Setup& s) {
  s.gradient.resize(size_t(s.floats));
  Rng rng(1);
  for (auto& x : s.gradient) x = float(rng.normal() * 1e-3);
  s.residual.assign(size_t(s.floats), 0.0f);
  s.decoded.assign(size_t(s.floats), 0.0f);
  s.copy.assign(size_t(s.floats), 0.0f);
}

// The ceiling: memcpy of the gradient's bytes.
void memcpyBench(benchmark::State& state) {
  Setup& s = setup();
  for (auto _ : state) {
    std::memcpy(s.copy.data(), s.gradient.data(), size_t(s.floats) * 4);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * s.floats * 4);
}

std::unique_ptr<kernels::Codec> codecOf(CodecKind kind) {
  kernels::CodecOptions o;
  o.kind = kind;
  o.fraction = 0.01;
  return kernels::makeCodec(o);
}

void encodeBench(benchmark::State& state, CodecKind kind) {
  Setup& s = setup();
  auto codec = codecOf(kind);
  uint64_t step = 0;
  for (auto _ : state) {
    troupe::Status st = codec->encode(s.gradient.data(), s.floats, s.residual.data(), step++, &s.encoded);
    if (!st.isOk()) state.SkipWithError(st.message().c_str());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * s.floats * 4);
  state.counters["ratio"] = double(s.floats * 4) / double(s.encoded.size());
}

void decodeBench(benchmark::State& state, CodecKind kind) {
  Setup& s = setup();
  auto codec = codecOf(kind);
  std::vector<std::byte> encoded;
  if (!codec->encode(s.gradient.data(), s.floats, nullptr, 0, &encoded).isOk()) state.SkipWithError("encode failed");
  for (auto _ : state) {
    troupe::Status st = codec->decode(encoded.data(), encoded.size(), s.floats, s.decoded.data(), false);
    if (!st.isOk()) state.SkipWithError(st.message().c_str());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * s.floats * 4);
}

void registerAll() {
  addStatistics(benchmark::RegisterBenchmark("memcpy", memcpyBench))->UseRealTime();
  for (auto kind : {CodecKind::kFp16, CodecKind::kBf16, CodecKind::kInt8, CodecKind::kOneBit, CodecKind::kTopK,
                    CodecKind::kRandomK}) {
    const std::string name = kernels::codecName(kind);
    addStatistics(benchmark::RegisterBenchmark(("encode/" + name).c_str(), encodeBench, kind))->UseRealTime();
    addStatistics(benchmark::RegisterBenchmark(("decode/" + name).c_str(), decodeBench, kind))->UseRealTime();
  }
}

}  // namespace
}  // namespace troupe::bench

int main(int argc, char** argv) {
  using namespace troupe::bench;
  Setup& s = setup();
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--floats=", 9) == 0) {
      s.floats = std::atoll(argv[i] + 9);
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  if (s.floats < 1) {
    std::fprintf(stderr, "troupe_codec_bench: --floats must be at least 1\n");
    return 2;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  fill(s);
  benchmark::AddCustomContext("floats", std::to_string(s.floats));
  registerAll();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
