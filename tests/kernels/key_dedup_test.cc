// uniqueKeys and dedupGradients against a first-seen-order reference, with
// heavy duplicates, extreme key values and thread-count independence.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <map>
#include <thread>
#include <tuple>

#include "kernels/profiling_kernels.h"
#include "tests/kernels/kernel_test_util.h"

namespace troupe::kernels::test {
namespace {

struct Reference {
  std::vector<uint64_t> unique;
  std::vector<int64_t> inverse;
};

Reference referenceUnique(const std::vector<uint64_t>& keys) {
  Reference r;
  std::map<uint64_t, int64_t> ids;
  for (uint64_t k : keys) {
    auto [it, inserted] = ids.try_emplace(k, int64_t(r.unique.size()));
    if (inserted) r.unique.push_back(k);
    r.inverse.push_back(it->second);
  }
  return r;
}

// keyRange 0: any 64-bit key; otherwise keys in [0, keyRange) plus a few extremes.
std::vector<uint64_t> randomKeys(Rng& rng, int64_t n, uint64_t keyRange) {
  std::vector<uint64_t> keys(n);
  for (auto& k : keys) k = keyRange == 0 ? rng.next() : rng.below(keyRange);
  if (n > 3) {
    keys[n / 3] = ~uint64_t{0};
    keys[n / 2] = 0;
    keys[n - 1] = ~uint64_t{0};
  }
  return keys;
}

using Case = std::tuple<int64_t, uint64_t, int64_t>;  // n, key range, dim

class KeyDedupTest : public ::testing::TestWithParam<Case> {};

TEST_P(KeyDedupTest, MatchesReference) {
  const auto [n, keyRange, dim] = GetParam();
  Rng rng(n * 31 + keyRange + dim);
  const std::vector<uint64_t> keys = randomKeys(rng, n, keyRange);
  const std::vector<float> grads = randomFloats(rng, n * dim);
  const Reference ref = referenceUnique(keys);
  const int64_t count = int64_t(ref.unique.size());
  std::vector<double> summedRef(count * dim, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t d = 0; d < dim; ++d) summedRef[ref.inverse[i] * dim + d] += grads[i * dim + d];
  }

  std::vector<float> first;
  for (int threads : {1, 2}) {
    auto k = makeKernels(threads);
    std::vector<uint64_t> unique(n, 12345);
    std::vector<int64_t> inverse(n, -7);
    Expected<int64_t> got = k->uniqueKeys(keys.data(), n, unique.data(), inverse.data());
    ASSERT_TRUE(got.hasValue());
    ASSERT_EQ(*got, count);
    unique.resize(count);
    EXPECT_EQ(unique, ref.unique);
    EXPECT_EQ(inverse, ref.inverse);

    std::vector<float> summed(n * dim, 99.0f);
    std::fill(inverse.begin(), inverse.end(), -7);
    got = k->dedupGradients(keys.data(), grads.data(), n, dim, unique.data(), summed.data(),
                            inverse.data());
    ASSERT_TRUE(got.hasValue());
    ASSERT_EQ(*got, count);
    EXPECT_EQ(inverse, ref.inverse);
    summed.resize(count * dim);
    expectClose(summed, summedRef, 1e-5, 1e-5, "summed");
    if (threads == 1) {
      first = summed;
    } else {
      EXPECT_TRUE(bitEqual(first, summed)) << "dedup differs between 1 and 2 threads";
    }
    // A second call on the same object (reused table) gives the same answer.
    std::vector<int64_t> again(n);
    ASSERT_EQ(*k->uniqueKeys(keys.data(), n, unique.data(), again.data()), count);
    EXPECT_EQ(again, ref.inverse);
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, KeyDedupTest,
                         ::testing::Values(Case{0, 0, 4}, Case{1, 0, 1}, Case{2, 1, 3},
                                           Case{17, 0, 0}, Case{1000, 7, 17}, Case{5000, 0, 16},
                                           Case{100000, 5000, 8}, Case{100000, 0, 1}));

TEST(KeyDedup, RejectsNegativeSizes) {
  auto k = makeKernels(1);
  uint64_t key = 1, unique = 0;
  int64_t inverse = 0;
  EXPECT_EQ(k->uniqueKeys(&key, -1, &unique, &inverse).status().code(), Status::Code::kInvalidArgument);
}

// A model's tables deduplicated side by side (forEachIndependent, as the
// worker's step and the table holder's push do): every table's answer is its
// reference, every piece runs exactly once, and all the while another
// thread calls the same object (the kernels' calls no longer take one lock:
// a pool call waiting for the pool while the pieces' own calls run inline
// must not deadlock).
TEST(KeyDedup, TablesSideBySideMatchTheirReferencesBesideAnotherThreadsCalls) {
  constexpr int kTables = 26;
  constexpr int64_t kRows = 512, kDim = 4;
  Rng rng(2611);
  std::vector<std::vector<uint64_t>> keys(kTables);
  std::vector<std::vector<float>> grads(kTables);
  std::vector<Reference> refs(kTables);
  for (int t = 0; t < kTables; ++t) {
    keys[size_t(t)] = randomKeys(rng, kRows, uint64_t(10 + 40 * t));  // from heavy duplicates to few
    grads[size_t(t)] = randomFloats(rng, kRows * kDim);
    refs[size_t(t)] = referenceUnique(keys[size_t(t)]);
  }
  // The other thread: a dense forward and a dedup big enough to split over
  // the pool (so they wait for it while the pieces hold it), each checked
  // against its reference and bit for bit against the same call made alone.
  constexpr int64_t kB = 256, kIn = 256, kOut = 256, kOtherKeys = 4096;
  const std::vector<float> x = randomFloats(rng, kB * kIn), w = randomFloats(rng, kOut * kIn);
  std::vector<double> yRef(size_t(kB * kOut), 0.0);
  for (int64_t b = 0; b < kB; ++b) {
    for (int64_t o = 0; o < kOut; ++o) {
      for (int64_t i = 0; i < kIn; ++i) yRef[size_t(b * kOut + o)] += double(x[size_t(b * kIn + i)]) * w[size_t(o * kIn + i)];
    }
  }
  const std::vector<uint64_t> otherKeys = randomKeys(rng, kOtherKeys, 1000);
  const std::vector<float> otherGrads = randomFloats(rng, kOtherKeys * kDim);
  const Reference otherRef = referenceUnique(otherKeys);
  ASSERT_GE(otherRef.unique.size(), 256u) << "too few unique keys to use the pool";
  for (int threads : {2, 4}) {
    auto k = makeKernels(threads);
    std::atomic<bool> stop{false};
    std::atomic<int64_t> otherRounds{0}, otherFailures{0};
    std::vector<float> yAlone(size_t(kB * kOut)), summedAlone(size_t(kOtherKeys * kDim));
    std::vector<uint64_t> uniqueAlone(kOtherKeys);
    std::vector<int64_t> inverseAlone(kOtherKeys);
    ASSERT_TRUE(k->denseForward(x.data(), w.data(), nullptr, kB, kIn, kOut, yAlone.data()).isOk());
    expectClose(yAlone, yRef, 1e-4, 1e-4, "y");
    ASSERT_EQ(*k->dedupGradients(otherKeys.data(), otherGrads.data(), kOtherKeys, kDim, uniqueAlone.data(),
                                 summedAlone.data(), inverseAlone.data()),
              int64_t(otherRef.unique.size()));
    ASSERT_EQ(inverseAlone, otherRef.inverse);
    std::thread other([&] {
      std::vector<float> y(size_t(kB * kOut)), summed(size_t(kOtherKeys * kDim));
      std::vector<uint64_t> unique(kOtherKeys);
      std::vector<int64_t> inverse(kOtherKeys);
      do {  // at least one round, however the threads are scheduled
        if (!k->denseForward(x.data(), w.data(), nullptr, kB, kIn, kOut, y.data()).isOk() || !bitEqual(y, yAlone)) {
          ++otherFailures;
        }
        auto n = k->dedupGradients(otherKeys.data(), otherGrads.data(), kOtherKeys, kDim, unique.data(),
                                   summed.data(), inverse.data());
        if (!n.hasValue() || *n != int64_t(otherRef.unique.size()) || inverse != otherRef.inverse ||
            !bitEqual(summed, summedAlone)) {
          ++otherFailures;
        }
        ++otherRounds;
      } while (!stop.load() && otherRounds.load() < 100000);
    });
    auto rounds = std::async(std::launch::async, [&] {
      for (int round = 0; round < 50; ++round) {
        std::vector<std::atomic<int>> runs(kTables);
        std::vector<std::vector<uint64_t>> unique(kTables, std::vector<uint64_t>(kRows));
        std::vector<std::vector<int64_t>> inverse(kTables, std::vector<int64_t>(kRows));
        std::vector<std::vector<float>> summed(kTables, std::vector<float>(kRows * kDim));
        std::vector<int64_t> counts(kTables, -1);
        k->forEachIndependent(kTables, [&](int64_t t) {
          ++runs[size_t(t)];
          auto n = k->dedupGradients(keys[size_t(t)].data(), grads[size_t(t)].data(), kRows, kDim,
                                     unique[size_t(t)].data(), summed[size_t(t)].data(), inverse[size_t(t)].data());
          counts[size_t(t)] = n.hasValue() ? *n : -2;
        });
        for (int t = 0; t < kTables; ++t) {
          EXPECT_EQ(runs[size_t(t)].load(), 1) << "table " << t << ", round " << round;
          const Reference& ref = refs[size_t(t)];
          ASSERT_EQ(counts[size_t(t)], int64_t(ref.unique.size())) << "table " << t << ", round " << round;
          unique[size_t(t)].resize(ref.unique.size());
          EXPECT_EQ(unique[size_t(t)], ref.unique) << "table " << t;
          EXPECT_EQ(inverse[size_t(t)], ref.inverse) << "table " << t;
          std::vector<double> sumRef(ref.unique.size() * kDim, 0.0);
          for (int64_t i = 0; i < kRows; ++i) {
            for (int64_t d = 0; d < kDim; ++d) {
              sumRef[size_t(ref.inverse[size_t(i)] * kDim + d)] += grads[size_t(t)][size_t(i * kDim + d)];
            }
          }
          summed[size_t(t)].resize(sumRef.size());
          expectClose(summed[size_t(t)], sumRef, 1e-5, 1e-5, "summed");
        }
      }
    });
    if (rounds.wait_for(std::chrono::seconds(40)) != std::future_status::ready) {
      std::fprintf(stderr, "forEachIndependent beside another thread's calls: not done in 40 s (deadlock)\n");
      std::_Exit(1);  // the threads cannot be joined
    }
    rounds.get();
    stop = true;
    other.join();
    EXPECT_EQ(otherFailures.load(), 0) << "of " << otherRounds.load() << " rounds on the other thread";
  }
}

// The profile counts the calls the pieces of forEachIndependent make, on
// whichever thread runs them; from a paused thread (an evaluation) none.
TEST(KeyDedup, TheProfileCountsThePiecesCalls) {
  auto profiling = std::make_shared<ProfilingKernels>(std::shared_ptr<Kernels>(makeKernels(2)));
  const std::vector<uint64_t> keys = {5, 7, 5, 9};
  std::atomic<int> pieces{0};
  auto eight = [&] {
    profiling->forEachIndependent(8, [&](int64_t) {
      std::vector<uint64_t> u(4);
      std::vector<int64_t> inv(4);
      if (*profiling->uniqueKeys(keys.data(), 4, u.data(), inv.data()) == 3) ++pieces;
    });
  };
  eight();
  profiling->pauseThisThread(true);
  eight();
  profiling->pauseThisThread(false);
  EXPECT_EQ(pieces.load(), 16);
  std::map<std::string, int64_t> calls;
  for (const auto& e : profiling->profile()) {
    calls[e.kernel] = e.calls;
    // Calls side by side count once in the wall time: never more than summed.
    EXPECT_GT(e.wallSeconds, 0) << e.kernel;
    EXPECT_LE(e.wallSeconds, e.seconds + 1e-9) << e.kernel;
  }
  EXPECT_EQ(calls, (std::map<std::string, int64_t>{{"uniqueKeys", 8}}));
  const auto wall = profiling->wall();
  EXPECT_EQ(wall.sideBySideCalls, 1);  // the paused thread's not counted
  EXPECT_GT(wall.sideBySideSeconds, 0);
  // The pieces ran inside the forEachIndependent call, which is in the any-kernel time.
  EXPECT_NEAR(wall.kernelSeconds, wall.sideBySideSeconds, 1e-9);
  EXPECT_LE(profiling->profile().front().wallSeconds, wall.kernelSeconds + 1e-9);
}

// Wall time counts calls side by side once. Two threads each call
// forEachIndependent, whose piece waits (bounded) until both are inside and
// then sleeps 100 ms, so the two calls overlap by at least 100 ms however
// the threads are scheduled: the wall time is at most the two calls' spans,
// as each thread measured them, less that overlap.
TEST(KeyDedup, TheProfileWallTimeCountsCallsSideBySideOnce) {
  auto profiling = std::make_shared<ProfilingKernels>(std::shared_ptr<Kernels>(makeKernels(1)));
  std::atomic<int> inside{0};
  std::atomic<bool> timedOut{false};
  auto run = [&](double* span) {
    const auto t0 = std::chrono::steady_clock::now();
    profiling->forEachIndependent(1, [&](int64_t) {  // (one piece on a 1-thread pool: inline, on this thread)
      ++inside;
      const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (inside.load() < 2) {
        if (std::chrono::steady_clock::now() > limit) {
          timedOut = true;
          return;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    });
    *span = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  double spanA = 0, spanB = 0;
  std::thread a(run, &spanA), b(run, &spanB);
  a.join();
  b.join();
  ASSERT_FALSE(timedOut.load()) << "the two threads were not inside at once within 20 s";
  const auto wall = profiling->wall();
  EXPECT_EQ(wall.sideBySideCalls, 2);
  EXPECT_GE(wall.sideBySideSeconds, 0.1);
  EXPECT_LE(wall.sideBySideSeconds, spanA + spanB - 0.1 + 1e-6)
      << "wall " << wall.sideBySideSeconds << " s, the calls' spans " << spanA << " + " << spanB << " s";
  EXPECT_NEAR(wall.kernelSeconds, wall.sideBySideSeconds, 1e-9);  // nothing else ran
  EXPECT_TRUE(profiling->profile().empty());                       // and no kernel was called
}

}  // namespace
}  // namespace troupe::kernels::test
