#include "ps/embedding_table.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "common/hash.h"
#include "kernels/kernels.h"
#include "kernels/profiling_kernels.h"
#include "ps/table_set.h"

namespace troupe::ps {
namespace {

using kernels::OptimizerKind;

EmbeddingTableOptions options(OptimizerKind kind, int64_t dim = 8) {
  EmbeddingTableOptions o;
  o.tableId = 3;
  o.dim = dim;
  o.optimizer.kind = kind;
  o.optimizer.learningRate = 0.1f;
  o.seed = 11;
  o.initialCapacity = 4;  // forces several grows
  return o;
}

// A row of the Adagrad reference, in double: the initial weights of
// (seed 11, table, key) at the default scale 1/sqrt(dim), then the
// accumulators at 0.1 (the default initial accumulator).
std::vector<double> referenceRow(int tableId, uint64_t key, int64_t dim) {
  std::vector<float> w(static_cast<size_t>(dim));
  EmbeddingTable::initialWeights(11, tableId, key, float(1.0 / std::sqrt(double(dim))), w.data(), dim);
  std::vector<double> r(w.begin(), w.end());
  r.resize(size_t(2 * dim), 0.1);
  return r;
}

// Adagrad at learning rate 0.1 (options()) on element d of a reference row.
void adagradReference(std::vector<double>& r, int64_t dim, int64_t d, double g) {
  r[size_t(dim + d)] += g * g;
  r[size_t(d)] -= 0.1 * g / (std::sqrt(r[size_t(dim + d)]) + 1e-8);
}

TEST(EmbeddingTableTest, RowsAreCreatedOnceAndDeterministically) {
  EmbeddingTable a(options(OptimizerKind::kAdagrad)), b(options(OptimizerKind::kAdagrad));
  std::vector<float*> first;
  for (uint64_t k = 0; k < 5000; ++k) first.push_back(a.findOrCreate(mix64(k)));
  EXPECT_EQ(a.size(), 5000);
  // Same key, same block, across index growth; a second table agrees.
  for (uint64_t k = 0; k < 5000; ++k) {
    ASSERT_EQ(a.findOrCreate(mix64(k)), first[k]);
    ASSERT_EQ(a.find(mix64(k)), first[k]);
  }
  for (uint64_t k = 4999; k < 5000; --k) {
    const float* rb = b.findOrCreate(mix64(k));
    for (int i = 0; i < 8; ++i) ASSERT_EQ(rb[i], first[k][i]);
  }
  EXPECT_EQ(a.size(), 5000);
  EXPECT_EQ(a.find(mix64(123456)), nullptr);
  EXPECT_EQ(a.size(), 5000);  // find does not create
  // Weights within the init scale, Adagrad state initialised, keys differ.
  const float scale = 1.0f / std::sqrt(8.0f);
  for (int i = 0; i < 8; ++i) {
    EXPECT_LE(std::fabs(first[0][i]), scale);
    EXPECT_EQ(first[0][8 + i], 0.1f);  // default initial accumulator
  }
  EXPECT_NE(first[0][0], first[1][0]);
}

TEST(EmbeddingTableTest, OtherTableOrSeedGivesOtherRows) {
  auto o = options(OptimizerKind::kSgd);
  EmbeddingTable a(o);
  o.tableId = 4;
  EmbeddingTable b(o);
  o.tableId = 3;
  o.seed = 12;
  EmbeddingTable c(o);
  EXPECT_NE(a.findOrCreate(7)[0], b.findOrCreate(7)[0]);
  EXPECT_NE(a.findOrCreate(7)[0], c.findOrCreate(7)[0]);
}

TEST(EmbeddingTableTest, KeyZeroAndAllOnesAreOrdinaryKeys) {
  EmbeddingTable t(options(OptimizerKind::kSgd));
  float* z = t.findOrCreate(0);
  float* m = t.findOrCreate(~0ull);
  EXPECT_NE(z, m);
  EXPECT_EQ(t.find(0), z);
  EXPECT_EQ(t.find(~0ull), m);
  EXPECT_EQ(t.size(), 2);
}

TEST(EmbeddingTableTest, PullCopiesWeightsAndCreatesRows) {
  EmbeddingTable t(options(OptimizerKind::kAdam, 5));
  std::vector<uint64_t> keys{9, 4, 9, 100};
  std::vector<float> out(keys.size() * 5);
  t.pull(keys.data(), int64_t(keys.size()), out.data());
  EXPECT_EQ(t.size(), 3);
  for (size_t i = 0; i < keys.size(); ++i) {
    std::vector<float> expect(5);
    EmbeddingTable::initialWeights(11, 3, keys[i], 1.0f / std::sqrt(5.0f), expect.data(), 5);
    for (int d = 0; d < 5; ++d) EXPECT_EQ(out[i * 5 + d], expect[d]);
  }
}

// pull and peek look every key up first and copy the rows after: one call
// that creates thousands of rows (the index grows many times under it), with
// keys repeated near and far apart, copies each key's own row.
TEST(EmbeddingTableTest, ABatchThatGrowsTheTableCopiesEveryKeysOwnRow) {
  EmbeddingTable table(options(OptimizerKind::kAdagrad, 5));  // index of 16 slots at first
  // (Adagrad, dim 5: 10-float row blocks, 4096 to a chunk; 5000 rows take two.)
  EmbeddingTable reference(options(OptimizerKind::kAdagrad, 5));
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 7000; ++k) {
    keys.push_back(mix64(k % 5000));  // keys 5000-6999 repeat 0-1999, far apart
    if (k % 7 == 0) keys.push_back(mix64(k % 5000));  // and some right after themselves
  }
  std::vector<float> pulled(keys.size() * 5, -99.0f), peeked(keys.size() * 5, -99.0f);
  table.pull(keys.data(), int64_t(keys.size()), pulled.data());
  EXPECT_EQ(table.size(), 5000);
  // Keys never seen: peek gives their initial weights and creates nothing.
  std::vector<uint64_t> mixed = keys;
  for (uint64_t k = 0; k < 3000; ++k) mixed[k * 2] = mix64(1000000 + k);
  table.peek(mixed.data(), int64_t(mixed.size()), peeked.data());
  EXPECT_EQ(table.size(), 5000);
  for (size_t i = 0; i < keys.size(); ++i) {
    const float* want = reference.findOrCreate(keys[i]);  // a table built one key at a time
    for (int d = 0; d < 5; ++d) ASSERT_EQ(pulled[i * 5 + size_t(d)], want[d]) << "pull, key #" << i;
    std::vector<float> init(5);
    EmbeddingTable::initialWeights(11, 3, mixed[i], float(1.0 / std::sqrt(5.0)), init.data(), 5);
    const float* peekWant = i < 6000 && i % 2 == 0 ? init.data() : reference.findOrCreate(mixed[i]);
    for (int d = 0; d < 5; ++d) ASSERT_EQ(peeked[i * 5 + size_t(d)], peekWant[d]) << "peek, key #" << i;
  }
}

// Rows live in chunks (of up to 4096 rows, or of about 4 MiB on huge
// pages): every row of a table that spans several chunks is its own
// (written whole, none overlaps another), and an image of the table and a
// load of it give every key its row back, bit for bit; the same with the
// table's memory on huge pages from its first byte, whose row chunks then
// start on 2 MiB boundaries, and with a table that changes to huge-page
// chunks as it fills (6 MiB: after a few chunks of the first kind).
TEST(EmbeddingTableTest, RowsAcrossChunksAreTheirOwnAndSurviveAnImage) {
  // SGD rows of 2048 floats: 512 to a chunk (4 MiB) either way; Adagrad
  // rows of 16 + 16 floats: 4096 to a chunk, or 32768 on huge pages. Each
  // table is filled a few rows into a third chunk or later.
  for (size_t hugeFrom : {size_t{512} << 20, size_t{0}, size_t{6} << 20}) {
    for (auto [kind, dim, rows] : {std::tuple{OptimizerKind::kSgd, int64_t{2048}, int64_t{1700}},
                                   std::tuple{OptimizerKind::kAdagrad, int64_t{16}, int64_t{4096 + 2 * 32768 + 5}}}) {
      SCOPED_TRACE(testing::Message() << "dim " << dim << ", huge pages from " << hugeFrom << " bytes");
      auto o = options(kind, dim);
      o.hugePagesFromBytes = hugeFrom;
      EmbeddingTable table(o);
      const int64_t floats = table.rowFloats();
      std::vector<float*> at;
      for (int64_t r = 0; r < rows; ++r) {
        float* row = table.findOrCreate(mix64(uint64_t(r)));
        for (int64_t f = 0; f < floats; ++f) row[f] = float(r) + float(f) / float(floats);
        at.push_back(row);
      }
      EXPECT_GE(table.memoryBytes(), size_t(rows * floats) * sizeof(float));
      if (hugeFrom == 6 << 20) {
        // Both kinds of chunk: the first on ordinary pages, the last on huge ones.
        EXPECT_GT(table.hugePageBytes(), 0u);
        EXPECT_LT(table.hugePageBytes(), table.memoryBytes());
      } else {
        // Every byte of the table asked for huge pages, or none (these are small).
        EXPECT_EQ(table.hugePageBytes(), hugeFrom == 0 ? table.memoryBytes() : 0);
        const int64_t chunkRows = dim == 2048 ? 512 : hugeFrom == 0 ? 32768 : 4096;
        for (int64_t r : {int64_t{0}, chunkRows, 2 * chunkRows}) {  // the first rows of the first three chunks
          EXPECT_EQ(reinterpret_cast<uintptr_t>(at[size_t(r)]) % (hugeFrom == 0 ? kHugePageBytes : 64), 0u) << r;
        }
      }
      for (int64_t r = 0; r < rows; ++r) {
        ASSERT_EQ(table.find(mix64(uint64_t(r))), at[size_t(r)]) << r;
        for (int64_t f = 0; f < floats; ++f) {
          ASSERT_EQ(at[size_t(r)][f], float(r) + float(f) / float(floats)) << "row " << r << ", float " << f;
        }
      }
      const TableImage image = table.image();
      ASSERT_EQ(int64_t(image.keys.size()), rows);
      ASSERT_EQ(int64_t(image.rows.size()), rows * floats);
      EmbeddingTable loaded(o);
      ASSERT_TRUE(loaded.load(image).isOk());
      EXPECT_EQ(loaded.size(), rows);
      for (int64_t r = 0; r < rows; ++r) {
        const float* row = loaded.find(mix64(uint64_t(r)));
        ASSERT_NE(row, nullptr) << r;
        for (int64_t f = 0; f < floats; ++f) {
          ASSERT_EQ(row[f], float(r) + float(f) / float(floats)) << "loaded row " << r << ", float " << f;
        }
      }
    }
  }
}

// A table goes onto huge pages once it is hugePagesFromBytes large: memory
// it took before stays where it was; what takes it to that size or beyond
// (its next row chunks, a grown index) asks for huge pages.
TEST(EmbeddingTableTest, ATableAsksForHugePagesOnceItIsLarge) {
  auto o = options(OptimizerKind::kSgd, 2048);  // 8 KiB rows, 4 MiB chunks of 512
  o.initialCapacity = 4096;                     // an index of 8192 slots (128 KiB) that does not grow here
  o.hugePagesFromBytes = size_t{13} << 20;
  EmbeddingTable table(o);
  int64_t r = 0;
  for (; r < 3 * 512; ++r) table.findOrCreate(mix64(uint64_t(r)));  // three chunks: 12 MiB + the index
  EXPECT_EQ(table.memoryBytes(), (size_t{12} << 20) + 8192 * 16);
  EXPECT_EQ(table.hugePageBytes(), 0u);
  table.findOrCreate(mix64(uint64_t(r)));  // a fourth: 16 MiB and more with it
  EXPECT_EQ(table.hugePageBytes(), size_t{4} << 20);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(table.find(mix64(uint64_t(r)))) % kHugePageBytes, 0u);
  for (++r; r < 5800; ++r) table.findOrCreate(mix64(uint64_t(r)));  // the index grows (past 0.7 x 8192 keys)
  EXPECT_EQ(table.hugePageBytes(), table.memoryBytes() - (size_t{12} << 20));  // all but the first three chunks
}

TEST(EmbeddingTableTest, PushSumsRepeatedKeysAndAppliesTheOptimizerOnce) {
  auto k = kernels::createKernels({kernels::Device::kCpu, 2});
  EmbeddingTable t(options(OptimizerKind::kSgd, 3));
  std::vector<float> before(3);
  std::copy_n(t.findOrCreate(42), 3, before.begin());
  std::vector<uint64_t> keys{42, 7, 42};
  std::vector<float> grads{1, 2, 3, /*7*/ 0, 0, 0, /*42*/ 10, 20, 30};
  ASSERT_TRUE(t.push(keys.data(), grads.data(), 3, 1, *k).isOk());
  const float* row = t.find(42);
  for (int d = 0; d < 3; ++d) EXPECT_FLOAT_EQ(row[d], before[d] - 0.1f * (grads[d] + grads[6 + d]));
  ASSERT_NE(t.find(7), nullptr);  // pushed keys are created too
  EXPECT_EQ(t.size(), 2);
}

TEST(EmbeddingTableTest, ManyPushesMatchAReferenceMap) {
  auto k = kernels::createKernels({kernels::Device::kCpu, 2});
  EmbeddingTable t(options(OptimizerKind::kAdagrad, 4));
  std::map<uint64_t, std::vector<double>> ref;  // weights and accumulator, in double
  Rng rng(5);
  for (int step = 1; step <= 50; ++step) {
    std::vector<uint64_t> keys(64);
    std::vector<float> grads(64 * 4);
    for (auto& key : keys) key = rng.below(200);
    for (auto& g : grads) g = float(rng.normal());
    std::map<uint64_t, std::vector<double>> sum;
    for (size_t i = 0; i < keys.size(); ++i) {
      auto& s = sum[keys[i]];
      s.resize(4);
      for (int d = 0; d < 4; ++d) s[d] += grads[i * 4 + d];
      if (!ref.count(keys[i])) ref[keys[i]] = referenceRow(3, keys[i], 4);
    }
    for (auto& [key, g] : sum) {
      for (int d = 0; d < 4; ++d) adagradReference(ref[key], 4, d, g[size_t(d)]);
    }
    ASSERT_TRUE(t.push(keys.data(), grads.data(), 64, step, *k).isOk());
  }
  EXPECT_EQ(t.size(), int64_t(ref.size()));
  int seen = 0;
  t.forEach([&](uint64_t key, const float* row) {
    ++seen;
    for (int d = 0; d < 8; ++d) ASSERT_NEAR(row[d], ref.at(key)[d], 1e-4) << key << " " << d;
  });
  EXPECT_EQ(seen, t.size());
}

// A worker's push names each key of a table once (the keys it made unique
// for its pull); on its word (keysUnique) nothing is summed. The rows must be
// those of a reference map, and the very bits of a push that sums.
TEST(EmbeddingTableTest, APushOfUniqueKeysOnTheCallersWordUpdatesEveryRowAsASumWould) {
  std::shared_ptr<kernels::Kernels> k = kernels::createKernels({kernels::Device::kCpu, 2});
  for (const bool uniform : {true, false}) {
    SCOPED_TRACE(uniform ? "one optimizer call for all tables" : "a call per table");
    kernels::ProfilingKernels counted(k);  // the trusting pushes' kernels: no dedupGradients call
    std::vector<EmbeddingTableOptions> tables;
    for (int t = 0; t < 3; ++t) {
      auto o = options(OptimizerKind::kAdagrad, uniform || t != 1 ? 4 : 8);
      o.tableId = t;
      tables.push_back(o);
    }
    TableSet summing(tables), trusting(tables);
    std::vector<std::map<uint64_t, std::vector<double>>> ref(tables.size());
    Rng rng(uniform ? 21 : 22);
    for (int step = 1; step <= 30; ++step) {
      std::vector<uint64_t> counts, keys;
      std::vector<float> grads;
      for (size_t t = 0; t < tables.size(); ++t) {
        const int64_t dim = tables[t].dim;
        std::map<uint64_t, bool> seen;
        while (seen.size() < 40) seen[rng.below(300)] = true;  // 40 distinct keys of 300
        counts.push_back(seen.size());
        for (const auto& [key, unused] : seen) {
          keys.push_back(key);
          auto& r = ref[t][key];
          if (r.empty()) r = referenceRow(t, key, dim);
          for (int64_t d = 0; d < dim; ++d) {
            const float g = float(rng.normal());
            grads.push_back(g);
            adagradReference(r, dim, d, g);
          }
        }
      }
      ASSERT_TRUE(summing.push(counts.data(), keys.data(), grads.data(), step, *k).isOk());
      ASSERT_TRUE(trusting.push(counts.data(), keys.data(), grads.data(), step, counted, 1.0f, true).isOk());
    }
    std::map<std::string, int64_t> calls;
    for (const auto& e : counted.profile()) calls[e.kernel] = e.calls;
    EXPECT_EQ(calls["dedupGradients"], 0);
    EXPECT_EQ(calls["applyRowOptimizer"], uniform ? 30 : 90);  // one a push, or one a table
    for (size_t t = 0; t < tables.size(); ++t) {
      const int64_t dim = tables[t].dim;
      ASSERT_EQ(trusting.table(t).size(), int64_t(ref[t].size()));
      ASSERT_EQ(summing.table(t).size(), int64_t(ref[t].size()));
      int checked = 0;
      trusting.table(t).forEach([&](uint64_t key, const float* row) {
        const float* other = summing.table(t).find(key);
        ASSERT_NE(other, nullptr) << key;
        for (int64_t d = 0; d < 2 * dim; ++d) {
          ASSERT_NEAR(row[d], ref[t].at(key)[size_t(d)], 1e-4) << "table " << t << " key " << key << " " << d;
          ASSERT_EQ(std::memcmp(&row[d], &other[d], sizeof(float)), 0) << "table " << t << " key " << key << " " << d;
        }
        ++checked;
      });
      EXPECT_EQ(checked, int64_t(ref[t].size()));
    }
  }
}

// A worker pulls its keys, then pushes the same keys in the same order: the
// push updates the rows the pull found, with no lookup and no hand-off to
// the pool (forEachIndependent). A push of other keys, or of the same keys
// in another order, looks its rows up. Rows as a reference map says, in
// both cases.
TEST(EmbeddingTableTest, APushOfTheKeysJustPulledUpdatesThePulledRows) {
  std::shared_ptr<kernels::Kernels> k = kernels::createKernels({kernels::Device::kCpu, 2});
  kernels::ProfilingKernels counted(k);
  std::vector<EmbeddingTableOptions> tables;
  for (int t = 0; t < 3; ++t) {
    auto o = options(OptimizerKind::kAdagrad, 4);
    o.tableId = t;
    tables.push_back(o);
  }
  TableSet set(tables);
  std::vector<std::map<uint64_t, std::vector<double>>> ref(tables.size());
  Rng rng(31);
  for (int step = 1; step <= 20; ++step) {
    std::vector<uint64_t> counts, keys;
    for (size_t t = 0; t < tables.size(); ++t) {
      std::map<uint64_t, bool> seen;
      while (seen.size() < 30) seen[rng.below(100)] = true;
      counts.push_back(seen.size());
      for (const auto& [key, unused] : seen) keys.push_back(key);
    }
    std::vector<float> pulled(keys.size() * 4);
    set.pull(counts.data(), keys.data(), true, pulled.data(), true);
    if (step % 4 == 0) {
      // Between the pull and its push, rows of other keys: new row chunks
      // (4096 rows each) and a grown index, the pulled rows left where they are.
      std::vector<uint64_t> moreCounts(tables.size(), 5000), moreKeys;
      for (size_t t = 0; t < tables.size(); ++t) {
        for (uint64_t i = 0; i < 5000; ++i) moreKeys.push_back(1000000 * uint64_t(step) + i);
      }
      std::vector<float> zeros(moreKeys.size() * 4, 0.0f);  // (zero gradients: Adagrad moves nothing)
      ASSERT_TRUE(set.push(moreCounts.data(), moreKeys.data(), zeros.data(), step, *k).isOk());
      for (size_t t = 0; t < tables.size(); ++t) {
        for (uint64_t i = 0; i < 5000; ++i) {
          ref[t][1000000 * uint64_t(step) + i] = referenceRow(int(t), 1000000 * uint64_t(step) + i, 4);
        }
      }
    }
    // Every fifth step pushes table 1's keys in another order (not the pull's).
    bool other = step % 5 == 0;
    if (other) std::reverse(keys.begin() + 30, keys.begin() + 60);
    if (step % 7 == 0) {
      // A pull not remembered comes between (the same keys: no new rows):
      // the push looks its rows up.
      set.pull(counts.data(), keys.data(), true, pulled.data());
      other = true;
    } else if (step % 3 == 0) {
      // A pull that creates nothing (an evaluation's) keeps what was remembered.
      std::vector<uint64_t> unseen(keys.size(), 0);
      for (size_t i = 0; i < unseen.size(); ++i) unseen[i] = 5000000 + i;
      std::vector<float> out(unseen.size() * 4);
      set.pull(counts.data(), unseen.data(), false, out.data());
    }
    std::vector<float> grads;
    size_t at = 0;
    for (size_t t = 0; t < tables.size(); ++t) {
      for (size_t i = 0; i < 30; ++i, ++at) {
        auto& r = ref[t][keys[at]];
        if (r.empty()) r = referenceRow(int(t), keys[at], 4);
        for (int d = 0; d < 4; ++d) {
          const float g = float(rng.normal());
          grads.push_back(g);
          adagradReference(r, 4, d, g);
        }
      }
    }
    const int64_t before = counted.wall().sideBySideCalls;
    ASSERT_TRUE(set.push(counts.data(), keys.data(), grads.data(), step, counted, 1.0f, true).isOk());
    EXPECT_EQ(counted.wall().sideBySideCalls - before, other ? 1 : 0) << "step " << step;
  }
  for (size_t t = 0; t < tables.size(); ++t) {
    ASSERT_EQ(set.table(t).size(), int64_t(ref[t].size()));
    set.table(t).forEach([&](uint64_t key, const float* row) {
      for (int d = 0; d < 8; ++d) ASSERT_NEAR(row[d], ref[t].at(key)[size_t(d)], 1e-4) << t << " " << key << " " << d;
    });
  }
}

TEST(EmbeddingTableTest, APushOfANegativeCountIsRefused) {
  auto k = kernels::createKernels({kernels::Device::kCpu, 1});
  EmbeddingTable t(options(OptimizerKind::kSgd, 3));
  uint64_t key = 1;
  float grads[3] = {1, 2, 3};
  for (const bool unique : {false, true}) {
    Status s = t.push(&key, grads, -1, 1, *k, 1.0f, unique);
    EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << s.toString();
    EXPECT_EQ(t.size(), 0);
  }
}

TEST(EmbeddingTableTest, RejectsZeroDim) {
  EXPECT_THROW(EmbeddingTable(options(OptimizerKind::kSgd, 0)), std::exception);
}

}  // namespace
}  // namespace troupe::ps
