// BufferPool and Tensor::fromPool: a released buffer is reused, at most
// maxCached bytes are kept, a buffer may be released on any thread and after
// its pool is gone (the suite also runs under ASan, which reports a leak or
// a double free).
#include "transport/buffer_pool.h"

#include <cstring>
#include <thread>

#include <gtest/gtest.h>

#include "transport/tensor.h"

namespace troupe::transport {
namespace {

constexpr size_t kKiB = 1024;

TEST(BufferPool, AReleasedBufferIsReusedForAnySizeOfItsClass) {
  auto pool = std::make_shared<BufferPool>();
  auto a = pool->get(100 * kKiB);  // class 128 KiB
  ASSERT_TRUE(a);
  uint64_t* at = a.get();
  a.reset();
  EXPECT_EQ(pool->cachedBytes(), 128 * kKiB);
  auto b = pool->get(65 * kKiB + 3);  // also 128 KiB
  EXPECT_EQ(b.get(), at);
  EXPECT_EQ(pool->cachedBytes(), 0u);
  auto c = pool->get(129 * kKiB);  // the next class: not that buffer
  EXPECT_NE(c.get(), at);
}

TEST(BufferPool, SmallBuffersGoToTheAllocatorAndAreNotKept) {
  auto pool = std::make_shared<BufferPool>();
  auto a = pool->get(64 * kKiB - 8);
  ASSERT_TRUE(a);
  a.reset();
  EXPECT_EQ(pool->cachedBytes(), 0u);
}

TEST(BufferPool, KeepsAtMostMaxCachedBytes) {
  auto pool = std::make_shared<BufferPool>(256 * kKiB);
  auto a = pool->get(128 * kKiB), b = pool->get(128 * kKiB), c = pool->get(128 * kKiB);
  ASSERT_TRUE(a && b && c);
  a.reset();
  b.reset();
  EXPECT_EQ(pool->cachedBytes(), 256 * kKiB);
  c.reset();  // over the bound: back to the allocator
  EXPECT_EQ(pool->cachedBytes(), 256 * kKiB);
}

TEST(BufferPool, AReleasedBufferTakesThePlaceOfLargerOnesWhenThePoolIsFull) {
  auto pool = std::make_shared<BufferPool>(512 * kKiB);
  auto huge = pool->get(300 * kKiB);  // 512 KiB: fills the pool once released
  auto usual = pool->get(100 * kKiB);  // 128 KiB
  auto bigger = pool->get(1024 * kKiB);  // 1 MiB: over the bound on its own
  ASSERT_TRUE(huge && usual && bigger);
  huge.reset();
  EXPECT_EQ(pool->cachedBytes(), 512 * kKiB);
  bigger.reset();  // over the bound on its own: not kept
  EXPECT_EQ(pool->cachedBytes(), 512 * kKiB);
  uint64_t* at = usual.get();
  usual.reset();  // displaces the 512 KiB one
  EXPECT_EQ(pool->cachedBytes(), 128 * kKiB);
  auto again = pool->get(128 * kKiB);
  EXPECT_EQ(again.get(), at);
  EXPECT_EQ(pool->cachedBytes(), 0u);
}

TEST(BufferPool, AFullPoolGivesUpTheSmallestLargerBufferThatMakesRoom) {
  auto pool = std::make_shared<BufferPool>(768 * kKiB);
  auto big = pool->get(512 * kKiB), medium = pool->get(256 * kKiB), small = pool->get(128 * kKiB);
  ASSERT_TRUE(big && medium && small);
  uint64_t* bigAt = big.get();
  big.reset();
  medium.reset();
  EXPECT_EQ(pool->cachedBytes(), 768 * kKiB);
  small.reset();  // gives up the 256 KiB buffer, keeps the 512 KiB one
  EXPECT_EQ(pool->cachedBytes(), 640 * kKiB);
  auto again = pool->get(512 * kKiB);
  EXPECT_EQ(again.get(), bigAt);
  EXPECT_EQ(pool->cachedBytes(), 128 * kKiB);
}

TEST(BufferPool, ABufferReleasedOnAnotherThreadOrAfterThePoolIsGoneIsFreedOnce) {
  auto pool = std::make_shared<BufferPool>();
  auto a = pool->get(200 * kKiB);
  std::thread([b = std::move(a)]() mutable { b.reset(); }).join();
  EXPECT_EQ(pool->cachedBytes(), 256 * kKiB);
  auto orphan = pool->get(200 * kKiB);
  pool.reset();
  std::memset(orphan.get(), 1, 200 * kKiB);  // still valid after the pool
  orphan.reset();  // deleted, not put back (ASan: no leak, no double free)
}

TEST(BufferPool, APooledTensorHoldsItsBufferUntilItsLastCopyDies) {
  auto pool = std::make_shared<BufferPool>();
  std::byte* out = nullptr;
  Tensor t = Tensor::fromPool(*pool, 300 * kKiB, DType::kFloat32, &out);
  ASSERT_NE(out, nullptr);
  EXPECT_EQ(t.data, out);
  EXPECT_EQ(t.bytes, 300 * kKiB);
  EXPECT_EQ(t.dtype, DType::kFloat32);
  std::memset(out, 7, 300 * kKiB);
  Tensor copy = t;
  t = Tensor{};
  EXPECT_EQ(pool->cachedBytes(), 0u);
  EXPECT_EQ(copy.data[300 * kKiB - 1], std::byte{7});
  copy = Tensor{};
  EXPECT_EQ(pool->cachedBytes(), 512 * kKiB);
  Tensor again = Tensor::fromPool(*pool, 257 * kKiB, DType::kBytes, &out);
  EXPECT_EQ(out, again.data);
  EXPECT_EQ(pool->cachedBytes(), 0u) << "the same class: the buffer came back";
}

}  // namespace
}  // namespace troupe::transport
