// Kernel micro-benchmarks against the machine's ceilings (STYLE.md,
// Benchmarks). Measures memcpy bandwidth and sgemm FLOP/s first, then each
// kernel on tables far larger than the caches, and reports bytes/s (real bytes
// read + written) or FLOP/s with the ratio to the matching ceiling:
// pct_memcpy (streaming copy), pct_gather (random 64-byte rows of the same
// table: the latency-bound ceiling of any gather) or pct_sgemm.
//
//   troupe_kernels_bench [--threads=N] [--table_mib=1024] [--huge_from_mib=M] [benchmark flags]
//
// --huge_from_mib: TablePull's table asks for huge pages from M MiB on
// (EmbeddingTableOptions::hugePagesFromBytes; the table's default if not
// given; 0: from its first byte).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "bench/common/ceilings.h"
#include "bench/common/huge_buffer.h"
#include "bench/common/statistics.h"
#include "common/compute_pool.h"
#include "common/hash.h"
#include "kernels/cpu/blas_core.h"
#include "kernels/kernels.h"
#include "ps/embedding_table.h"

namespace troupe::bench {
namespace {

using kernels::BagIndices;
using kernels::EmbeddingBags;
using kernels::OptimizerConfig;
using kernels::OptimizerKind;

struct Setup {
  int threads = 0;
  size_t tableBytes = size_t{1} << 30;
  std::optional<size_t> hugeFromBytes;  // --huge_from_mib
  Ceilings ceilings;
  std::unique_ptr<kernels::Kernels> kernels;
  std::unique_ptr<HugeBuffer> table;
};

Setup& setup() {
  static Setup s;
  return s;
}

void fillTable(HugeBuffer& table, int threads) {
  ComputePool pool(threads);
  float* f = table.floats();
  pool.parallelFor(int64_t(table.bytes() / sizeof(float)), 1 << 20, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) f[i] = float(unitDouble(mix64(uint64_t(i)))) - 0.5f;
  });
}

// Each benchmark cycles through enough different batches that the rows it
// touches (kFootprint bytes) are far larger than the last-level cache;
// otherwise a 1 GiB table behaves like a cached one.
constexpr double kFootprint = double(size_t{512} << 20);

int batchesFor(double bytesPerBatch) {
  return int(std::clamp(kFootprint / std::max(bytesPerBatch, 1.0) + 1, 8.0, 1024.0));
}

void setRates(benchmark::State& state, double bytesPerIter, double flopsPerIter) {
  const double iters = double(state.iterations());
  const Ceilings& c = setup().ceilings;
  if (bytesPerIter > 0) {
    state.SetBytesProcessed(int64_t(bytesPerIter * iters));
    state.counters["pct_memcpy"] =
        benchmark::Counter(100.0 * bytesPerIter * iters / c.memcpyBytesPerSecond, benchmark::Counter::kIsRate);
    if (c.randomRowBytesPerSecond > 0) {
      state.counters["pct_gather"] = benchmark::Counter(
          100.0 * bytesPerIter * iters / c.randomRowBytesPerSecond, benchmark::Counter::kIsRate);
    }
  }
  if (flopsPerIter > 0) {
    state.counters["FLOPS"] = benchmark::Counter(flopsPerIter * iters, benchmark::Counter::kIsRate);
    state.counters["pct_sgemm"] =
        benchmark::Counter(100.0 * flopsPerIter * iters / c.sgemmFlopsPerSecond, benchmark::Counter::kIsRate);
  }
}

// Random bags of 20..40 indices into all rows of the table.
struct BagBatch {
  std::vector<int64_t> indices, offsets;
};

BagBatch randomBags(int64_t batch, int64_t numRows, uint64_t seed) {
  Rng rng(seed);
  BagBatch b;
  b.offsets.push_back(0);
  for (int64_t i = 0; i < batch; ++i) {
    const int64_t len = 20 + int64_t(rng.below(21));
    for (int64_t k = 0; k < len; ++k) b.indices.push_back(int64_t(rng.below(numRows)));
    b.offsets.push_back(int64_t(b.indices.size()));
  }
  return b;
}

EmbeddingBags bagsOf(const BagBatch& b) {
  EmbeddingBags bags;
  bags.indices = BagIndices::of(b.indices.data(), int64_t(b.indices.size()));
  bags.offsets = b.offsets.data();
  bags.batch = int64_t(b.offsets.size()) - 1;
  return bags;
}

// Args: dim, batch.
void embeddingBagForward(benchmark::State& state) {
  const int64_t dim = state.range(0), batch = state.range(1);
  const int64_t numRows = int64_t(setup().tableBytes / (dim * sizeof(float)));
  uint64_t seed = 1;
  std::vector<BagBatch> batches;
  const int count = batchesFor(30.0 * double(batch * dim * 4));
  for (int i = 0; i < count; ++i) batches.push_back(randomBags(batch, numRows, seed++));
  std::vector<float> out(batch * dim);
  const float* rows = setup().table->floats();
  size_t next = 0;
  double bytes = 0;
  for (auto _ : state) {
    const BagBatch& b = batches[next++ % batches.size()];
    if (!setup().kernels->embeddingBagForward(rows, numRows, dim, bagsOf(b), out.data()).isOk()) {
      state.SkipWithError("embeddingBagForward failed");
      break;
    }
    benchmark::DoNotOptimize(out.data());
    const double nnz = double(b.indices.size());
    bytes += nnz * (dim * 4 + 8) + double(batch + 1) * 8 + double(batch * dim) * 4;
  }
  setRates(state, bytes / double(std::max<int64_t>(state.iterations(), 1)), 0);
}

void embeddingBagBackward(benchmark::State& state) {
  const int64_t dim = state.range(0), batch = state.range(1);
  const int64_t numRows = int64_t(setup().tableBytes / (dim * sizeof(float)));
  uint64_t seed = 100;
  std::vector<BagBatch> batches;
  const int count = batchesFor(30.0 * double(batch * dim * 4));
  for (int i = 0; i < count; ++i) batches.push_back(randomBags(batch, numRows, seed++));
  std::vector<float> gradOut(batch * dim, 1e-6f);
  float* gradRows = setup().table->floats();
  size_t next = 0;
  double bytes = 0;
  for (auto _ : state) {
    const BagBatch& b = batches[next++ % batches.size()];
    if (!setup().kernels->embeddingBagBackward(gradOut.data(), dim, bagsOf(b), gradRows, numRows).isOk()) {
      state.SkipWithError("embeddingBagBackward failed");
      break;
    }
    const double nnz = double(b.indices.size());
    bytes += nnz * (2.0 * dim * 4 + 8) + double(batch + 1) * 8 + double(batch * dim) * 4;
  }
  setRates(state, bytes / double(std::max<int64_t>(state.iterations(), 1)), 0);
}

// Args: optimizer kind, dim, rows per update.
void rowOptimizer(benchmark::State& state) {
  const auto kind = OptimizerKind(state.range(0));
  const int64_t dim = state.range(1), n = state.range(2);
  const int64_t block = kernels::optimizerRowFloats(kind, dim);
  const int64_t numBlocks = int64_t(setup().tableBytes / (block * sizeof(float)));
  Rng rng(uint64_t(kind) + 7);
  std::vector<std::vector<float*>> updates(batchesFor(double(n * block * 4)));
  for (auto& rows : updates) {
    std::vector<int64_t> picks;
    while (int64_t(picks.size()) < n) {
      for (int64_t i = int64_t(picks.size()); i < n; ++i) picks.push_back(int64_t(rng.below(numBlocks)));
      std::sort(picks.begin(), picks.end());
      picks.erase(std::unique(picks.begin(), picks.end()), picks.end());
    }
    for (int64_t i = n - 1; i > 0; --i) std::swap(picks[i], picks[rng.below(i + 1)]);
    for (int64_t p : picks) rows.push_back(setup().table->floats() + p * block);
  }
  std::vector<float> grads(n * dim, 1e-4f);
  OptimizerConfig config;
  config.kind = kind;
  config.learningRate = 1e-3f;
  size_t next = 0;
  for (auto _ : state) {
    ++config.step;
    const auto& rows = updates[next++ % updates.size()];
    if (!setup().kernels->applyRowOptimizer(config, rows.data(), n, dim, grads.data()).isOk()) {
      state.SkipWithError("applyRowOptimizer failed");
      break;
    }
  }
  setRates(state, double(n) * (2.0 * block * 4 + dim * 4 + 8), 0);
}

// Args: n keys, distinct keys, dim.
void dedupGradients(benchmark::State& state) {
  const int64_t n = state.range(0), distinct = state.range(1), dim = state.range(2);
  Rng rng(11);
  std::vector<uint64_t> keys(n), unique(n);
  for (auto& k : keys) k = mix64(rng.below(distinct));
  std::vector<float> grads(n * dim, 0.5f), summed(n * dim);
  std::vector<int64_t> inverse(n);
  int64_t count = 0;
  for (auto _ : state) {
    Expected<int64_t> got = setup().kernels->dedupGradients(keys.data(), grads.data(), n, dim,
                                                             unique.data(), summed.data(), inverse.data());
    if (!got.hasValue()) {
      state.SkipWithError("dedupGradients failed");
      break;
    }
    count = *got;
  }
  setRates(state, double(n) * (8 + dim * 4 + 8) + double(count) * (8 + dim * 4), 0);
  state.counters["unique"] = double(count);
}

// Args: batch, in, out, backward (0/1).
void denseLayer(benchmark::State& state) {
  const int64_t batch = state.range(0), in = state.range(1), out = state.range(2);
  const bool backward = state.range(3) != 0;
  std::vector<float> x(batch * in, 0.1f), w(out * in, 0.01f), b(out, 0.0f), y(batch * out);
  std::vector<float> dx(batch * in), dw(out * in), db(out);
  for (auto _ : state) {
    Status s = backward ? setup().kernels->denseBackward(x.data(), w.data(), y.data(), batch, in, out,
                                                         dx.data(), dw.data(), db.data(), false)
                        : setup().kernels->denseForward(x.data(), w.data(), b.data(), batch, in, out,
                                                        y.data());
    if (!s.isOk()) {
      state.SkipWithError("dense layer failed");
      break;
    }
    benchmark::ClobberMemory();
  }
  setRates(state, 0, (backward ? 4.0 : 2.0) * double(batch) * double(in) * double(out));
}

// Args: inputs, dim, batch, backward (0/1). DLRM's dot interaction: the
// pairwise dots of `inputs` vectors of `dim` per sample, or their gradient.
void dotInteraction(benchmark::State& state) {
  const int64_t f = state.range(0), dim = state.range(1), batch = state.range(2);
  const bool backward = state.range(3) != 0;
  const int64_t pairs = f * (f - 1) / 2;
  Rng rng(5);
  std::vector<std::vector<float>> z(size_t(f), std::vector<float>(size_t(batch * dim)));
  std::vector<std::vector<float>> dz(size_t(f), std::vector<float>(size_t(batch * dim)));
  std::vector<const float*> zp;
  std::vector<float*> dzp;
  for (auto& v : z) {
    for (auto& x : v) x = float(rng.below(2001)) / 1000.0f - 1.0f;
    zp.push_back(v.data());
  }
  for (auto& v : dz) dzp.push_back(v.data());
  std::vector<float> out(size_t(batch * pairs), 0.01f);
  for (auto _ : state) {
    Status s = backward ? setup().kernels->dotInteractionBackward(zp.data(), f, batch, dim, out.data(), pairs,
                                                                  dzp.data())
                        : setup().kernels->dotInteractionForward(zp.data(), f, batch, dim, out.data(), pairs);
    if (!s.isOk()) {
      state.SkipWithError("dot interaction failed");
      break;
    }
    benchmark::ClobberMemory();
  }
  // A multiply-add is 2 flops: forward one per pair and dim, backward two.
  setRates(state, 0, (backward ? 4.0 : 2.0) * double(batch) * double(pairs) * double(dim));
}

// Args: dim, keys. A shard's embedding table (Adagrad: weights and
// accumulators, --table_mib of rows) and pulls of `keys` keys drawn
// uniformly from those it holds (EmbeddingTable::pull: the hash lookups
// and the row copies of a shard serving a pull), against the random-row
// ceiling. Bytes: the weights read and written, the keys read.
void tablePull(benchmark::State& state) {
  const int64_t dim = state.range(0), keys = state.range(1);
  static std::unique_ptr<ps::EmbeddingTable> table;  // (one at a time: each fills --table_mib)
  const int64_t numRows = int64_t(setup().tableBytes / (2 * dim * sizeof(float)));
  if (!table || table->dim() != dim) {
    table.reset();
    ps::EmbeddingTableOptions o;
    o.tableId = 0;
    o.dim = dim;
    o.optimizer.kind = OptimizerKind::kAdagrad;
    o.initialCapacity = numRows;
    if (setup().hugeFromBytes) o.hugePagesFromBytes = *setup().hugeFromBytes;
    table = std::make_unique<ps::EmbeddingTable>(o);
    for (int64_t r = 0; r < numRows; ++r) table->findOrCreate(mix64(uint64_t(r)));
  }
  std::vector<std::vector<uint64_t>> batches(size_t(batchesFor(double(keys * dim * 4))));
  uint64_t seed = 1;
  for (auto& b : batches) {
    Rng rng(seed++);
    for (int64_t i = 0; i < keys; ++i) b.push_back(mix64(rng.next() % uint64_t(numRows)));
  }
  std::vector<float> out(size_t(keys * dim));
  size_t next = 0;
  for (auto _ : state) {
    table->pull(batches[next++ % batches.size()].data(), keys, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  setRates(state, double(keys) * double(dim * 4 * 2 + 8), 0);
}

void registerAll() {
  auto reg = [](const char* name, void (*fn)(benchmark::State&)) {
    return addStatistics(benchmark::RegisterBenchmark(name, fn))
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond)
        ->Repetitions(5)
        ->ReportAggregatesOnly(true)
        ->MinTime(0.2);
  };
  reg("EmbeddingBagForward", embeddingBagForward)->ArgNames({"dim", "batch"})
      ->Args({16, 2048})->Args({64, 2048});
  reg("EmbeddingBagBackward", embeddingBagBackward)->ArgNames({"dim", "batch"})
      ->Args({16, 2048})->Args({64, 2048});
  auto* opt = reg("RowOptimizer", rowOptimizer)->ArgNames({"kind", "dim", "rows"});
  for (int kind = 0; kind < 4; ++kind) {
    opt->Args({kind, 16, 65536})->Args({kind, 64, 65536});
  }
  reg("DedupGradients", dedupGradients)->ArgNames({"n", "distinct", "dim"})
      ->Args({1 << 20, 1 << 18, 16})->Args({1 << 16, 1 << 14, 64});
  auto* dot = reg("DotInteraction", dotInteraction)->ArgNames({"inputs", "dim", "batch", "bwd"});
  for (auto [f, dim] : {std::pair<int64_t, int64_t>{27, 16}, {27, 64}, {64, 16}}) {
    dot->Args({f, dim, 256, 0})->Args({f, dim, 256, 1});
  }
  reg("TablePull", tablePull)->ArgNames({"dim", "keys"})->Args({16, 6656})->Args({16, 100000})->Args({64, 100000});
  auto* dense = reg("DenseLayer", denseLayer)->ArgNames({"batch", "in", "out", "bwd"});
  for (int64_t batch : {128, 1024}) {
    for (auto [in, out] : {std::pair<int64_t, int64_t>{784, 256}, {512, 256}}) {
      dense->Args({batch, in, out, 0})->Args({batch, in, out, 1});
    }
  }
  // The DLRM's top layers at its batch (783 = 16 + 351 + 416 inputs).
  for (auto [in, out] : {std::pair<int64_t, int64_t>{783, 128}, {128, 64}}) {
    dense->Args({256, in, out, 0})->Args({256, in, out, 1});
  }
}

// Takes --threads=N, --table_mib=M and --huge_from_mib=H out of argv.
void parseOwnFlags(int& argc, char** argv, Setup& s) {
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--threads=", 10) == 0) {
      s.threads = std::atoi(argv[i] + 10);
    } else if (std::strncmp(argv[i], "--table_mib=", 12) == 0) {
      s.tableBytes = size_t(std::atoll(argv[i] + 12)) << 20;
    } else if (std::strncmp(argv[i], "--huge_from_mib=", 16) == 0) {
      s.hugeFromBytes = size_t(std::atoll(argv[i] + 16)) << 20;
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
}

}  // namespace
}  // namespace troupe::bench

int main(int argc, char** argv) {
  troupe::kernels::chooseBlasCore(argv);  // the core troupe itself runs on (kernels/cpu/blas_core.h)
  using namespace troupe::bench;
  Setup& s = setup();
  parseOwnFlags(argc, argv, s);
  if (s.threads <= 0) s.threads = troupe::ComputePool::hardwareThreads();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

  s.table = std::make_unique<HugeBuffer>(s.tableBytes);
  fillTable(*s.table, s.threads);
  s.ceilings = measureCeilings(s.threads, s.table->data(), s.table->bytes());
  std::fprintf(stderr,
               "ceilings (%d threads): memcpy %.2f GB/s (read + write), random 64 B rows of %zu MiB "
               "%.2f GB/s, sgemm 2048^3 %.1f GFLOP/s\n",
               s.threads, s.ceilings.memcpyBytesPerSecond / 1e9, s.tableBytes >> 20,
               s.ceilings.randomRowBytesPerSecond / 1e9, s.ceilings.sgemmFlopsPerSecond / 1e9);
  benchmark::AddCustomContext("random_row_GBps", std::to_string(s.ceilings.randomRowBytesPerSecond / 1e9));
  benchmark::AddCustomContext("threads", std::to_string(s.threads));
  benchmark::AddCustomContext("memcpy_GBps", std::to_string(s.ceilings.memcpyBytesPerSecond / 1e9));
  benchmark::AddCustomContext("sgemm_GFLOPs", std::to_string(s.ceilings.sgemmFlopsPerSecond / 1e9));
  benchmark::AddCustomContext("table_MiB", std::to_string(s.tableBytes >> 20));

  troupe::kernels::KernelOptions options;
  options.threads = s.threads;
  s.kernels = troupe::kernels::createKernels(options);

  registerAll();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
