#include "common/compute_pool.h"

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace troupe {
namespace {

class ComputePoolTest : public ::testing::TestWithParam<int> {};

TEST_P(ComputePoolTest, EveryIndexExactlyOnce) {
  ComputePool pool(GetParam());
  for (int64_t n : {0, 1, 2, 7, 1000, 100003}) {
    for (int64_t grain : {1, 16, 5000}) {
      std::vector<std::atomic<int>> hits(n);
      pool.parallelFor(n, grain, [&](int64_t b, int64_t e) {
        ASSERT_LE(0, b);
        ASSERT_LE(b, e);
        ASSERT_LE(e, n);
        for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
    }
  }
}

TEST_P(ComputePoolTest, ManyCallsInARow) {
  ComputePool pool(GetParam());
  int64_t total = 0;
  for (int round = 0; round < 2000; ++round) {
    std::atomic<int64_t> sum{0};
    pool.parallelFor(64, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) sum += i;
    });
    total += sum.load();
  }
  EXPECT_EQ(total, 2000 * (63 * 64 / 2));
}

TEST_P(ComputePoolTest, NestedCallRunsInline) {
  ComputePool pool(GetParam());
  std::atomic<int64_t> count{0};
  pool.parallelFor(8, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      pool.parallelFor(10, 1, [&](int64_t b2, int64_t e2) { count += e2 - b2; });
    }
  });
  EXPECT_EQ(count.load(), 80);
}

TEST_P(ComputePoolTest, CreatedAndDestroyedAtOnceEnds) {
  // Threads that start after the destructor began must still see the stop.
  for (int i = 0; i < 200; ++i) ComputePool pool(GetParam());
}

TEST_P(ComputePoolTest, CallsFarApartWakeSleepingThreads) {
  ComputePool pool(GetParam());
  for (int round = 0; round < 3; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // past the spin: threads sleep
    std::vector<std::atomic<int>> hits(1000);
    pool.parallelFor(1000, 10, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
    });
    for (auto& h : hits) ASSERT_EQ(h.load(), 1);
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, ComputePoolTest, ::testing::Values(1, 2, 3));

TEST(ComputePoolTest, RejectsZeroThreads) { EXPECT_THROW(ComputePool(0), std::exception); }

}  // namespace
}  // namespace troupe
