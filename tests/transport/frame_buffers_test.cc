// FrameBuffers (the node's receive buffers for small frames): its size
// classes, a buffer released on any thread coming back to the next get of
// its class, the bound on what it keeps, and buffers that outlive it (the
// suite also runs under ASan, which reports a leak, an overrun or a double
// free).
#include "transport/internal/frame_buffers.h"

#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace troupe::transport::internal {
namespace {

constexpr size_t kKiB = 1024;

TEST(FrameBuffers, ClassesGrowByHalvesFromOneTo64KiB) {
  const size_t want[] = {1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152, 65536};
  ASSERT_EQ(FrameBuffers::kClasses, int(std::size(want)));
  for (int c = 0; c < FrameBuffers::kClasses; ++c) EXPECT_EQ(FrameBuffers::classBytes(c), want[c]) << c;
  EXPECT_EQ(FrameBuffers::classOf(1), 0);
  EXPECT_EQ(FrameBuffers::classOf(1024), 0);
  EXPECT_EQ(FrameBuffers::classOf(1025), 1);
  EXPECT_EQ(FrameBuffers::classOf(4096 + 200), 5);  // a 4 KiB message's frame: 6 KiB
  EXPECT_EQ(FrameBuffers::classOf(64 * kKiB), 12);
  EXPECT_EQ(FrameBuffers::classOf(64 * kKiB + 1), -1);
  FrameBuffers buffers;
  EXPECT_EQ(buffers.get(64 * kKiB + 1), nullptr);  // larger frames are not its business
}

TEST(FrameBuffers, ABufferReleasedOnAnotherThreadIsReusedForItsClass) {
  FrameBuffers buffers;
  auto a = buffers.get(4000);  // 4 KiB class
  ASSERT_TRUE(a);
  std::memset(a.get(), 0xab, 4096);  // the whole class is usable
  uint64_t* at = a.get();
  auto copy = a;  // two references: released with the last
  std::thread([b = std::move(a)]() mutable { b.reset(); }).join();
  auto other = buffers.get(4000);
  EXPECT_NE(other.get(), at);  // still held by `copy`
  uint64_t* otherAt = other.get();
  other.reset();
  std::thread([c = std::move(copy)]() mutable { c.reset(); }).join();
  auto small = buffers.get(100);  // another class: takes the returned blocks in
  EXPECT_EQ(buffers.cachedBytes(), 4096u * 2);
  auto again = buffers.get(3500);  // 3073 to 4096 bytes: the same class
  EXPECT_EQ(buffers.cachedBytes(), 4096u);
  auto third = buffers.get(4096);
  EXPECT_EQ(buffers.cachedBytes(), 0u);
  EXPECT_EQ((std::set<uint64_t*>{again.get(), third.get()}), (std::set<uint64_t*>{at, otherAt}));
}

TEST(FrameBuffers, BuffersReleasedByManyThreadsAtOnceAllComeBack) {
  FrameBuffers buffers;
  constexpr int kThreads = 4, kEach = 500;
  std::vector<std::vector<std::shared_ptr<uint64_t[]>>> held(kThreads);
  std::set<uint64_t*> given;
  for (auto& h : held) {
    for (int i = 0; i < kEach; ++i) {
      h.push_back(buffers.get(1000));
      ASSERT_TRUE(h.back());
      given.insert(h.back().get());
    }
  }
  ASSERT_EQ(given.size(), size_t(kThreads * kEach));
  std::vector<std::thread> threads;
  for (auto& h : held) threads.emplace_back([&h] { h.clear(); });
  for (auto& t : threads) t.join();
  // 2000 blocks of 1 KiB, well under the bound: every one is reused.
  std::vector<std::shared_ptr<uint64_t[]>> again;
  size_t reused = 0;
  for (int i = 0; i < kThreads * kEach; ++i) {
    again.push_back(buffers.get(1024));
    reused += given.count(again.back().get());
  }
  EXPECT_EQ(reused, size_t(kThreads * kEach));
  EXPECT_EQ(buffers.cachedBytes(), 0u);
}

TEST(FrameBuffers, KeepsAtMostItsBound) {
  FrameBuffers buffers;
  const size_t n = FrameBuffers::kMaxCachedBytes / (64 * kKiB) + 32;  // 32 blocks over the bound
  std::vector<std::shared_ptr<uint64_t[]>> held;
  for (size_t i = 0; i < n; ++i) held.push_back(buffers.get(64 * kKiB));
  held.clear();
  auto one = buffers.get(64 * kKiB);  // takes the returned blocks in: the bound's worth are kept
  EXPECT_EQ(buffers.cachedBytes(), FrameBuffers::kMaxCachedBytes - 64 * kKiB);
}

TEST(FrameBuffers, ABufferMayOutliveItsFrameBuffers) {
  // (What this test checks is seen under ASan: a leak, a double free or a
  // use after free in any of the three ways a block ends.)
  std::shared_ptr<uint64_t[]> kept;
  {
    FrameBuffers buffers;
    kept = buffers.get(2000);
    auto cached = buffers.get(2000), released = buffers.get(50 * kKiB);
    cached.reset();
    auto taker = buffers.get(100);  // takes `cached` into its free list
    EXPECT_EQ(buffers.cachedBytes(), 2048u);
    released.reset();  // still on the return stack when the buffers go
  }
  ASSERT_TRUE(kept);
  std::memset(kept.get(), 1, 2048);
  EXPECT_EQ(reinterpret_cast<unsigned char*>(kept.get())[2047], 1);
  kept.reset();  // freed now (ASan: no leak, no double free)
}

}  // namespace
}  // namespace troupe::transport::internal
